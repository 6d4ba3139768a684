"""The two types every capability's checks are written in: ``Law`` and ``Mutant``.

A ``Law`` is a property every implementation of a capability must have::

    Law(
        name="replicas_are_bit_identical_and_match_one_process",
        capability="DDP",                  # a family of conformance.capabilities
        tier=CONTRACT,                     # or API, with ``extra`` naming the extra
        cases=training_cases,              # (**options) -> a Hypothesis strategy of cases
        check=replicas_match,              # (subject, case) -> None; AssertionError if broken
        needs=("2 ranks",),                # what a run needs to be able to fail it
    )

``subject`` is what the capability's laws are checked against: a target spec (a string
the rank processes load again) for distributed capabilities, an object (an
autograd.Function class) for attention.  ``check`` raises ``AssertionError`` (the oracle's,
the harness's ``RankFailure``/``RankTimeout``) when the implementation breaks the law,
and a verdict (``conformance.verdicts``) when the law cannot be checked on it here.

Tiers.  The contract tier (``CONTRACT``) is exactly what the course handout and its tests
ask: its laws draw contract cases only.  The wider API (``API``) names each extra
(``extra="4-D inputs"``) as a check of its own.  An extra never stops or hides a contract
check: they are separate laws, run as separate tests.

A ``Mutant`` is a kept broken implementation: a target offering one capability with one
decision changed, and the names of the laws that must reject it.  One parametrised
self-test (``conformance/selftests/test_mutants.py``) runs every mutant against every law
named in its ``caught_by`` and fails if the mutant survives; the same runs against the
unbroken implementation must pass (the control).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

CONTRACT = "contract"
API = "api"
TIERS = (CONTRACT, API)


@dataclass(frozen=True)
class Law:
    name: str
    capability: str
    tier: str
    cases: Callable[..., Any]  # (**options) -> SearchStrategy
    check: Callable[..., None]  # (subject, case) -> None
    needs: tuple[str, ...] = ()
    extra: str = ""  # API tier: the extra, as a report names it ("4-D inputs")
    flavours: tuple[str, ...] = ()  # the flavours it applies to (empty: every flavour)
    doc: str = ""

    def __post_init__(self):
        if self.tier not in TIERS:
            raise ValueError(f"law {self.name}: tier must be one of {TIERS}, got {self.tier!r}")
        if self.tier == API and not self.extra:
            raise ValueError(f"law {self.name}: an API-tier law names its extra")
        if not self.doc and self.check.__doc__:
            object.__setattr__(self, "doc", self.check.__doc__.strip().splitlines()[0])


@dataclass(frozen=True)
class Mutant:
    name: str
    capability: str
    bug: str  # one line: what is broken
    caught_by: tuple[str, ...]  # names of the laws (or spec cases) that must reject it
    target: str  # a target spec that loads the mutant: "conformance.mutants.fsdp:sum_not_mean"
    flavour: str = ""  # for capabilities with flavours (attention, DDP)
    options: dict = field(default_factory=dict)  # anything the capability's runner needs


def by_name(laws) -> dict[str, Law]:
    table = {}
    for law in laws:
        if law.name in table:
            raise ValueError(f"two laws named {law.name!r}")
        table[law.name] = law
    return table


# Settings of a mutant run: the explicit examples then generated ones, reproducible (no
# example database, derandomised), no shrinking (a rejection needs no minimal example).
MUTANT_SETTINGS = dict(phases=("explicit", "generate"), database=None, derandomize=True, deadline=None)


def mutant_settings(**overrides) -> dict:
    """MUTANT_SETTINGS as Hypothesis takes them (its Phase values), with ``overrides``."""
    from hypothesis import Phase

    out = {**MUTANT_SETTINGS, **overrides}
    out["phases"] = [getattr(Phase, p) if isinstance(p, str) else p for p in out["phases"]]
    return out


def first_failure_line(run: Callable[[], None]) -> str | None:
    """Run one law's check; the first line of its failure (an AssertionError: the oracle's,
    a RankFailure, a RankTimeout), or None if it passed.  What the mutant self-test asks of
    every capability's ``rejection``."""
    try:
        run()
    except AssertionError as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return None


def check_examples(law: Law, subject, *, device=None, max_examples: int | None = None, go_on_after_verdicts: bool = False,
                   **settings_kwargs) -> None:
    """Check ``law`` on ``subject`` for the cases Hypothesis draws from ``law.cases(device=device)``.

    ``go_on_after_verdicts``: a case the target declines (a ``conformance.verdicts.Verdict``,
    e.g. one shape it does not offer) is set aside and the other cases still run; the first
    such verdict is raised at the end, so the law as a whole is never reported as passed.
    """
    from hypothesis import given, note, settings

    from conformance.verdicts import Verdict

    options = dict(settings_kwargs)
    if max_examples is not None:
        options["max_examples"] = max_examples
    declined: list[Verdict] = []
    # Without a shrink phase (a mutant run: a verdict, not a minimal example) the only call
    # after the first failure is Hypothesis replaying it to report it; the failure is
    # raised again from memory rather than run twice (a hang would wait out its watchdog twice).
    failed: list[AssertionError] = []
    remember = "phases" in options and not any(getattr(p, "name", p) == "shrink" for p in options["phases"])

    @settings(**options)
    @given(case=law.cases(device=device))
    def run(case):
        note(f"case: {case}")
        if failed:
            raise failed[0]
        try:
            law.check(subject, case)
        except Verdict as verdict:
            if not go_on_after_verdicts:
                raise
            declined.append(verdict)
        except AssertionError as exc:
            if remember:
                failed.append(exc)
            raise

    run()
    if declined:
        raise declined[0]
