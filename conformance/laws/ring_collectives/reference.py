"""The suite's own model of the ring collectives: inputs, results, and the message formulas.

S is the number of elements of the data being reduced or gathered (reduce-scatter and
all-reduce: one rank's ``numel``; all-gather: W times that), chunked by
``tensor_split(W)``: the first S mod W chunks have ceil(S / W) elements, the rest
floor(S / W).  Per rank, with e bytes per element, impl's ring (``impl.collectives.ring``):

    reduce-scatter, all-gather   W - 1 sends and W - 1 receives, each one chunk;
                                 over all ranks (W - 1) S e bytes sent (each chunk W - 1 times)
    all-reduce                   twice that: 2 (W - 1) messages, 2 (W - 1) S e bytes in all
    alternate all-reduce         W - 1 messages of S elements: (W - 1) S e bytes per rank

so a rank sends about (W - 1) / W S e bytes per phase of the first three.  Every send goes
to the next rank of the group's ring (group rank r + 1 mod W), every receive comes from the
one before.  Time model (bandwidth term, links of B bytes/s each way): (W - 1) / W S e / B
per reduce-scatter or all-gather phase, twice that for all-reduce, (W - 1) S e / B for the
alternate ring.

Which of these a target must meet.  The capability's issue asks for ring collectives built
from point-to-point calls, with that time model: a ring of W ranks needs W - 1 steps a
phase, one message each way a step, and moves each chunk once a step.  What it leaves open
is where the chunks are cut, whether they are padded, and which way the ring turns.  So
the contract is a bound from the user's side (``message_bound``, ``bytes_bound_per_rank``,
``total_bytes_bound``): at most the ring's messages a rank, only with its two ring
neighbours, and at most the formula's bytes plus ``padding(W)`` = W - 1 elements a message
(a chunk padded to ceil(S / W) carries at most one element more than its ``tensor_split``
chunk; a whole buffer padded to a multiple of W at most W - 1 more).  The exact figures
above (``messages``, ``message_sizes``, ``total_bytes_sent``, the direction r -> r + 1) are
impl's, an extra.
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


def padding(world: int) -> int:
    """Elements a message may carry beyond its share of the data (see the module docstring)."""
    return max(world - 1, 0)


def message_bound(case: RingCase, world: int) -> int:
    """Sends (and receives) a rank may make: the ring's count, W - 1 a phase."""
    return messages(case, world)


def largest_share(case: RingCase, world: int) -> int:
    """Elements of the largest message of the formulas: ceil(S / W), or S for the alternate ring."""
    s = elements(case, world)
    return s if case.op == "ring_all_reduce_alternate" else -(-s // world)


def bytes_bound_per_rank(case: RingCase, world: int, esize: int) -> int:
    """Bytes one rank may send (or receive): the ring's messages, each the largest share plus padding."""
    return message_bound(case, world) * (largest_share(case, world) + padding(world)) * esize


def total_bytes_bound(case: RingCase, world: int, esize: int, n_messages: int) -> int:
    """Bytes all ranks together may send in ``n_messages`` messages: the formula plus padding."""
    return total_bytes_sent(case, world, esize) + n_messages * padding(world) * esize


def receives_from_others(case: RingCase, world: int, group_rank: int) -> bool:
    """Whether this rank's result holds other ranks' data, which a ring built from
    point-to-point calls can only bring in a message: every rank at W >= 2, except a
    reduce-scatter rank whose chunk is empty."""
    if world < 2:
        return False
    if case.op == "ring_reduce_scatter":
        return chunk_sizes(elements(case, world), world)[group_rank] > 0
    return True
