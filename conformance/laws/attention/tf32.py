"""TF32: float32 range, 10 explicit mantissa bits.  What a float32 ``tl.dot`` computes by
default on NVIDIA GPUs (``input_precision="tf32"``), and cuBLAS with
``torch.backends.cuda.matmul.allow_tf32``: each operand is rounded to TF32, the products
are summed in float32.

The CS336 handout's tests compare a float32 Triton kernel with tolerances of 1e-2, which
TF32 dots meet; the contract tier accepts them (``laws.tf32_dots_accepted``) against a
yardstick of their own: eager attention whose every matrix product, forward and backward,
rounds its operands to TF32 first.  Emulated by rounding the bits, so the same yardstick
holds on a CPU, where no TF32 hardware exists.
"""

from __future__ import annotations

import torch

from impl.attention.reference import causal_mask, default_scale


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 to the nearest TF32 value (ties away from zero, as ``cvt.rna.tf32.f32``);
    inf and NaN unchanged."""
    bits = x.contiguous().view(torch.int32)
    rounded = ((bits + 0x1000) & -0x2000).view(torch.float32)  # 13 low mantissa bits dropped
    return torch.where(torch.isfinite(x), rounded, x)


class _Tf32Matmul(torch.autograd.Function):
    """a @ b with both operands rounded to TF32; the backward's products likewise."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return round_to_tf32(a) @ round_to_tf32(b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        g = round_to_tf32(grad)
        return g @ round_to_tf32(b).transpose(-1, -2), round_to_tf32(a).transpose(-1, -2) @ g


def tf32_attention(q, k, v, is_causal=False, scale=None):
    """(O, L) as ``attention_reference`` computes them from float32 inputs, every product in TF32."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    s = _Tf32Matmul.apply(q, k.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return _Tf32Matmul.apply(torch.softmax(s, dim=-1), v), lse
