"""Dense modules and inputs of a case, rebuilt identically on every rank and in the
reference from the case's seed (float32 weights; the reference casts a copy to float64)."""

from __future__ import annotations

import torch
import torch.nn as nn

from conformance.laws import optimizers
from impl.models.gpt import Block, GPTConfig, make_gpt

from .strategies import BlockCase, CrossEntropyCase, EmbeddingCase, LinearCase, ModelCase


def _gen(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 7919 + salt)


def randn(shape, seed: int, salt: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=_gen(seed, salt), dtype=torch.float64).to(dtype)


def linear(case: LinearCase) -> nn.Linear:
    torch.manual_seed(case.seed)
    lin = nn.Linear(case.in_features, case.out_features, bias=case.bias)
    with torch.no_grad():  # the default init leaves a bias of the same scale as the weight: make it visible
        if lin.bias is not None:
            lin.bias.copy_(randn(lin.bias.shape, case.seed, 1))
    return lin


def linear_inputs(case: LinearCase):
    """x (batch..., in) and the upstream gradient dy (batch..., out)."""
    return randn(case.batch_shape + (case.in_features,), case.seed, 2), randn(case.batch_shape + (case.out_features,), case.seed, 3)


def embedding(case: EmbeddingCase) -> nn.Embedding:
    torch.manual_seed(case.seed)
    return nn.Embedding(case.vocab_size, case.dim)


def embedding_inputs(case: EmbeddingCase):
    """ids: every vocabulary id once (so every shard boundary), then random ids; dy."""
    g = _gen(case.seed, 4)
    every = torch.randperm(case.vocab_size, generator=g)
    extra = torch.randint(0, case.vocab_size, (case.batch * 3,), generator=g)
    ids = torch.cat([every, extra]).unsqueeze(0)
    return ids, randn(tuple(ids.shape) + (case.dim,), case.seed, 5)


def cross_entropy_inputs(case: CrossEntropyCase):
    """Full logits (tokens..., V) in the case's dtype, targets (tokens...) int64, and the
    upstream gradient of a 'none' loss.  Targets visit both sides of every shard boundary
    of the chunk layout; ``n_ignored`` of them are ignore_index."""
    dtype = getattr(torch, case.dtype)
    g = _gen(case.seed, 6)
    v, w = case.vocab_size, case.world_size
    size = -(-v // w)
    boundary = sorted({min(max(b + d, 0), v - 1) for r in range(1, w + 1) for b in (r * size,) for d in (-1, 0)})
    targets = torch.randint(0, v, (case.n_tokens,), generator=g)
    targets[: len(boundary)] = torch.tensor(boundary[: case.n_tokens])
    targets = targets[torch.randperm(case.n_tokens, generator=g)]
    ignored = torch.randperm(case.n_tokens, generator=g)[: case.n_ignored]
    targets[ignored] = case.ignore_index
    logits = randn((case.n_tokens, v), case.seed, 7) * case.scale
    if case.shift:
        # quarter-integers: x + shift is exact in float32 for |shift| <= 2^14
        logits = (logits * 4).round() / 4 + case.shift
    logits = logits.to(dtype)
    dy = randn((case.n_tokens,), case.seed, 8, dtype)
    return logits.reshape(case.token_shape + (v,)), targets.reshape(case.token_shape), dy.reshape(case.token_shape)


def gpt_config(case) -> GPTConfig:
    n_layers = getattr(case, "n_layers", 1)
    vocab = getattr(case, "vocab_size", 16)
    return GPTConfig(case.d_head * case.n_heads, case.d_ff, n_layers, case.n_heads, vocab_size=vocab,
                     context_length=max(8, case.seq), attention="eager")


def block(case: BlockCase) -> Block:
    torch.manual_seed(case.seed)
    blk = Block(gpt_config(case))
    with torch.no_grad():  # norms away from 1 so that their gradients matter
        for norm in (blk.ln1, blk.ln2):
            norm.weight.copy_(1 + 0.5 * randn(norm.weight.shape, case.seed, 9))
    return blk


def block_inputs(case: BlockCase):
    c = case.d_head * case.n_heads
    return randn((case.batch, case.seq, c), case.seed, 10), randn((case.batch, case.seq, c), case.seed, 11)


def gpt(case: ModelCase):
    torch.manual_seed(case.seed)
    return make_gpt(gpt_config(case))


def gpt_batches(case: ModelCase):
    """One (ids, targets) batch per step; a few targets are ignore_index."""
    g = _gen(case.seed, 12)
    out = []
    for _ in range(case.steps):
        ids = torch.randint(0, case.vocab_size, (case.batch, case.seq), generator=g)
        tgt = torch.randint(0, case.vocab_size, (case.batch, case.seq), generator=g)
        tgt[torch.rand(tgt.shape, generator=g) < 0.2] = case.ignore_index
        if bool((tgt == case.ignore_index).all()):
            tgt.view(-1)[0] = 1  # at least one token counts (ignore_index is -100 or 0)
        out.append((ids, tgt))
    return out


def optimizer(name: str, params):
    if name == "SGD":
        return optimizers.build(torch.optim.SGD, params, lr=0.1, momentum=0.9, weight_decay=0.01)
    if name == "AdamW":
        return optimizers.build(torch.optim.AdamW, params, lr=1e-2, eps=1e-3, weight_decay=0.01)
    raise ValueError(f"unknown optimizer {name!r}")
