"""Ring collectives from point-to-point messages: all-gather, reduce-scatter, all-reduce
(reduce-scatter then all-gather) and the alternate all-reduce that passes whole tensors.

Contract (every rank of ``group`` calls with its own tensor; ``group=None`` is the default
group; W is the group's size, r this rank's index in it)
    ring_reduce_scatter(t, group) -> sum over ranks, flattened, ``tensor_split(W)[r]``
    ring_all_gather(t, group)     -> ``torch.cat`` of every rank's ``t`` along dim 0
    ring_all_reduce(t, group)     -> the elementwise sum, shape and dtype of ``t``
    ring_all_reduce_alternate(t, group) -> the same sum, by passing the original tensors
    Each returns a new tensor (the input is never written).  Any dtype ``torch.add`` adds
    (floating, complex, integer; bool adds as logical or); any device the group's backend
    serves.  The sum is accumulated in the ring's order, which is not gloo's or NCCL's:
    integer-valued results match them exactly, floating ones to rounding.

    Shapes: before any data moves, the ranks agree on shape and dtype with one small
    all-reduce (MAX) of an int64 descriptor (dtype code, rank of the shape, up to 8 sizes,
    and the same negated); a rank whose tensor differs raises ``ValueError`` naming the
    shapes, on every rank, so no rank waits forever.  That all-reduce is not a
    point-to-point message and is not counted in the formulas below.  W = 1 skips it.

Chunking and messages.  Let S be the number of elements of the data being reduced or
gathered (reduce-scatter, all-reduce: ``t.numel()``; all-gather: W * ``t.numel()``) and
chunk j = ``flat.tensor_split(W)[j]``: the first S mod W chunks have ceil(S / W) elements,
the rest floor(S / W) (empty chunks are sent too, as empty messages).  One step = each rank
sends one message to rank r + 1 and receives one from rank r - 1 (mod W, group ranks; the
peers' global ranks come from ``dist.get_global_rank``).

    reduce-scatter   W - 1 steps; step t sends chunk (r - t - 1) mod W, receives chunk
                     (r - t - 2) mod W and adds it in: rank r ends holding chunk r.
                     Per rank: W - 1 messages of S / W, (W - 1) / W * S elements.
    all-gather       W - 1 steps; step t sends chunk (r - t) mod W (the rank's own first),
                     receives chunk (r - t - 1) mod W.  Same counts.
    all-reduce       reduce-scatter then the all-gather of the reduced chunks:
                     2 (W - 1) messages, 2 (W - 1) / W * S elements per rank.
    alternate        W - 1 steps; each rank sends the tensor it received last (its own
                     first) and adds what it receives: W - 1 messages of S elements,
                     (W - 1) S per rank.

These counts and sizes are this implementation's choices (the suite's extra "exact ring
formulas"); the contract asks only for at most the ring's messages, with ring neighbours
only, and at most these bytes plus W - 1 elements of padding a message, so a ring that pads
its chunks or turns the other way is as correct.

Time model (bandwidth term only, per phase, links of ``bandwidth`` bytes/s each way,
latency ignored): reduce-scatter and all-gather (W - 1) / W * S_bytes / bandwidth each;
all-reduce twice that; the alternate ring (W - 1) * S_bytes / bandwidth, W times the
bytes of the reduce-scatter for the same result.

Each step is one ``dist.batch_isend_irecv`` of a send and a receive; ``dist.isend`` /
``dist.irecv`` are looked up on ``torch.distributed`` at call time, so a probe that wraps
them there counts every message.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_MAX_DIMS = 8
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _group_info(group):
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this rank is not a member of the group it called a ring collective on")

    def peer(i):
        i %= world
        return i if group is None or group is dist.group.WORLD else dist.get_global_rank(group, i)

    return world, rank, peer(rank + 1), peer(rank - 1)


def _agree(tensor: torch.Tensor, group, what: str) -> None:
    """One MAX all-reduce of (descriptor, -descriptor): every rank learns whether all agree."""
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"{what}: at most {_MAX_DIMS} dimensions, got shape {tuple(tensor.shape)}")
    code = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else 99
    desc = [code, tensor.dim()] + list(tensor.shape) + [-1] * (_MAX_DIMS - tensor.dim())
    both = torch.tensor(desc + [-v for v in desc], dtype=torch.int64, device=tensor.device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    hi, lo = both[: len(desc)].tolist(), [-v for v in both[len(desc):].tolist()]
    if hi != lo:
        raise ValueError(
            f"{what}: ranks disagree on shape or dtype (this rank: {tuple(tensor.shape)} {tensor.dtype}; "
            f"largest descriptor seen {hi[:2 + hi[1]] if 0 <= hi[1] <= _MAX_DIMS else hi}, smallest "
            f"{lo[:2 + lo[1]] if 0 <= lo[1] <= _MAX_DIMS else lo}; each entry is (dtype code, ndim, *shape))")


def _step(send: torch.Tensor, recv: torch.Tensor, nxt: int, prv: int, group) -> None:
    # One batch, not a separate isend and irecv: NCCL queues a rank's point-to-point calls
    # to its ring neighbours in order, so at W = 2 (next == previous) both ranks' sends
    # would wait for receives queued behind them, and a message too large for NCCL's
    # buffers hangs.  (Gloo buffers any size, so CPU ranks cannot show this.)
    ops = [dist.P2POp(dist.isend, send.contiguous(), nxt, group), dist.P2POp(dist.irecv, recv, prv, group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def _reduce_scatter_chunks(chunks, world, rank, nxt, prv, group) -> None:
    """In place on ``chunks`` (views of one flat buffer): chunk ``rank`` ends reduced."""
    for t in range(world - 1):
        send = chunks[(rank - t - 1) % world]
        into = chunks[(rank - t - 2) % world]
        buf = torch.empty_like(into)
        _step(send, buf, nxt, prv, group)
        into.add_(buf)


def _all_gather_chunks(chunks, world, rank, nxt, prv, group) -> None:
    """In place on ``chunks``: chunk ``rank`` is known; every chunk ends filled."""
    for t in range(world - 1):
        send = chunks[(rank - t) % world]
        into = chunks[(rank - t - 1) % world]
        buf = torch.empty_like(into)
        _step(send, buf, nxt, prv, group)
        into.copy_(buf)


def ring_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    world, rank, nxt, prv = _group_info(group)
    flat = tensor.detach().reshape(-1).clone()
    if world == 1:
        return flat
    _agree(tensor, group, "ring_reduce_scatter")
    chunks = flat.tensor_split(world)
    _reduce_scatter_chunks(chunks, world, rank, nxt, prv, group)
    return chunks[rank].clone()


def ring_all_gather(tensor: torch.Tensor, group=None) -> torch.Tensor:
    if tensor.dim() == 0:
        raise ValueError("ring_all_gather: a 0-dimensional tensor has no dim 0 to concatenate along")
    world, rank, nxt, prv = _group_info(group)
    if world == 1:
        return tensor.detach().clone()
    _agree(tensor, group, "ring_all_gather")
    out = torch.empty((world * tensor.numel(),), dtype=tensor.dtype, device=tensor.device)
    chunks = out.tensor_split(world)
    chunks[rank].copy_(tensor.detach().reshape(-1))
    _all_gather_chunks(chunks, world, rank, nxt, prv, group)
    return out.reshape((world * tensor.shape[0],) + tuple(tensor.shape[1:]))


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    world, rank, nxt, prv = _group_info(group)
    flat = tensor.detach().reshape(-1).clone()
    if world == 1:
        return flat.reshape(tensor.shape)
    _agree(tensor, group, "ring_all_reduce")
    chunks = flat.tensor_split(world)
    _reduce_scatter_chunks(chunks, world, rank, nxt, prv, group)
    _all_gather_chunks(chunks, world, rank, nxt, prv, group)
    return flat.reshape(tensor.shape)


def ring_all_reduce_alternate(tensor: torch.Tensor, group=None) -> torch.Tensor:
    world, rank, nxt, prv = _group_info(group)
    total = tensor.detach().clone().contiguous()
    if world == 1:
        return total
    _agree(tensor, group, "ring_all_reduce_alternate")
    passing = total.clone()
    for _ in range(world - 1):
        incoming = torch.empty_like(passing)
        _step(passing, incoming, nxt, prv, group)
        total.add_(incoming)
        passing = incoming  # pass the original tensor of the rank before, never the sum
    return total
