"""FlashAttention of another design than impl's: the online softmax kept in log space.

    --target conformance.selftests.targets.known_good.attention_logspace

Both flavours hand out an ``autograd.Function`` with ``apply(q, k, v, is_causal=False,
scale=None)`` on (..., N, d) inputs that saves exactly one tensor of shape q.shape[:-1], the
logsumexp L (the CS336 contract).  Where the handout leaves the design free, this one
chooses otherwise than impl:

- forward: instead of a running max m and an unnormalised sum l, each query row keeps its
  running logsumexp L and an output that is normalised after every key tile:
      L' = logaddexp(L, logsumexp_j S_ij),   O' = exp(L - L') O + exp(S - L') V;
- tiles of 64 queries by 128 keys in PyTorch (impl: 32 x 32), and no causal tile skipping:
  every key tile is visited, the masked scores are -inf;
- backward: P recomputed twice from L, once in a query-major pass for dQ and once in a
  key-major pass for dK and dV (impl: one key-major pass accumulating dQ);
- the Triton flavour runs the same log-space forward as a Triton kernel (64 x 64 tiles,
  pointer arithmetic with masks) and the PyTorch backward above, as the handout allows
  ("implement the backward pass ... using PyTorch (not Triton)").
"""

from __future__ import annotations

import math
import os

import torch

TILE_Q, TILE_K = 64, 128
MAX_HEAD_DIM = 256
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_inputs(q, k, v, is_causal, scale) -> float:
    """Bad input is a ValueError or TypeError naming what is wrong; returns the softmax scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., N, d), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; float16, bfloat16, float32 or float64 expected")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"batch shapes differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        raise ValueError(f"head dims differ: q {q.shape[-1]}, k {k.shape[-1]}, v {v.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v sequence lengths differ: {k.shape[-2]} and {v.shape[-2]}")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"sequence lengths must be at least 1, got {q.shape[-2]} and {k.shape[-2]}")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {q.shape[-1]} is outside 1..{MAX_HEAD_DIM}")
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax scale must be a positive finite number, got {scale!r}")
    return float(scale)


def _work(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _masked_scores(q_i, k_j, scale, rows, cols, is_causal):
    """S = scale Q_i K_j^T, -inf where a key is after the query (top-left aligned)."""
    s = (q_i @ k_j.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
    return s


def forward_logspace(q, k, v, is_causal, scale):
    """(O in q.dtype, L in the work dtype), both shaped as q's leading dims."""
    work = _work(q.dtype)
    qf, kf, vf = (t.reshape(-1, t.shape[-2], t.shape[-1]) for t in (q, k, v))
    n_q, n_k = qf.shape[1], kf.shape[1]
    out = torch.empty(qf.shape, dtype=q.dtype, device=q.device)
    lse_out = torch.empty(qf.shape[:2], dtype=work, device=q.device)
    for qs in range(0, n_q, TILE_Q):
        rows = torch.arange(qs, min(qs + TILE_Q, n_q), device=q.device)
        q_i = qf[:, qs:qs + TILE_Q].to(work)
        lse = torch.full(q_i.shape[:2], float("-inf"), dtype=work, device=q.device)
        o = torch.zeros(q_i.shape, dtype=work, device=q.device)  # normalised by exp(lse) throughout
        for ks in range(0, n_k, TILE_K):
            cols = torch.arange(ks, min(ks + TILE_K, n_k), device=q.device)
            s = _masked_scores(q_i, kf[:, ks:ks + TILE_K].to(work), scale, rows, cols, is_causal)
            # every row sees key 0 in the first tile, so L' is finite from there on
            new = torch.logaddexp(lse, torch.logsumexp(s, dim=-1))  # L' = logaddexp(L, lse_j S_ij)
            p = torch.exp(s - new[..., None])  # exp(S - L')
            o = torch.exp(lse - new)[..., None] * o + p @ vf[:, ks:ks + TILE_K].to(work)  # exp(L - L') O + P V
            lse = new
        out[:, qs:qs + TILE_Q] = o.to(q.dtype)
        lse_out[:, qs:qs + TILE_Q] = lse
    return out.reshape(q.shape), lse_out.reshape(q.shape[:-1])


def backward_two_passes(q, k, v, o, lse, grad_o, is_causal, scale):
    """dQ from a query-major pass, dK and dV from a key-major one; P = exp(S - L) each time."""
    work = _work(q.dtype)
    qf, kf, vf, of, dof = (t.reshape(-1, t.shape[-2], t.shape[-1]).to(work) for t in (q, k, v, o, grad_o))
    lf = lse.reshape(qf.shape[:2]).to(work)
    n_q, n_k = qf.shape[1], kf.shape[1]
    delta = (dof * of).sum(dim=-1)  # D_i = rowsum(dO_i * O_i)
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)

    def tile(qs, ks):
        rows = torch.arange(qs, min(qs + TILE_Q, n_q), device=q.device)
        cols = torch.arange(ks, min(ks + TILE_K, n_k), device=q.device)
        s = _masked_scores(qf[:, qs:qs + TILE_Q], kf[:, ks:ks + TILE_K], scale, rows, cols, is_causal)
        p = torch.exp(s - lf[:, qs:qs + TILE_Q, None])  # P = exp(S - L)
        dp = dof[:, qs:qs + TILE_Q] @ vf[:, ks:ks + TILE_K].transpose(-1, -2)  # dP = dO V^T
        return p, p * (dp - delta[:, qs:qs + TILE_Q, None])  # dS = P * (dP - D)

    for qs in range(0, n_q, TILE_Q):  # dQ_i = scale sum_j dS_ij K_j
        for ks in range(0, n_k, TILE_K):
            _, ds = tile(qs, ks)
            dq[:, qs:qs + TILE_Q] += (ds @ kf[:, ks:ks + TILE_K]) * scale
    for ks in range(0, n_k, TILE_K):  # dV_j = sum_i P_ij^T dO_i,  dK_j = scale sum_i dS_ij^T Q_i
        for qs in range(0, n_q, TILE_Q):
            p, ds = tile(qs, ks)
            dv[:, ks:ks + TILE_K] += p.transpose(-1, -2) @ dof[:, qs:qs + TILE_Q]
            dk[:, ks:ks + TILE_K] += (ds.transpose(-1, -2) @ qf[:, qs:qs + TILE_Q]) * scale
    return dq.to(q.dtype).reshape(q.shape), dk.to(k.dtype).reshape(k.shape), dv.to(v.dtype).reshape(v.shape)


class LogSpaceAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None):
        scale = check_inputs(q, k, v, is_causal, scale)
        o, lse = forward_logspace(q, k, v, bool(is_causal), scale)
        ctx.save_for_backward(q, k, v, o, lse)  # lse: the one tensor of shape q.shape[:-1]
        ctx.is_causal, ctx.scale = bool(is_causal), scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        return (*backward_two_passes(q, k, v, o, lse, grad_o, ctx.is_causal, ctx.scale), None, None)


class LogSpaceAttentionTriton(torch.autograd.Function):
    """The log-space forward as a Triton kernel (``attention_logspace_kernel``); backward in PyTorch."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None):
        scale = check_inputs(q, k, v, is_causal, scale)
        if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise ValueError("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1) or a CUDA device")
        from conformance.selftests.targets.known_good.attention_logspace_kernel import forward_triton

        o, lse = forward_triton(q, k, v, bool(is_causal), scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale = bool(is_causal), scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        return (*backward_two_passes(q, k, v, o, lse, grad_o, ctx.is_causal, ctx.scale), None, None)


def get_flashattention_autograd_function_pytorch():
    return LogSpaceAttention


def get_flashattention_autograd_function_triton():
    return LogSpaceAttentionTriton
