"""The suite's own model of the ring collectives: inputs, results, and the message formulas.

S is the number of elements of the data being reduced or gathered (reduce-scatter and
all-reduce: one rank's ``numel``; all-gather: W times that), chunked by
``tensor_split(W)``: the first S mod W chunks have ceil(S / W) elements, the rest
floor(S / W).  Per rank, with e bytes per element:

    reduce-scatter, all-gather   W - 1 sends and W - 1 receives, each one chunk;
                                 over all ranks (W - 1) S e bytes sent (each chunk W - 1 times)
    all-reduce                   twice that: 2 (W - 1) messages, 2 (W - 1) S e bytes in all
    alternate all-reduce         W - 1 messages of S elements: (W - 1) S e bytes per rank

so a rank sends about (W - 1) / W S e bytes per phase of the first three.  Every send goes
to the next rank of the group's ring (group rank r + 1 mod W), every receive comes from the
one before.  Time model (bandwidth term, links of B bytes/s each way): (W - 1) / W S e / B
per reduce-scatter or all-gather phase, twice that for all-reduce, (W - 1) S e / B for the
alternate ring.
"""

from __future__ import annotations

import torch

from conformance.laws.ring_collectives.strategies import DTYPES, RingCase


def rank_input(case: RingCase, group_rank: int) -> torch.Tensor:
    """Rank ``group_rank``'s tensor: integer-valued for integer dtypes, fresh random otherwise."""
    shape = case.shapes[group_rank] if case.shapes else case.shape
    g = torch.Generator().manual_seed(case.seed * 131 + group_rank)
    dtype = DTYPES[case.dtype]
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=torch.int64).to(dtype)


def expected64(case: RingCase, world: int, group_rank: int) -> torch.Tensor:
    """The float64 (or exact integer) result on ``group_rank``."""
    ins = [rank_input(case, r) for r in range(world)]
    wide = [t.double() if t.dtype.is_floating_point else t.long() for t in ins]
    if case.op == "ring_all_gather":
        return torch.cat(wide, dim=0)
    total = torch.stack(wide).sum(0)
    if case.op == "ring_reduce_scatter":
        return total.flatten().tensor_split(world)[group_rank]
    return total


def magnitude64(case: RingCase, world: int, group_rank: int) -> torch.Tensor:
    """Sum over ranks of |x_r| per element: the size of the terms a reduced element adds up
    (the oracle's magnitude: a sum that cancels is judged against its terms, not its result)."""
    ins = [rank_input(case, r).double().abs() for r in range(world)]
    total = torch.stack(ins).sum(0)
    if case.op == "ring_reduce_scatter":
        return total.flatten().tensor_split(world)[group_rank]
    return total


def elements(case: RingCase, world: int) -> int:
    """S of the module docstring."""
    n = 1
    for s in case.shape:
        n *= s
    return world * n if case.op == "ring_all_gather" else n


def chunk_sizes(s: int, world: int) -> list[int]:
    return [s // world + (1 if j < s % world else 0) for j in range(world)]


def messages(case: RingCase, world: int) -> int:
    """Sends (and receives) per rank."""
    return 2 * (world - 1) if case.op == "ring_all_reduce" else world - 1


def total_bytes_sent(case: RingCase, world: int, esize: int) -> int:
    """Bytes sent over all ranks together."""
    s = elements(case, world)
    if case.op == "ring_all_reduce_alternate":
        return world * (world - 1) * s * esize
    return (2 if case.op == "ring_all_reduce" else 1) * (world - 1) * s * esize


def message_sizes(case: RingCase, world: int, esize: int) -> set[int]:
    """The byte sizes a single message may have."""
    s = elements(case, world)
    if case.op == "ring_all_reduce_alternate":
        return {s * esize}
    return {c * esize for c in chunk_sizes(s, world)}
