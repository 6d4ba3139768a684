"""The communication operations of tensor parallelism, as autograd functions.

Each operation is the conjugate of another: what one does forward, its partner does
backward.  With W ranks in the tensor-parallel group (Megatron-LM, Shoeybi et al. 2019):

    copy_to_tp_region         forward: identity            backward: all-reduce (sum)
    reduce_from_tp_region     forward: all-reduce (sum)    backward: identity
    gather_from_tp_region     forward: all-gather, last dim  backward: keep own chunk
    scatter_to_tp_region      forward: keep own chunk      backward: all-gather, last dim
    gather_from_sp_region     forward: all-gather, dim 1   backward: reduce-scatter, dim 1
    scatter_to_sp_region      forward: keep own chunk, dim 1  backward: all-gather, dim 1
    reduce_scatter_to_sp_region  forward: reduce-scatter, dim 1  backward: all-gather, dim 1
    all_reduce_grad           forward: identity            backward: all-reduce (sum)
                              (for replicated parameters whose gradient is partial)

Contract: tensors of any float dtype on the group's device; chunked dimensions must be
divisible by W (a clear ValueError otherwise).  Every collective is a plain
``torch.distributed`` call on ``group`` (None: the default group); nothing is saved for
backward but the group.  A group of one rank communicates nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_size(group=None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group=None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of rank's shard of n items in the chunk layout: ceil(n / W) items a
    rank, the last shards shorter (possibly empty).  torch's DTensor ``Shard`` uses it too."""
    size = -(-n // world_size)
    start = min(rank * size, n)
    return start, min(start + size, n)


def _all_gather_into(out: torch.Tensor, x: torch.Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x, group=group)


def _chunk(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    w, r = group_size(group), group_rank(group)
    if x.shape[dim] % w:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} is not divisible by the tensor-parallel size {w}")
    return x.chunk(w, dim=dim)[r].contiguous()


def _all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    w = group_size(group)
    if w == 1:
        return x
    x = x.movedim(dim, 0).contiguous()
    out = x.new_empty((w * x.shape[0],) + tuple(x.shape[1:]))
    _all_gather_into(out, x, group)
    return out.movedim(0, dim)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    if group_size(group) == 1:
        return x
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    w = group_size(group)
    if w == 1:
        return x
    if x.shape[dim] % w:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} is not divisible by the tensor-parallel size {w}")
    x = x.movedim(dim, 0).contiguous()
    out = x.new_empty((x.shape[0] // w,) + tuple(x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, group=group)
    return out.movedim(0, dim)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _chunk(grad, -1, ctx.group), None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _chunk(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, -1, ctx.group), None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, 1, ctx.group), None


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _chunk(x, 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, 1, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, 1, ctx.group), None


def copy_to_tp_region(x, group=None):
    return _CopyToTP.apply(x, group)


def reduce_from_tp_region(x, group=None):
    return _ReduceFromTP.apply(x, group)


def gather_from_tp_region(x, group=None):
    return _GatherFromTP.apply(x, group)


def scatter_to_tp_region(x, group=None):
    return _ScatterToTP.apply(x, group)


def gather_from_sp_region(x, group=None):
    return _GatherFromSP.apply(x, group)


def scatter_to_sp_region(x, group=None):
    return _ScatterToSP.apply(x, group)


def reduce_scatter_to_sp_region(x, group=None):
    return _ReduceScatterToSP.apply(x, group)


def all_reduce_grad(x, group=None):
    """Identity forward, all-reduce of the gradient backward (a replicated parameter used
    on a shard of the data: norms under sequence parallelism)."""
    return _CopyToTP.apply(x, group)
