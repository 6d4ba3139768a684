"""Input validation shared by every attention implementation in ``impl``.

Bad input gets a ValueError or TypeError naming what is wrong, before any kernel runs.
"""

from __future__ import annotations

import math
import os

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def validate_attention_inputs(
    q,
    k,
    v,
    is_causal,
    scale,
    *,
    dtypes=FLOAT_DTYPES,
    max_head_dim: int | None = None,
    triton: bool = False,
) -> float:
    """Check the inputs of attention(q, k, v, is_causal, scale); return the softmax scale.

    Shapes: q (..., N_q, d), k (..., N_k, d), v (..., N_k, d) with equal leading dims.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"attention: {name} must have shape (..., N, d), got {tuple(t.shape)}")
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(
            f"attention: q, k, v must have the same number of dims, got {q.dim()}, {k.dim()}, {v.dim()}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"attention: unsupported dtype {t.dtype} for {name}; supported: {allowed}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: tensors on different devices: q {q.device}, k {k.device}, v {v.device}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            "attention: batch dims differ: "
            f"q {tuple(q.shape[:-2])}, k {tuple(k.shape[:-2])}, v {tuple(v.shape[:-2])}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention: head dims differ: q has d={q.shape[-1]}, k has d={k.shape[-1]}")
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"attention: value head dim {v.shape[-1]} must equal the query head dim {q.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention: K/V length mismatch: k has N_k={k.shape[-2]}, v has N_k={v.shape[-2]}")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"attention: sequence lengths must be >= 1, got N_q={q.shape[-2]}, N_k={k.shape[-2]}")
    d = q.shape[-1]
    if d < 1 or (max_head_dim is not None and d > max_head_dim):
        raise ValueError(f"attention: unsupported head dim {d}; supported: 1..{max_head_dim}")
    if not isinstance(is_causal, (bool, int)) or isinstance(is_causal, int) and is_causal not in (0, 1):
        raise TypeError(f"attention: is_causal must be a bool, got {is_causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, torch.Tensor) or not isinstance(scale, (int, float)):
        raise TypeError(f"attention: scale must be a Python float or None, got {type(scale).__name__}")
    elif not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"attention: scale must be a positive finite number, got {scale}")
    if triton:
        if q.device.type == "cpu" and not interpreter_enabled():
            raise ValueError(
                "attention (Triton): CPU tensors need the Triton interpreter; set TRITON_INTERPRET=1 "
                "before importing triton, or move the tensors to a CUDA device"
            )
        if q.device.type not in ("cpu", "cuda"):
            raise ValueError(f"attention (Triton): unsupported device {q.device}")
    return float(scale)
