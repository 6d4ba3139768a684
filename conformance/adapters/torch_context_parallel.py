"""torch's experimental context-parallel ring attention as a known-good target.

    pytest properties/test_context_parallel.py conformance/spec/test_context_parallel.py \\
        --target conformance.adapters.torch_context_parallel --device cuda

The ring comes from ``torch.distributed.tensor.experimental._context_parallel``: its
``_scaled_dot_product_ring_flash_attention`` (fp16/bf16) or ``..._efficient_attention``
(fp32) forward and their backwards, on a one-dimensional DeviceMesh over the group.  torch
lays a causal sequence out head-tail when load balancing is on (rank r holds chunks r and
2W-1-r: our "zigzag") and contiguously when it is off; the adapter sets the option per call,
for causal calls only (torch refuses load balancing without the causal mask, where the key
order does not matter: every query sees every key).

CUDA only: those kernels are the flash / memory-efficient SDPA kernels, which torch builds
for CUDA; on a machine without a GPU every entry point raises ``NeedsHardware``.  The
layout helpers and the merge are this project's (torch exposes no stable function for them).
torch rotates K/V with functional collectives (an all-gather by default, or all-to-all),
which the communication probe does not observe: the K/V-traffic law reads "not applicable",
and the causal-work and overlap laws, which count torch matmuls, "not run here" (the
blocks are fused SDPA kernels).  It checks no shards across ranks (the extra "clear errors
for bad shards").
"""

from __future__ import annotations

import torch

import impl
from conformance.verdicts import NeedsHardware

REASON = ("a GPU: torch's context-parallel ring attention runs the CUDA flash / memory-efficient SDPA kernels "
          "(no CPU implementation)")


def _need_cuda(*tensors):
    if not torch.cuda.is_available() or any(t.device.type != "cuda" for t in tensors):
        raise NeedsHardware(REASON)


def _cp():
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    return cp


def _mesh(group):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group if group is not None else dist.group.WORLD, "cuda")


def _as_4d(t):
    return t.reshape(-1, 1, *t.shape[-2:]) if t.dim() != 4 else t


class TorchRingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, group=None, layout="contiguous", scale=None):
        _need_cuda(q, k, v)
        if layout not in ("contiguous", "zigzag"):
            raise ValueError(f"unknown layout {layout!r}")
        cp = _cp()
        cp._cp_options.enable_load_balance = layout == "zigzag" and bool(is_causal)
        mesh = _mesh(group)
        q4, k4, v4 = (_as_4d(t.contiguous()) for t in (q, k, v))
        if q.dtype == torch.float32:
            out, lse, seed, offset = cp._scaled_dot_product_ring_efficient_attention(
                mesh, q4, k4, v4, None, True, 0.0, bool(is_causal), scale=scale)
            ctx.extra = ("efficient", seed, offset)
        else:
            out, lse, cq, ck, mq, mk, seed, offset, _ = cp._scaled_dot_product_ring_flash_attention(
                mesh, q4, k4, v4, 0.0, bool(is_causal), scale=scale)
            ctx.extra = ("flash", cq, ck, mq, mk, seed, offset)
        lse = lse[..., : q4.shape[-2]].float()
        ctx.save_for_backward(q4, k4, v4, out, lse.reshape(q.shape[:-1]))
        ctx.meta = (mesh, bool(is_causal), scale, q.shape)
        return out.reshape(q.shape)

    @staticmethod
    def backward(ctx, grad_o):
        cp = _cp()
        q4, k4, v4, out, lse = ctx.saved_tensors
        mesh, is_causal, scale, shape = ctx.meta
        g4 = _as_4d(grad_o.contiguous().to(q4.dtype))
        lse4 = lse.reshape(q4.shape[:-1])
        if ctx.extra[0] == "efficient":
            _, seed, offset = ctx.extra
            dq, dk, dv, _ = cp._scaled_dot_product_ring_efficient_attention_backward(
                mesh, g4, q4, k4, v4, None, out, lse4, seed, offset, 0.0, [True, True, True, False], is_causal,
                scale=scale)
        else:
            _, cq, ck, mq, mk, seed, offset = ctx.extra
            dq, dk, dv = cp._scaled_dot_product_ring_flash_attention_backward(
                mesh, g4, q4, k4, v4, out, lse4, cq, ck, mq, mk, 0.0, is_causal, seed, offset, scale=scale)[:3]
        return dq.reshape(shape), dk.reshape(shape), dv.reshape(shape), None, None, None, None


def get_ring_attention_autograd_function():
    if not torch.cuda.is_available():
        raise NeedsHardware(REASON)
    return TorchRingAttention


merge_attention_partials = impl.merge_attention_partials
context_parallel_shard = impl.context_parallel_shard
context_parallel_unshard = impl.context_parallel_unshard
context_parallel_positions = impl.context_parallel_positions
