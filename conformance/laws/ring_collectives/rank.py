"""Functions run on every rank (module level: the harness pickles them by reference).

Each case runs under ``conformance.laws.p2p_hang.P2PLog``, which counts a rank's
point-to-point messages and records its calls as NCCL would run them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from conformance.laws.p2p_hang import P2PLog
from conformance.laws.ring_collectives import reference
from conformance.laws.ring_collectives.strategies import RingCase
from conformance.target import load_target

def run_case(ctx, target_spec: str, case: RingCase, torch_reference: bool = True):
    """On every rank: the target's collective on this rank's input, its messages, and torch's
    own collective on the same input (the eager result in this dtype)."""
    group, members = None, tuple(range(ctx.world_size))
    if case.members:
        group, members = dist.new_group(list(case.members)), case.members
        if ctx.rank not in members:
            dist.barrier()
            return None
    grank = members.index(ctx.rank)
    world = len(members)
    x = reference.rank_input(case, grank).to(ctx.device)
    fn = load_target(target_spec).factory(case.op)
    x_in = _strided_view(x) if case.layout == "strided" else x
    keep = x.clone()
    with P2PLog() as probe:
        out = fn(x_in, group)
    assert torch.equal(x_in, keep), f"{case.op} wrote into its input"
    if isinstance(out, torch.Tensor) and out.numel() and out.untyped_storage().data_ptr() == x_in.untyped_storage().data_ptr():
        raise AssertionError(f"{case.op} returned its input's storage, not a new tensor (W={world})")
    eager = _torch_collective(case.op, x, group, world, grank) if torch_reference else None
    ring = [members[(grank + 1) % world], members[(grank - 1) % world]]
    if case.members:
        dist.barrier()
    return {"out": out, "eager": eager, "log": probe.log, "units": probe.units, "rank": ctx.rank, "ring": ring,
            "group_rank": grank, "world": world}


def _strided_view(x: torch.Tensor) -> torch.Tensor:
    """x's values in a non-contiguous layout: stored with its first and last dims swapped
    (no view flattens it), or for one dim every other element of a buffer twice the size."""
    if x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    buf = torch.zeros(x.shape + (2,), dtype=x.dtype, device=x.device)
    buf[..., 0] = x
    return buf[..., 0]


def _torch_collective(op: str, x, group, world: int, grank: int):
    if op == "ring_all_gather":
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=0)
    total = x.clone()
    dist.all_reduce(total, group=group)
    if op == "ring_reduce_scatter":
        return total.flatten().tensor_split(world)[grank]
    return total


def run_mismatch(ctx, target_spec: str, case: RingCase):
    """Every rank calls with its own (possibly different) shape; returns the error it raised
    (the kinds ``checks.CLEAR_ERRORS`` names; any other propagates as the rank's failure)."""
    x = reference.rank_input(case, ctx.rank).to(ctx.device)
    fn = load_target(target_spec).factory(case.op)
    try:
        out = fn(x, None)
    except (ValueError, TypeError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"returned {tuple(out.shape)}"
