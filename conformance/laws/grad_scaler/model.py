"""Model, batches and wrappers of the gradient-scaler laws (impl's DDP/FSDP around the DDP laws' MLP)."""

from __future__ import annotations

import torch

from conformance.laws.ddp.model import ModelSpec, RandomMLP


def build(case, dtype=torch.float32) -> RandomMLP:
    torch.manual_seed(case.seed)
    spec = ModelSpec(d_in=case.width, widths=(case.width + 1, case.width), d_out=2, frozen=case.frozen, branch=case.unused)
    return RandomMLP(spec).to(dtype)  # called without branch rows: the branch layer is never used


def batch(case, rank: int, step: int, micro: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(case.seed * 7919 + rank * 613 + step * 31 + micro)
    x = torch.randn(case.rows, case.width, generator=g, dtype=torch.float64)
    y = torch.randn(case.rows, 2, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def loss_fn(out, y, case):
    """Per rank: the summed squared error over its rows of one micro-batch, divided by the
    rows of all its micro-batches (the wrappers' average over ranks then gives the mean)."""
    return ((out - y) ** 2).sum() / (case.rows * case.micro_batches)


def wrap(case, module):
    import impl
    from impl.fsdp import FSDP

    if case.wrapper == "bucketed":
        return impl.get_ddp(module)
    if case.wrapper == "individual":
        return impl.get_ddp_individual_parameters(module)
    if case.wrapper == "fsdp":
        return FSDP(module)
    raise ValueError(f"unknown wrapper {case.wrapper!r}")


def optimizers(case, params) -> list:
    """One optimizer over every parameter (frozen and unused ones included, as
    ``model.parameters()`` gives them), or two over the first half and the rest."""
    params = list(params)
    if not case.two_optimizers:
        return [optimizer(case, params)]
    cut = max(1, len(params) // 2)
    return [optimizer(case, params[:cut]), optimizer(case, params[cut:])]


def optimizer(case, params):
    if case.optimizer == "adam":
        return torch.optim.Adam(params, lr=0.05)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)
