"""Eager attention: the obviously-right reference every attention check compares against.

    S = Q K^T * scale                       (scores, N_q x N_k)
    S_ij = -inf  where is_causal and j > i  (top-left aligned: query i sees keys 0..i)
    L_i = log sum_j exp(S_ij)               (row logsumexp)
    P = exp(S - L)                          (row softmax)
    O = P V

It materialises the full score matrix, works in any dtype the inputs have (float64 for
the oracle's reference, the tested dtype for its error baseline) and supports any number
of leading batch dimensions and N_q != N_k.  With top-left alignment every query row sees
at least key 0, so no row is ever fully masked.
"""

from __future__ import annotations

import math

import torch


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def causal_mask(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """True where a score is masked out: key j after query i (top-left aligned)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return j > i


def attention_scores(q, k, is_causal=False, scale=None) -> torch.Tensor:
    scale = default_scale(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return s


def attention_reference(q, k, v, is_causal=False, scale=None):
    """Return (O, L) computed from the materialised scores, in the inputs' dtype."""
    s = attention_scores(q, k, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    return p @ v, lse


class EagerAttention(torch.autograd.Function):
    """The eager reference behind the adapter interface; backward is autograd's."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None):
        with torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
            o, lse = attention_reference(q_, k_, v_, bool(is_causal), scale)
        ctx.graph = (q_, k_, v_, o)
        ctx.save_for_backward(lse.detach())
        return o.detach()

    @staticmethod
    def backward(ctx, grad_o):
        q_, k_, v_, o = ctx.graph
        dq, dk, dv = torch.autograd.grad(o, (q_, k_, v_), grad_o, retain_graph=True)
        return dq, dk, dv, None, None
