"""The attention workload every perf script times, written once: inputs, FLOP counts,
eager attention, torch SDPA, and the device synchronisation every timer needs.

Inputs
    ``make_inputs(shape, dtype, device, seed=0, grad=True)``: q, k, v, dO, standard normal,
    drawn in ``dtype`` from a generator on ``device`` seeded with ``seed``; q, k and v
    require grad unless ``grad=False``.  Attention inputs are (B, H, N, d).

FLOPs
    ``attention_flops(batch, heads, n, d, causal, pass_)``: the matmul FLOPs of one pass.
    The forward is two matmuls of 2 N^2 d each per (batch, head), half of them under the
    causal mask; the backward is five matmuls, 2.5x the forward (the recomputation of S
    is not counted); ``pass_`` is "forward", "backward" or "forward_backward" (3.5x).

Attention
    ``eager_attention(q, k, v, causal=True)``: S = Q K^T / sqrt(d), the mask, softmax,
    P V, the N x N scores materialised; autograd's backward.
    ``sdpa_attention(q, k, v, causal=True, backend=None)``: torch SDPA, with the backend
    PyTorch picks or, with ``backend`` ("flash", "cudnn", "efficient", "math"), forced to
    one through ``sdpa_backend(backend)`` (a context manager, usable around any block).

Synchronisation
    ``synchronize(device)``: ``torch.cuda.synchronize`` on a CUDA device, nothing on the
    CPU.  CUDA work is asynchronous: a wall-clock timer without it reads the launches.
"""

from __future__ import annotations

from typing import Sequence

import torch

PASSES = ("forward", "backward", "forward_backward")
_PASS_FACTOR = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}

# sdpa_backend names -> torch.nn.attention.SDPBackend members
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}


def synchronize(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_inputs(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str, seed: int = 0,
                grad: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v, dO of ``shape``, standard normal in ``dtype``; q, k, v require grad if ``grad``."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(tuple(shape), device=device, generator=g, dtype=dtype) for _ in range(4))
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v, do


def cuda_attention_inputs(batch: int, heads: int, n: int, d: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """q, k, v (requiring grad) and dO of shape (batch, heads, n, d) on the current GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, do


def attention_flops(batch: int, heads: int, n: int, d: int, causal: bool, pass_: str) -> float:
    """Matmul FLOPs of one pass of attention over (batch, heads, n, d) queries and keys."""
    if pass_ not in _PASS_FACTOR:
        raise ValueError(f"unknown pass {pass_!r}; expected one of {', '.join(PASSES)}")
    forward = 4.0 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    return forward * _PASS_FACTOR[pass_]


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Attention the obvious way: the N_q x N_k scores are materialised."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # S = Q K^T / sqrt(d)
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)  # key j > query i
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def sdpa_backend(name: str):
    """A context in which torch SDPA runs only the named backend (it raises where that one cannot)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name not in SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend {name!r}; expected one of {', '.join(SDPA_BACKENDS)}")
    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   backend: str | None = None) -> torch.Tensor:
    """torch SDPA; forced to one backend when ``backend`` is given."""
    if backend is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with sdpa_backend(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
