"""The collectives FSDP issues, looked up on ``torch.distributed`` at call time.

Calling ``dist.<name>`` at call time (never a name bound at import) lets a caller wrap
the module's collectives to observe what is communicated, or to delay one.

torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single`` (the old names warn); torch 2.11 has only
the old ones.  Both take (output, input, ...) the same way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_GROUPS: dict[tuple, object] = {}


def all_gather_flat(output: torch.Tensor, shard: torch.Tensor, group, async_op: bool):
    """``output`` (size * shard.numel(),) <- the shards of every rank of ``group``, rank order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, shard, group=group, async_op=async_op)


def reduce_scatter_sum(output: torch.Tensor, full: torch.Tensor, group, async_op: bool):
    """``output`` <- this rank's chunk of the element-wise sum of every rank's ``full``."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, full, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def all_reduce_sum(tensor: torch.Tensor, group, async_op: bool):
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def broadcast_from_first(tensor: torch.Tensor, group=None) -> None:
    """The first rank of ``group`` (None: the default group) sends ``tensor`` to every
    rank of the group (in place)."""
    if dist.get_world_size(group) > 1:
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast(tensor, src=src, group=group)


def hybrid_groups(shard_size: int):
    """(shard group, replicate group) of this rank for ``shard_size`` ranks per shard group.

    Shard groups are consecutive ranks ``[k*S, (k+1)*S)``; replicate groups hold the ranks
    with the same index inside their shard group.  ``None`` stands for a group of one.
    Every rank creates every group in the same order (``new_group`` is collective);
    groups are cached per (world size, shard size) for the life of the default group.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if shard_size < 1 or world % shard_size:
        raise ValueError(f"shard group size {shard_size} must divide the world size {world}")
    replicas = world // shard_size
    key = (id(dist.group.WORLD), world, shard_size)
    if key not in _GROUPS:
        shard_groups = [dist.new_group(list(range(k * shard_size, (k + 1) * shard_size))) for k in range(replicas)]
        repl_groups = [dist.new_group(list(range(i, world, shard_size))) for i in range(shard_size)]
        _GROUPS[key] = (shard_groups, repl_groups)
    shard_groups, repl_groups = _GROUPS[key]
    shard_group = None if shard_size == 1 else (dist.group.WORLD if replicas == 1 else shard_groups[rank // shard_size])
    repl_group = None if replicas == 1 else (dist.group.WORLD if shard_size == 1 else repl_groups[rank % shard_size])
    return shard_group, repl_group
