"""The first parameter whose gradient holds a NaN or an Inf, on any rank of a group.

Contract
    ``first_nonfinite_gradient(model, group=None) -> str | None``: every rank of ``group``
    calls it (a collective: ONE all-reduce of an int64 index, MIN).  Each rank finds the
    index, in ``model.named_parameters()`` order, of its first parameter whose ``.grad``
    holds a NaN or Inf (parameters without a gradient are skipped); the minimum over the
    ranks is the answer, returned as that parameter's name on every rank (the ranks hold
    the same architecture, so the same index names the same parameter), or None when
    every gradient on every rank is finite.  Without an initialised process group (or with
    a group of one rank) it is the local answer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


def local_first_nonfinite(names_and_params) -> int | None:
    for i, (_, p) in enumerate(names_and_params):
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return i
    return None


def first_nonfinite_gradient(model: nn.Module, group=None) -> str | None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"first_nonfinite_gradient takes a torch.nn.Module, got {type(model).__name__}")
    named = list(model.named_parameters())
    local = local_first_nonfinite(named)
    none = len(named)  # "no non-finite gradient here" sorts after every real index
    index = none if local is None else local
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        device = named[0][1].device if named else torch.device("cpu")
        if device.type == "cuda" and "nccl" not in str(dist.get_backend(group)).lower():
            device = torch.device("cpu")
        t = torch.tensor([index], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        index = int(t.item())
    return None if index == none else named[index][0]
