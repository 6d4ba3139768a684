"""The model and batches of the uneven-inputs law: the same on every rank and in the reference."""

from __future__ import annotations

import torch

from conformance.laws.ddp.model import ModelSpec, RandomMLP


def build(case, dtype=torch.float32) -> RandomMLP:
    torch.manual_seed(case.seed)
    model = RandomMLP(ModelSpec(d_in=case.width, widths=(case.width + 1,), d_out=2))
    return model.to(dtype)


def batch(case, rank: int, step: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(case.seed * 1009 + rank * 101 + step)
    x = torch.randn(case.rows, case.width, generator=g, dtype=torch.float64)
    y = torch.randn(case.rows, 2, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def loss_fn(out, y):
    return ((out - y) ** 2).sum()
