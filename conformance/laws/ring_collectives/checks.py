"""The checks of the ring-collective laws: ``(target_spec, case) -> None``, AssertionError if broken.

The message checks read a target's point-to-point calls.  A target whose collectives are
not built from them (torch's own) declares it (``NOT_POINT_TO_POINT``, see
``conformance.target``): where its calls sent no point-to-point message, those checks read
"not applicable: <its reason>".  A target that does not declare it, or that sends messages
all the same, is checked as a ring: a ring that sends nothing fails.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import torch

from conformance import oracle
from conformance.harness import run_on_ranks
from conformance.laws.p2p_hang import first_hang
from conformance.laws.ring_collectives import reference
from conformance.laws.ring_collectives.rank import run_case, run_mismatch
from conformance.laws.ring_collectives.strategies import DTYPES, OPS, RingCase
from conformance.target import load_target
from conformance.verdicts import NotApplicable

# A case's first point-to-point call on a new subgroup starts its NCCL communicators: on four
# GPUs under 16 workers that ran past 30 s (the same two subgroup cases take 19 s alone);
# the harness's default, as the other capabilities' cases have.
TIMEOUT_S = 60
# The target attribute (a one-line reason) by which collectives say they are not point-to-point rings.
NOT_POINT_TO_POINT = "RING_COLLECTIVES_NOT_POINT_TO_POINT"


def _results(subject: str, case: RingCase):
    return [r for r in run_on_ranks(run_case, case.world_size, subject, case, timeout=TIMEOUT_S) if r is not None]


def _check_values(case: RingCase, results) -> None:
    dtype = DTYPES[case.dtype]
    for r in results:
        got, eager, grank, world = r["out"], r["eager"], r["group_rank"], r["world"]
        name = f"{case.op} W={world} group rank {grank}"
        want = reference.expected64(case, world, grank)
        assert tuple(got.shape) == tuple(want.shape), f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        assert got.dtype == dtype, f"{name}: dtype {got.dtype}, expected {dtype}"
        if not dtype.is_floating_point or case.op == "ring_all_gather":
            oracle.assert_bitwise_equal(name, got, eager)  # integers, and gathers: no arithmetic
        else:
            oracle.assert_close(name, got, want, eager, dtype, reference.magnitude64(case, world, grank))


def _each_op(case: RingCase):
    """The case for each collective it names ("all": the four, one after another)."""
    return [replace(case, op=op) for op in OPS] if case.op == "all" else [case]


def check_values(subject: str, case: RingCase) -> None:
    """Every rank's result equals torch.distributed's collective: exactly for integer values
    and gathers, within the float64 oracle for floating sums (the ring adds in its own order).
    Source: torch.distributed's collective semantics; ``tensor_split`` for sizes W does not
    divide, the capability's issue; the order of a floating sum, none."""
    for one in _each_op(case):
        _check_values(one, _results(subject, one))


def declared_not_point_to_point(subject: str) -> str | None:
    """The reason a target gives for collectives that are not point-to-point rings, or None."""
    reason = getattr(load_target(subject).obj, NOT_POINT_TO_POINT, None)
    return reason.strip() if isinstance(reason, str) and reason.strip() else None


def _point_to_point_results(subject: str, case: RingCase):
    """The ranks' results, for a check of their point-to-point calls: NotApplicable where the
    target declares its collectives are not built from them and no rank sent or received one."""
    results = _results(subject, case)
    reason = declared_not_point_to_point(subject)
    if reason and not any(r["log"] for r in results):
        raise NotApplicable(f"{case.op} sends no point-to-point messages: {reason}")
    return results


def _split(log):
    return [m for m in log if m[0] == "send"], [m for m in log if m[0] == "recv"]


def check_message_bounds(subject: str, case: RingCase) -> None:
    """Built from point-to-point calls, within the ring's cost: a rank whose result holds
    others' data received messages; per rank at most the ring's messages (W - 1 a phase),
    each with one of its two ring neighbours (group ranks r +- 1, as global ranks); at most
    the formula's bytes plus W - 1 elements of padding a message, per rank and over all
    ranks.  Fewer messages or bytes, padded chunks, either direction: all conform.
    Source: the capability's issue (ring collectives from point-to-point calls, the ring's
    time model) fixes the messages, the neighbours, the steps and the volume; none fixes
    where chunks are cut, their padding or the ring's direction, hence the W - 1 elements."""
    for one in _each_op(case):
        _check_bounds(one, _point_to_point_results(subject, one))


def _check_bounds(case: RingCase, results) -> None:
    esize = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    sent_total, n_sent = 0, 0
    for r in results:
        world, grank = r["world"], r["group_rank"]
        sends, recvs = _split(r["log"])
        most = reference.message_bound(case, world)
        where = f"{case.op} W={world} group rank {grank}"
        assert len(sends) <= most and len(recvs) <= most, (
            f"{where}: {len(sends)} sends and {len(recvs)} receives; a ring needs at most {most} of each")
        assert recvs or not reference.receives_from_others(case, world, grank), (
            f"{where}: no point-to-point message received, yet its result holds other ranks' data: ring "
            f"collectives are built from point-to-point calls (a target whose collectives are not says so: "
            f"{NOT_POINT_TO_POINT} = '<why>')")
        neighbours = set(r["ring"])
        strangers = sorted({m[1] for m in sends + recvs} - neighbours)
        assert not strangers, (f"{where}: messages with ranks {strangers}; a ring exchanges with its neighbours "
                               f"{sorted(neighbours)} only (global ranks of group ranks r +- 1)")
        cap = reference.bytes_bound_per_rank(case, world, esize)
        for kind, msgs in (("sent", sends), ("received", recvs)):
            nbytes = sum(m[2] for m in msgs)
            assert nbytes <= cap, (
                f"{where}: {nbytes} B {kind}; the ring's {most} messages of at most "
                f"{reference.largest_share(case, world)} elements plus {reference.padding(world)} of padding "
                f"allow {cap} B")
        sent_total += sum(m[2] for m in sends)
        n_sent += len(sends)
    if results:
        world = results[0]["world"]
        cap = reference.total_bytes_bound(case, world, esize, n_sent)
        assert sent_total <= cap, (
            f"{case.op} W={world}: {sent_total} B sent over all ranks in {n_sent} messages; the ring formula's "
            f"{reference.total_bytes_sent(case, world, esize)} B plus {reference.padding(world)} elements of "
            f"padding a message allow {cap} B")


def check_messages_exactly(subject: str, case: RingCase) -> None:
    """impl's figures exactly (an extra: no source fixes them): sends and receives per rank
    equal the formulas of ``reference``, every send to group rank r + 1 and every receive from
    r - 1, each message one ``tensor_split`` chunk, and the bytes over all ranks the formula."""
    for one in _each_op(case):
        _check_exactly(one, _point_to_point_results(subject, one))


def _check_exactly(case: RingCase, results) -> None:
    esize = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    sent_total = 0
    for r in results:
        world, grank = r["world"], r["group_rank"]
        sends, recvs = _split(r["log"])
        want = reference.messages(case, world)
        where = f"{case.op} W={world} group rank {grank}"
        assert len(sends) == want and len(recvs) == want, (
            f"{where}: {len(sends)} sends and {len(recvs)} receives, the formula says {want} of each")
        nxt, prv = r["ring"]
        assert all(m[1] == nxt for m in sends), f"{where}: sends to {sorted({m[1] for m in sends})}, the ring's next is {nxt}"
        assert all(m[1] == prv for m in recvs), f"{where}: receives from {sorted({m[1] for m in recvs})}, expected {prv}"
        sizes = reference.message_sizes(case, world, esize)
        bad = [m[2] for m in sends + recvs if m[2] not in sizes]
        assert not bad, f"{where}: messages of {sorted(set(bad))} B; a message is one chunk: {sorted(sizes)} B"
        sent_total += sum(m[2] for m in sends)
    if results:
        world = results[0]["world"]
        want = reference.total_bytes_sent(case, world, esize)
        assert sent_total == want, f"{case.op} W={world}: {sent_total} B sent over all ranks, the formula says {want} B"


def check_no_nccl_hang(subject: str, case: RingCase) -> None:
    """Played forward under NCCL's rules (``p2p_hang``), every rank's point-to-point calls
    complete: the same calls as recorded here on the ranks at hand.  Source: NCCL's ordering
    of point-to-point calls, as ``p2p_hang`` models and measured it."""
    for one in _each_op(case):
        results = _point_to_point_results(subject, one)
        why = first_hang({r["rank"]: r["units"] for r in results})
        assert why is None, f"{one.op} W={one.world_size}: {why}"


# A number as an error message writes it: a run of digits not glued to a word before it
# ("float32", "W2" hold none), "x" allowed ("2x3").
_NUMBER = re.compile(r"(?<![A-Za-wyz_\d])\d+")
# Exceptions a clear error may be: torch's own for bad arguments and mismatched sizes.
CLEAR_ERRORS = ("ValueError", "TypeError", "RuntimeError")


def names_the_offending_sizes(text: str, shapes, element_size: int) -> bool:
    """Does ``text`` name what differs across the ranks, in any unit?  A rank's shape (its
    dims in order, however written: "(2, 3)", "[2, 3]", "2x3", "torch.Size([2, 3])"), or,
    where the ranks' element counts differ, a rank's count of elements or of bytes."""
    numbers = [int(n) for n in _NUMBER.findall(text)]
    for shape in set(shapes):
        dims = list(shape)
        if any(numbers[i:i + len(dims)] == dims for i in range(len(numbers) - len(dims) + 1)):
            return True
    counts = {math.prod(s) for s in shapes}
    if len(counts) < 2:
        return False  # equal counts name nothing that differs
    return any(n in counts or n in {c * element_size for c in counts} for n in numbers)


def check_mismatch(subject: str, case: RingCase) -> None:
    """Ranks whose shapes differ all get a clear error (ValueError, TypeError or RuntimeError)
    that names the offending sizes in any unit (shapes, elements, bytes): no result (there is
    none to give: the sum of a (2, 3) and a (3, 2) tensor is not defined), no hang, and no
    error that names nothing.  Source: none fixes the wording or the unit (torch.distributed
    leaves mismatched shapes undefined): the target's own words, naming what differs."""
    outcomes = run_on_ranks(run_mismatch, case.world_size, subject, case, timeout=TIMEOUT_S)
    esize = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    for rank, what in enumerate(outcomes):
        assert what.startswith(CLEAR_ERRORS), f"{case.op} with shapes {case.shapes}: rank {rank} {what}"
        assert names_the_offending_sizes(what, case.shapes, esize), (
            f"{case.op} with shapes {case.shapes}: rank {rank}'s error names none of the sizes that differ "
            f"(no shape, and no count of elements or bytes where those differ): {what}")
