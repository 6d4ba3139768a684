"""Random models for the data-parallel laws: MLPs with tied, frozen and branch-only parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class ModelSpec:
    d_in: int
    widths: tuple[int, ...]  # hidden widths; depth = len(widths)
    d_out: int
    bias: bool = True
    tied: bool = False  # a pair of square layers sharing one weight (two names, one tensor)
    frozen: bool = False  # a square layer with requires_grad=False, used in forward
    branch: bool = False  # a square layer applied only to the rows a per-row mask selects


class RandomMLP(nn.Module):
    """x -> tanh layers -> [tied pair] -> [+ frozen] -> [+ branch on masked rows] -> head * out_scale.

    tanh, not ReLU: no kinks, so rounding differences never flip a derivative.  The
    branch is not called at all when no row of the local batch selects it, so a rank (or
    every rank) can get no gradient for it; masked-out rows contribute exact zeros.
    ``out_scale`` is a buffer the forward uses (a wrapper must broadcast it).
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        dims = (spec.d_in,) + tuple(spec.widths)
        self.body = nn.ModuleList(nn.Linear(a, b, bias=spec.bias) for a, b in zip(dims, dims[1:]))
        w = dims[-1]
        if spec.tied:
            self.tied_a = nn.Linear(w, w, bias=spec.bias)
            self.tied_b = nn.Linear(w, w, bias=spec.bias)
            self.tied_b.weight = self.tied_a.weight
        if spec.frozen:
            self.frozen = nn.Linear(w, w, bias=spec.bias).requires_grad_(False)
        if spec.branch:
            self.branch = nn.Linear(w, w, bias=spec.bias)
        self.head = nn.Linear(w, spec.d_out, bias=spec.bias)
        self.register_buffer("out_scale", torch.ones(spec.d_out))

    def forward(self, x, branch_rows=None):
        h = x
        for layer in self.body:
            h = torch.tanh(layer(h))
        if self.spec.tied:
            h = torch.tanh(self.tied_b(torch.tanh(self.tied_a(h))))
        if self.spec.frozen:
            h = h + torch.tanh(self.frozen(h))
        if self.spec.branch and branch_rows is not None and bool(branch_rows.any()):
            h = h + torch.tanh(self.branch(h)) * branch_rows[:, None].to(h.dtype)
        return self.head(h) * self.out_scale


@torch.no_grad()
def build_model(spec: ModelSpec, seed: int) -> RandomMLP:
    """A float32 RandomMLP whose parameters and buffer come from ``seed`` (drawn in float64)."""
    model = RandomMLP(spec)
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        fan_in = p.shape[-1] if p.dim() > 1 else 10
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(fan_in))
    model.out_scale.copy_(1.0 + 0.25 * torch.randn(spec.d_out, generator=g, dtype=torch.float64))
    return model


def rank_seed(seed: int, rank: int) -> int:
    """Rank 0 uses the case's seed; the others start somewhere else on purpose."""
    return seed if rank == 0 else seed + 1_000_003 * rank


def unique_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def synced_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]
