"""Random FSDP models: CS336's building blocks (bias-free Linear, Embedding, RMSNorm).

A model is ``Embedding(vocab, d0) -> [RMSNorm(d_i) -> Linear(d_i, d_{i+1}) -> relu]* ->
RMSNorm -> head Linear(d_last, vocab)``; the loss is cross-entropy of the last position's
logits in fp32, as in CS336's FSDP test.  Options: the head tied to the embedding
(``d_last == d0``), one Linear frozen, the norms left out.  Everything is a pure function
of the spec and its seed, so every rank and the reference build the same model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return x @ self.weight.t()


class Embedding(nn.Module):
    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(vocab, d), std=1.0, a=-3, b=3))

    def forward(self, ids):
        return self.weight[ids, :]


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        in_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(in_dtype)


class RandomModel(nn.Module):
    def __init__(self, vocab: int, widths: tuple[int, ...], *, norms: bool, tied: bool, frozen: int | None):
        super().__init__()
        if tied and widths[-1] != widths[0]:
            raise ValueError("a tied head needs d_last == d0")
        self.embedding = Embedding(vocab, widths[0])
        self.norms = nn.ModuleList([RMSNorm(d) for d in widths[:-1]]) if norms else None
        self.layers = nn.ModuleList([Linear(a, b) for a, b in zip(widths, widths[1:])])
        self.final_norm = RMSNorm(widths[-1]) if norms else None
        self.head = Linear(widths[-1], vocab)
        if tied:
            self.head.weight = self.embedding.weight
        if frozen is not None:
            self.layers[frozen].weight.requires_grad_(False)

    def forward(self, ids):
        x = self.embedding(ids)
        for i, layer in enumerate(self.layers):
            if self.norms is not None:
                x = self.norms[i](x)
            x = torch.relu(layer(x))
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.head(x)


MATRIX_CLASSES = (Linear, Embedding)


def build(spec, device="cpu", dtype=torch.float32) -> RandomModel:
    torch.manual_seed(spec.seed)
    model = RandomModel(spec.vocab, spec.widths, norms=spec.norms, tied=spec.tied, frozen=spec.frozen)
    return model.to(device=device, dtype=dtype)


def loss_of(logits, labels):
    return F.cross_entropy(logits[:, -1, :].float(), labels)


def batch(spec, step: int, micro: int, device="cpu"):
    """The global batch of one (step, micro-batch): ids (W*b, seq) and labels (W*b,)."""
    g = torch.Generator().manual_seed(spec.seed * 7919 + step * 101 + micro)
    n = spec.world_size * spec.batch_per_rank
    ids = torch.randint(0, spec.vocab, (n, spec.seq), generator=g)
    labels = torch.randint(0, spec.vocab, (n,), generator=g)
    return ids.to(device), labels.to(device)


def rank_slice(spec, rank: int):
    return slice(rank * spec.batch_per_rank, (rank + 1) * spec.batch_per_rank)


def matrix_names(model: nn.Module) -> set[str]:
    """Names (every alias) of the Linear/Embedding weights: the parameters FSDP shards."""
    out = set()
    for mname, mod in model.named_modules(remove_duplicate=False):
        if isinstance(mod, MATRIX_CLASSES):
            out.add(f"{mname}.weight" if mname else "weight")
    return out
