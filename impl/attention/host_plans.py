"""What the kernels' host paths share: a plan per call signature, the (B, H, N, d) view of
an input, and outputs laid out like their inputs.

A *plan* holds everything a call with inputs of one signature needs besides the inputs
(checked scale, tiles, launches with their strides fixed), so a repeated call validates
nothing and binds nothing again (``impl/attention/triton_launch.py``)."""

from __future__ import annotations

import torch


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """(..., N, d) -> (B, H, N, d), a view whenever the strides allow one (more than four
    dims: the outer batch dims merged, a copy only if they must be)."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    if t.dim() == 4:
        return t
    return t.reshape(-1, *t.shape[-3:])


def signature(*tensors) -> tuple:
    """What a plan depends on besides the call's scalars: per tensor its shape, strides, dtype,
    device and whether its address is 16-byte aligned (Triton specialises pointers on it)."""
    return tuple((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0) for t in tensors)


def dense_strides_like(t: torch.Tensor) -> tuple:
    """Strides of an output of t's shape, dense, in t's memory order: dims by decreasing
    stride (ties in dim order), the head dim innermost.  For q stored (B, N, H, d) and seen
    as (B, H, N, d) (a model's heads split from one projection), O and dQ are stored
    (B, N, H, d) too, so the model's transpose back and reshape are views, not copies (as
    torch's SDPA does).  Contiguous for a contiguous t and for more than 4 dims (merged)."""
    if t.dim() > 4 or t.is_contiguous():
        return torch.empty(t.shape, device="meta").stride()
    order = sorted(range(t.dim() - 1), key=lambda i: (-t.stride(i), i)) + [t.dim() - 1]  # outermost first
    strides, size = [0] * t.dim(), 1
    for i in reversed(order):
        strides[i] = size
        size *= t.shape[i]
    return tuple(strides)


class PlanCache:
    """(kind, scalars, signature) -> plan.  Bounded: a process that sees many shapes (a
    property run) drops the oldest plans; their compiled kernels stay in Triton's own cache."""

    def __init__(self, max_plans: int = 512):
        self.max_plans = max_plans
        self.plans: dict = {}

    def get(self, key, build):
        plan = self.plans.get(key)
        if plan is None:
            plan = build()
            if len(self.plans) >= self.max_plans:
                del self.plans[next(iter(self.plans))]
            self.plans[key] = plan
        return plan

    def clear(self) -> None:
        self.plans.clear()
