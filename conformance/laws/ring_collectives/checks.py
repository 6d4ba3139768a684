"""The checks of the ring-collective laws: ``(target_spec, case) -> None``, AssertionError if broken."""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance import oracle
from conformance.harness import run_on_ranks
from conformance.laws.p2p_hang import first_hang
from conformance.laws.ring_collectives import reference
from conformance.laws.ring_collectives.rank import run_case, run_mismatch
from conformance.laws.ring_collectives.strategies import DTYPES, OPS, RingCase

TIMEOUT_S = 30


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
    and gathers, within the float64 oracle for floating sums (the ring adds in its own order)."""
    for one in _each_op(case):
        _check_values(one, _results(subject, one))


def check_messages(subject: str, case: RingCase) -> None:
    """Sends and receives per rank, their peers and bytes equal the formulas of ``reference``."""
    for one in _each_op(case):
        _check_messages(subject, one)


def _check_messages(subject: str, case: RingCase) -> None:
    results = _results(subject, case)
    esize = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    sent_total = 0
    for r in results:
        world, grank = r["world"], r["group_rank"]
        sends = [m for m in r["log"] if m[0] == "send"]
        recvs = [m for m in r["log"] if m[0] == "recv"]
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
    complete: the same calls as recorded here on the ranks at hand."""
    for one in _each_op(case):
        results = _results(subject, one)
        why = first_hang({r["rank"]: r["units"] for r in results})
        assert why is None, f"{one.op} W={one.world_size}: {why}"


def check_mismatch(subject: str, case: RingCase) -> None:
    """Ranks whose shapes differ all get a ValueError that names a shape -- no hang, no result."""
    outcomes = run_on_ranks(run_mismatch, case.world_size, subject, case, timeout=TIMEOUT_S)
    for rank, what in enumerate(outcomes):
        assert what.startswith("ValueError"), f"{case.op} with shapes {case.shapes}: rank {rank} {what}"
        assert "shape" in what.lower(), f"{case.op}: rank {rank}'s error does not name the shapes: {what}"
