"""The Triton and Gluon FlashAttention kernels as torch custom ops, so that torch.compile
treats a call as one opaque node (with a fake implementation for shapes and strides) rather
than tracing into the autograd.Function and the kernels' Python launchers, which Dynamo and
Inductor cannot follow (an InductorError from a compile worker).

    attention(q, k, v, is_causal, flavour, scale=None) -> O

``flavour`` is "triton" or "gluon".  Under torch.compile, ``attention`` calls the forward op
through ``_FlashAttentionOps``, an autograd.Function that Dynamo traces, whose backward calls
the backward op.  Outside torch.compile it calls the flavour's own autograd.Function: the
dispatcher's cost is paid only where compile needs it.
The fake outputs have the kernels' real strides (dense in the input's memory order; L
contiguous), as Inductor lays out what follows on them.
With the C++ launcher on and the call graphs off (the defaults: ``LLM_SYSTEMS_NATIVE_LAUNCH``
not ``0``, ``LLM_SYSTEMS_CALL_GRAPHS`` not ``1``) the ops' CUDA kernels are C++
(``enable_native_ops``; ``impl/attention/csrc/native_launch.cpp``): a repeated Gluon
signature runs its plan's C++ pass without Python.
"""

from __future__ import annotations

import math

import torch

from impl.attention import call_graphs, native_launch, triton_launch
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


# The ops carry no autograd kernel of their own: torch.library.custom_op's (a Python kernel at the
# Autograd key) costs 5-8 us of dispatch a call, paid twice a layer in a compiled step; the
# autograd.Function below gives the formula instead, and Dynamo traces it into the graph.
_LIB = torch.library.Library(NAMESPACE, "DEF")
_LIB.define("flash_forward(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, str flavour) -> (Tensor, Tensor)")
_LIB.define("flash_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor grad_o, bool is_causal, "
            "float scale, str flavour) -> (Tensor, Tensor, Tensor)")
# The eager model path's op: its kernels (an autograd node and a forward-only one) are C++ and registered with
# the ops' C++ kernels (``enable_native_ops``); until then it has none, and ``attention`` does not call it.
_LIB.define("flash_attention(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, str flavour) -> Tensor")


def _forward(q, k, v, is_causal, scale, flavour):
    o, lse = _kernels(flavour).flash_forward(q, k, v, is_causal, scale)
    return o, lse


def _backward(q, k, v, o, lse, grad_o, is_causal, scale, flavour):
    grad_o = grad_o if grad_o.dtype == q.dtype else grad_o.to(q.dtype)
    dq, dk, dv = _kernels(flavour).flash_backward(q, k, v, o, lse, grad_o, is_causal, scale)
    return dq, dk, dv


_LIB.impl("flash_forward", _forward, "CompositeExplicitAutograd")
_LIB.impl("flash_backward", _backward, "CompositeExplicitAutograd")


def _pass_of(kind, flavour, tensors, is_causal, scale) -> int:
    return _kernels(flavour).native_pass(kind, tensors, is_causal, scale) if flavour == "gluon" else -1


def _forward_native(q, k, v, is_causal, scale, flavour):
    """The C++ CUDA kernel's fallback: the outputs, and the C++ pass that served them or -1."""
    o, lse = _forward(q, k, v, is_causal, scale, flavour)
    return o, lse, _pass_of("fwd", flavour, (q, k, v), is_causal, scale)


def _backward_native(q, k, v, o, lse, grad_o, is_causal, scale, flavour):
    dq, dk, dv = _backward(q, k, v, o, lse, grad_o, is_causal, scale, flavour)
    return dq, dk, dv, _pass_of("bwd", flavour, (q, k, v, o, lse, grad_o), is_causal, scale)


def _stream_for_pass(device_index: int):
    """The C++ kernels' check before a bound pass: None (the call goes to Python) while the call
    graphs are on, read per call as the plans read it; else ``fast_stream``'s answer."""
    return None if call_graphs.ENABLED else triton_launch.fast_stream(device_index)


def enable_native_ops() -> bool:
    """With the C++ launcher on and the call graphs off (both the defaults): the ops' CUDA
    kernels in C++.  A call whose Gluon plan has a C++ pass then runs it with no Python but
    its stream check (``_stream_for_pass``); any other call runs the Python kernel above,
    through C++.  ``flash_attention`` gets its C++ autograd node, and ``attention`` takes it for
    the Gluon flavour in eager mode.  False (the Python kernels serve CUDA, ``attention`` calls
    the flavour's autograd.Function) where the launcher is off or could not be built, the graphs
    are on (no plan has a pass then, and the C++ kernel would only add its own call into
    Python), or there is no CUDA device (nothing to build the extension for at import)."""
    global NATIVE_OPS
    # with graphs on no plan has a pass (every call would go to Python); without CUDA nothing to serve
    if call_graphs.ENABLED or not torch.cuda.is_available():
        return False
    ext = native_launch.extension()
    if ext is None:
        return False
    ext.enable_ops(_forward_native, _backward_native, _stream_for_pass)
    NATIVE_OPS = True
    return True


def disable_native_ops() -> None:
    """The Python kernels serve CUDA again (the C++ kernels removed from the dispatcher), and
    ``attention`` calls the flavour's autograd.Function."""
    global NATIVE_OPS
    NATIVE_OPS = False
    if native_launch.built() is not None:
        native_launch.built().disable_ops()


@torch.library.register_fake(f"{NAMESPACE}::flash_forward")
def _(q, k, v, is_causal, scale, flavour):
    return _dense_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::flash_backward")
def _(q, k, v, o, lse, grad_o, is_causal, scale, flavour):
    return _dense_like(q), _dense_like(k), _dense_like(v)


@torch.library.register_fake(f"{NAMESPACE}::flash_attention")
def _(q, k, v, is_causal, scale, flavour):
    return _dense_like(q)


flash_forward = torch.ops.llm_systems.flash_forward.default
flash_backward = torch.ops.llm_systems.flash_backward.default
flash_attention = torch.ops.llm_systems.flash_attention.default
NATIVE_OPS = False  # whether the C++ kernels (flash_attention's node among them) are registered
enable_native_ops()


class _FlashAttentionOps(torch.autograd.Function):
    """O, L through the forward op; dQ, dK, dV through the backward op (saved: q, k, v, O, L)."""

    @staticmethod
    def forward(q, k, v, is_causal, scale, flavour):
        return flash_forward(q, k, v, is_causal, scale, flavour)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, is_causal, scale, flavour = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale, ctx.flavour = is_causal, scale, flavour
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, lse, grad_o, ctx.is_causal, ctx.scale, ctx.flavour)
        return dq, dk, dv, None, None, None


def attention(q, k, v, is_causal: bool, flavour: str, scale: float | None = None):
    """O of attention(q, k, v): through the custom ops under torch.compile; in eager mode the Gluon
    flavour through ``flash_attention`` where its C++ node is registered (``NATIVE_OPS``: no
    Python frame in either direction of a repeated call), else the flavour's autograd.Function."""
    if torch.compiler.is_compiling():
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        # Dynamo traces no autograd.Function given one tensor twice: a view makes each input its own
        k = k.view_as(k) if k is q else k
        v = v.view_as(v) if v is q or v is k else v
        return _FlashAttentionOps.apply(q, k, v, bool(is_causal), scale, flavour)[0]
    if NATIVE_OPS and flavour == "gluon" and isinstance(q, torch.Tensor):
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        return flash_attention(q, k, v, bool(is_causal), scale, flavour)
    module = _kernels(flavour)
    fn = module.FlashAttentionTriton if flavour == "triton" else module.FlashAttentionGluon
    return fn.apply(q, k, v, is_causal, scale)
