"""The Triton and Gluon FlashAttention kernels as torch custom ops, so that torch.compile
treats a call as one opaque node (with a fake implementation for shapes and strides) rather
than tracing into the autograd.Function and the kernels' Python launchers, which Dynamo and
Inductor cannot follow (an InductorError from a compile worker).

    flash_attention(q, k, v, is_causal, scale, flavour) -> O       autograd through the ops

``flavour`` is "triton" or "gluon".  Outside torch.compile, callers use the autograd.Function
directly (``attention`` below): the dispatcher's cost is paid only where compile needs it.
The fake outputs have the kernels' real strides (dense in the input's memory order; L
contiguous), as Inductor lays out what follows on them.
"""

from __future__ import annotations

import math

import torch

from impl.attention.host_plans import dense_strides_like

NAMESPACE = "llm_systems"


def _kernels(flavour: str):
    if flavour == "triton":
        from impl.attention import flash_triton as module
    elif flavour == "gluon":
        from impl.attention import flash_gluon as module
    else:
        raise ValueError(f"unknown attention flavour {flavour!r}; expected 'triton' or 'gluon'")
    return module


def _dense_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, dense_strides_like(t), dtype=t.dtype, device=t.device)


@torch.library.custom_op(f"{NAMESPACE}::flash_forward", mutates_args=())
def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
                  flavour: str) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _kernels(flavour).flash_forward(q, k, v, is_causal, scale)
    return o, lse


@flash_forward.register_fake
def _(q, k, v, is_causal, scale, flavour):
    return _dense_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::flash_backward", mutates_args=())
def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   grad_o: torch.Tensor, is_causal: bool, scale: float,
                   flavour: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _kernels(flavour).flash_backward(q, k, v, o, lse, grad_o.to(q.dtype), is_causal, scale)
    return dq, dk, dv


@flash_backward.register_fake
def _(q, k, v, o, lse, grad_o, is_causal, scale, flavour):
    return _dense_like(q), _dense_like(k), _dense_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale, flavour = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.is_causal, ctx.scale, ctx.flavour = is_causal, scale, flavour


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = flash_backward(q, k, v, o, lse, grad_o, ctx.is_causal, ctx.scale, ctx.flavour)
    return dq, dk, dv, None, None, None


flash_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, is_causal: bool, flavour: str, scale: float | None = None):
    """O of attention(q, k, v): through the custom op under torch.compile, else the flavour's
    autograd.Function (no dispatcher in the way of a short eager call)."""
    if torch.compiler.is_compiling():
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        return flash_forward(q, k, v, bool(is_causal), scale, flavour)[0]
    module = _kernels(flavour)
    fn = module.FlashAttentionTriton if flavour == "triton" else module.FlashAttentionGluon
    return fn.apply(q, k, v, is_causal, scale)
