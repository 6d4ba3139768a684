"""torch.distributed's own collectives as a ring-collectives target.

    pytest properties/test_ring_collectives.py --target conformance.adapters.torch_collectives

Each entry point calls the backend's collective (gloo or NCCL) on a copy of the input.
They are not built from point-to-point messages, and say so (``RING_COLLECTIVES_NOT_POINT_TO_POINT``,
the protocol's declaration): the laws on point-to-point messages (bounds, exact formulas,
NCCL-safe exchanges) read "not applicable" on them; the value laws and the other extras
are the comparison.  A target without the declaration that sends no messages fails those
laws, as a ring that sends nothing must.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

RING_COLLECTIVES_NOT_POINT_TO_POINT = (
    "torch.distributed's all_reduce and all_gather run inside the backend (gloo, NCCL), not as point-to-point "
    "calls whose messages could be counted")


def _agree(tensor, group):
    desc = torch.tensor([tensor.dim(), *tensor.shape, *([-1] * (8 - tensor.dim()))], dtype=torch.int64,
                        device=tensor.device)
    both = torch.cat([desc, -desc])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(both[:9], -both[9:]):
        raise ValueError(f"ranks disagree on the shape (this rank: {tuple(tensor.shape)})")


def ring_all_reduce(tensor, group=None):
    if dist.get_world_size(group) > 1:
        _agree(tensor, group)
    out = tensor.detach().clone()
    dist.all_reduce(out, group=group)
    return out


def ring_all_reduce_alternate(tensor, group=None):
    return ring_all_reduce(tensor, group)


def ring_all_gather(tensor, group=None):
    world = dist.get_world_size(group)
    if world > 1:
        _agree(tensor, group)
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor.detach().contiguous(), group=group)
    return torch.cat(parts, dim=0)


def ring_reduce_scatter(tensor, group=None):
    world = dist.get_world_size(group)
    total = ring_all_reduce(tensor, group)
    return total.flatten().tensor_split(world)[dist.get_rank(group)].clone()
