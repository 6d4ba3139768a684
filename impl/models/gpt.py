"""A GPT-style decoder for benchmarks, with swappable attention.

Pre-norm transformer blocks (RMSNorm, causal multi-head attention, SwiGLU-free GELU MLP
of width d_ff), tied-free embedding and LM head, random weights.  The standard sizes are
the ones CS336 benchmarks (d_model, d_ff, layers, heads):

    small 768/3072/12/12, medium 1024/4096/24/16, large 1280/5120/36/20,
    xl 1600/6400/48/25, 2.7B 2560/10240/32/32

``gpt1_5b`` (1600/6400/48/25 with a 50257 vocabulary: about 1.5B parameters) is the
model the data-parallel and sharded-optimizer benchmarks use.

Attention backends: ``eager`` (materialised softmax), ``sdpa``
(torch.nn.functional.scaled_dot_product_attention), ``triton`` and ``pytorch`` (this
project's FlashAttention-2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    vocab_size: int = 10_000
    context_length: int = 512
    attention: str = "sdpa"


SIZES = {
    "small": GPTConfig(768, 3072, 12, 12),
    "medium": GPTConfig(1024, 4096, 24, 16),
    "large": GPTConfig(1280, 5120, 36, 20),
    "xl": GPTConfig(1600, 6400, 48, 25),
    "2.7B": GPTConfig(2560, 10240, 32, 32),
    "gpt1_5b": GPTConfig(1600, 6400, 48, 25, vocab_size=50257, context_length=1024),
    "tiny": GPTConfig(64, 256, 2, 4, vocab_size=256, context_length=64),
}


def attention(q, k, v, backend: str):
    """Causal attention over (B, H, N, d) with the chosen backend."""
    if backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if backend == "eager":
        from impl.attention.reference import attention_reference

        return attention_reference(q, k, v, is_causal=True)[0]
    if backend in ("triton", "gluon"):  # custom ops under torch.compile (impl/attention/custom_ops.py)
        from impl.attention.custom_ops import attention as flash_attention

        return flash_attention(q, k, v, True, backend)
    if backend == "pytorch":
        from impl.attention.flash_pytorch import FlashAttentionPytorch

        return FlashAttentionPytorch.apply(q, k, v, True)
    raise ValueError(f"unknown attention backend {backend!r}; expected eager, sdpa, triton, gluon or pytorch")


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        # y = x / sqrt(mean(x^2) + eps) * g, computed in fp32 for stability
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.backend = cfg.attention

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        # (B, N, C) -> (B, H, N, d): a transposed view, no copy
        q, k, v = (t.view(b, n, self.n_heads, c // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v, self.backend)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.attn = RMSNorm(cfg.d_model), CausalSelfAttention(cfg)
        self.ln2, self.mlp = RMSNorm(cfg.d_model), MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context_length, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx):
        n = idx.shape[1]
        if n > self.cfg.context_length:
            raise ValueError(f"sequence length {n} exceeds context_length {self.cfg.context_length}")
        x = self.tok(idx) + self.pos(torch.arange(n, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def make_gpt(size: str | GPTConfig, *, attention: str | None = None, device=None, dtype=None, **overrides) -> GPT:
    cfg = SIZES[size] if isinstance(size, str) else size
    if attention is not None:
        overrides["attention"] = attention
    if overrides:
        cfg = GPTConfig(**{**cfg.__dict__, **overrides})
    with torch.device(device or "cpu"):
        model = GPT(cfg)
    return model.to(dtype=dtype) if dtype is not None else model


def random_batch(cfg: GPTConfig, batch: int, seq: int, device=None, generator=None):
    """Random token ids (inputs) and next-token targets."""
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device, generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
