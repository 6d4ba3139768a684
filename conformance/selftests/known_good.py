"""Known-good targets: correct implementations whose designs differ from impl's.

A contract law must hold for every correct implementation, whatever its design: a law that
pins this project's own arithmetic (a peak, a count of forwards, bytes, messages, an error's
wording) fails a student who is right and built differently.  So every capability keeps,
besides impl, at least two correct targets of other designs -- torch's own where one exists,
and at least one written here with other legitimate choices -- and
``test_known_good.py`` runs each capability's whole contract tier on each of them
(``pytest --contract-only`` in a child process, the same path a student's run takes): every
one must read "conforms".  A check a target's design rightly cannot offer reads "not
applicable: <why>" (``conformance.verdicts.NotApplicable``), never FAILS and never passed.

``VARIATIONS`` lists, per capability, the design choices a correct implementation may make
differently from impl; the contract tier must accept each of them.  ``KNOWN_GOOD`` lists the
targets that exercise them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownGood:
    capability: str  # the report rows it must conform in start with this ("DDP", "attention pytorch")
    target: str  # a target spec: "conformance.adapters.torch_ddp", "pkg.module:attr", a file
    design: str  # one line: what it does differently from impl
    tests: tuple[str, ...]  # the spec and properties files that hold the capability's checks
    device: str = "cpu"  # where CI runs it ("cuda": GPU-only, read "needs a GPU" on the CPU)


def _files(stem: str) -> tuple[str, ...]:
    return (f"conformance/spec/test_{stem}.py", f"properties/test_{stem}.py")


# capability -> the legitimate design choices the contract tier must accept
VARIATIONS: dict[str, tuple[str, ...]] = {
    "distributed sampler": (
        "which indices pad the shares to equal lengths (torch: the start of the order again; any T - N indices of range(N))",
        "how the padded order is cut into shares (torch: every R-th position; contiguous blocks equally)",
        "the random source of the shuffle, as long as every rank draws the same order and each epoch another",
    ),
}

KNOWN_GOOD: tuple[KnownGood, ...] = (
    KnownGood("distributed sampler", "conformance.adapters.torch_sampler", "torch's DistributedSampler", _files("sampler")),
    KnownGood("distributed sampler", "conformance.selftests.targets.known_good.sampler_blocks",
              "contiguous blocks, padded with the end of the order, shuffled by Python's random", _files("sampler")),
)
