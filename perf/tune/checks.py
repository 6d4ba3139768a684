"""Correctness checks shared by the tuning scripts (tune_attention, attention_gpu_check).

    configured_attention(fwd_cfg, bwd_cfg)   our Triton kernels under autograd with the
                                             given tile configs (None: the defaults)
    fwd_bwd(fn, q, k, v, do, causal, scale)  O, L, dQ, dK, dV of one forward and backward
    compare_with_reference(got, ref, eager, dtype, mags)
                                             every output against the float64 reference
                                             through conformance.oracle
    probe_inputs / probe_checks              the single-key probe: one causal query row
                                             sees only key 0, so P = 1, O_0 = V_0 and
                                             dV_0 = dO_0 bit for bit (holds only if every
                                             kernel rounds scale * s alike)
"""

from __future__ import annotations

import torch


def configured_attention(fwd_cfg=None, bwd_cfg=None):
    """``fn(q, k, v, causal, scale=None)`` running our kernels with the given configs."""
    from impl.attention import flash_triton as ft

    class Configured(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            o, lse = ft.flash_forward(q, k, v, causal, scale, config=fwd_cfg)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.scale = causal, scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            return (*ft.flash_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, config=bwd_cfg), None, None)

    return lambda q, k, v, causal, scale=None: Configured.apply(q, k, v, causal, scale)


def fwd_bwd(fn, q, k, v, do, causal, scale=None) -> dict:
    """O, L, dQ, dK, dV of ``fn(q, k, v, causal, scale)``; L from its output where it
    returns (O, L), else the one saved tensor of shape q.shape[:-1]."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal, scale)
    if isinstance(out, tuple):
        o, lse = out
    else:
        o = out
        lse = [t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1]]
        assert len(lse) == 1, f"expected one saved tensor of shape {tuple(q.shape[:-1])}"
        lse = lse[0]
    o.backward(do)
    return {"O": o.detach(), "L": lse.detach(), "dQ": q.grad, "dK": k.grad, "dV": v.grad}


def compare_with_reference(got: dict, ref: dict, eager: dict, dtype, mags: dict, digits: int = 4):
    """(error/bound per output, failure messages): L must be float32, the rest ``dtype``."""
    from conformance import oracle

    ratios, failures = {}, []
    for key in ref:
        want = torch.float32 if key == "L" else dtype
        if got[key].dtype != want:
            failures.append(f"{key}: dtype {got[key].dtype}, expected {want}")
            continue
        verdict = oracle.judge(key, got[key], ref[key], eager[key], dtype=dtype, magnitude=mags[key])
        ratios[key] = round(verdict.error / max(verdict.bound, 1e-300), digits)
        if not verdict.ok:
            failures.append(verdict.message())
    return ratios, failures


def probe_inputs(dtype, d: int, n_k: int, device):
    """q (one query row), k, v (n_k keys), dO for the single-key probe, seeded by (d, n_k)."""
    g = torch.Generator(device=device).manual_seed(d * 1000 + n_k)
    q = (4 * torch.randn(2, 3, 1, d, generator=g, device=device)).to(dtype)
    k = (4 * torch.randn(2, 3, n_k, d, generator=g, device=device)).to(dtype)
    v = torch.randn(2, 3, n_k, d, generator=g, device=device).to(dtype)
    do = torch.randn(2, 3, 1, d, generator=g, device=device).to(dtype)
    return q, k, v, do


def probe_checks(o, dk, dv, v, do) -> dict:
    """What causal attention must give for a single query row, exactly."""
    return {
        "O_0 == V_0": torch.equal(o[..., 0, :], v[..., 0, :]),
        "dV_0 == dO_0": torch.equal(dv[..., 0, :], do[..., 0, :]),
        "dV_j>0 == 0": bool((dv[..., 1:, :] == 0).all()),
        "dK_j>0 == 0": bool((dk[..., 1:, :] == 0).all()),
    }
