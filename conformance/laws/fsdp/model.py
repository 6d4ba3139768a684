"""Random FSDP models: CS336's building blocks (bias-free Linear, Embedding, RMSNorm).

An FSDP written for the course may shard only instances of its own
``cs336_basics.model.Linear`` / ``Embedding`` (what CS336's toy FSDP model is made of).
So a model is built from the target's ``cs336_basics.model`` classes when the target's
environment has them with the course's signatures (``course_blocks``), and from the
suite's twins below otherwise; the weights are the same either way (drawn with the
suite's classes, then copied), so every rank and the reference start from the same bits.

A model is ``Embedding(vocab, d0) -> [RMSNorm(d_i) -> Linear(d_i, d_{i+1}) -> relu]* ->
RMSNorm -> head Linear(d_last, vocab)``; the loss is cross-entropy of the last position's
logits in fp32, as in CS336's FSDP test.  Options: the head tied to the embedding
(``d_last == d0``), one Linear frozen, the norms left out.  Everything is a pure function
of the spec and its seed, so every rank and the reference build the same model.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

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
    def __init__(self, vocab: int, widths: tuple[int, ...], *, norms: bool, tied: bool, frozen: int | None, blocks: "Blocks | None" = None):
        super().__init__()
        if tied and widths[-1] != widths[0]:
            raise ValueError("a tied head needs d_last == d0")
        lin, emb, norm = (blocks.linear, blocks.embedding, blocks.rmsnorm) if blocks else (Linear, Embedding, RMSNorm)
        self.embedding = emb(vocab, widths[0])
        self.norms = nn.ModuleList([norm(d) for d in widths[:-1]]) if norms else None
        self.layers = nn.ModuleList([lin(a, b) for a, b in zip(widths, widths[1:])])
        self.final_norm = norm(widths[-1]) if norms else None
        self.head = lin(widths[-1], vocab)
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


@dataclass(frozen=True)
class Blocks:
    """The classes a model is built from, and where they come from."""

    linear: type
    embedding: type
    rmsnorm: type
    source: str

    @property
    def matrices(self) -> tuple[type, type]:
        return (self.linear, self.embedding)


SUITE_BLOCKS = Blocks(Linear, Embedding, RMSNorm, "the suite's Linear/Embedding/RMSNorm")
MATRIX_CLASSES = SUITE_BLOCKS.matrices
COURSE_MODULE = "cs336_basics.model"


def course_blocks() -> Blocks | None:
    """The target's ``cs336_basics.model`` classes, if importable with the course's
    signatures (``Linear(d_in, d_out)``, ``Embedding(vocab, d)``, ``RMSNorm(d)``, each
    holding ``weight``); None otherwise."""
    try:
        mod = importlib.import_module(COURSE_MODULE)
        blocks = Blocks(mod.Linear, mod.Embedding, mod.RMSNorm, f"the target's {COURSE_MODULE}")
        with torch.random.fork_rng(devices=[]):
            ok = (
                tuple(blocks.linear(3, 2).weight.shape) == (2, 3)
                and tuple(blocks.embedding(5, 3).weight.shape) == (5, 3)
                and tuple(blocks.rmsnorm(3).weight.shape) == (3,)
            )
    except Exception:  # absent or different: the suite's classes stand in
        return None
    return blocks if ok else None


def build(spec, device="cpu", dtype=torch.float32, blocks: Blocks = SUITE_BLOCKS) -> RandomModel:
    torch.manual_seed(spec.seed)
    model = RandomModel(spec.vocab, spec.widths, norms=spec.norms, tied=spec.tied, frozen=spec.frozen)
    if blocks is not SUITE_BLOCKS:
        drawn = model
        model = RandomModel(spec.vocab, spec.widths, norms=spec.norms, tied=spec.tied, frozen=spec.frozen, blocks=blocks)
        with torch.no_grad():
            for p, q in zip(drawn.parameters(), model.parameters()):
                q.copy_(p)
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


def matrix_names(model: nn.Module, blocks: Blocks = SUITE_BLOCKS) -> set[str]:
    """Names (every alias) of the Linear/Embedding weights: the parameters FSDP shards."""
    out = set()
    for mname, mod in model.named_modules(remove_duplicate=False):
        if isinstance(mod, blocks.matrices):
            out.add(f"{mname}.weight" if mname else "weight")
    return out
