"""Case descriptions: a training case (model, world size, batch splits, optimizer, precision, seed)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .model import ModelSpec


@dataclass(frozen=True)
class StepPlan:
    micro_splits: tuple[tuple[int, ...], ...]  # per micro-batch: rows per rank
    branch_p: float = 0.0  # probability that a row selects the branch

    @property
    def rows(self) -> int:
        return sum(sum(s) for s in self.micro_splits)


@dataclass(frozen=True)
class TrainingCase:
    model: ModelSpec
    world_size: int
    steps: tuple[StepPlan, ...]
    optimizer: str = "sgd"  # sgd | adam | adamw
    lr: float = 0.05
    precision: str = "fp32"  # fp32 | bf16 (float32 parameters under bf16 autocast)
    bucket_size_mb: float | None = None  # only the bucketed flavour uses it
    seed: int = 0


OPTIMIZERS = ("sgd", "adam", "adamw")
PRECISIONS = ("fp32", "bf16")


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=1e-2)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, eps=1e-2, weight_decay=0.1)
    raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")


def step_data(case: TrainingCase, step: int):
    """The step's global batch (x, y, branch_rows), float32 values, from the case's seed."""
    plan = case.steps[step]
    g = torch.Generator().manual_seed(case.seed * 7919 + step)
    b = plan.rows
    x = torch.randn(b, case.model.d_in, generator=g, dtype=torch.float64).float()
    y = torch.randn(b, case.model.d_out, generator=g, dtype=torch.float64).float()
    rows = torch.rand(b, generator=g, dtype=torch.float64) < plan.branch_p
    return x, y, rows


def local_rows(plan: StepPlan, micro: int, rank: int) -> slice:
    """Rows of the global batch that rank ``rank`` gets in micro-batch ``micro``.

    The global batch is laid out micro-batch by micro-batch, rank by rank."""
    start = sum(sum(s) for s in plan.micro_splits[:micro]) + sum(plan.micro_splits[micro][:rank])
    return slice(start, start + plan.micro_splits[micro][rank])


def autocast_for(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def row_loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum over rows of 0.5 * ||out_row - y_row||^2, in float32 or wider."""
    out = out if out.dtype == torch.float64 else out.float()
    return 0.5 * (out - y.to(out.dtype)).pow(2).sum()
