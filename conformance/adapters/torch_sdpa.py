"""torch.nn.functional.scaled_dot_product_attention as a known-good attention target.

    pytest conformance properties --target conformance.adapters.torch_sdpa

The ``pytorch`` flavour hands out the Function (the ``triton`` flavour is not offered: SDPA
is not a Triton kernel).  O comes from SDPA
(whichever backend torch picks: flash, memory-efficient, cuDNN or math) and its backward
is SDPA's own, through autograd.  SDPA does not return the logsumexp, so L is computed
alongside from the materialised scores in float32 and saved as the one tensor of shape
q.shape[:-1].  Inputs are validated by the adapter (SDPA itself raises RuntimeErrors from
deep inside for bad shapes).  ``is_causal`` in SDPA is top-left aligned, the same
convention as ours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from impl.attention.validation import validate_attention_inputs
from impl.attention.reference import attention_scores

NOTE = "L is not returned by SDPA; this adapter computes it alongside from the materialised scores"


class SDPAAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None):
        # SDPA reports bad shapes as RuntimeErrors from deep inside; an adapter checks first.
        validate_attention_inputs(
            q, k, v, is_causal, scale, dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64), max_head_dim=256
        )
        with torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=bool(is_causal), scale=scale)
        with torch.no_grad():
            work = torch.float64 if q.dtype == torch.float64 else torch.float32
            lse = torch.logsumexp(attention_scores(q.to(work), k.to(work), bool(is_causal), scale), dim=-1)
        ctx.graph = (q_, k_, v_, o)
        ctx.save_for_backward(lse)
        return o.detach()

    @staticmethod
    def backward(ctx, grad_o):
        q_, k_, v_, o = ctx.graph
        dq, dk, dv = torch.autograd.grad(o, (q_, k_, v_), grad_o, retain_graph=True)  # gradcheck calls backward repeatedly
        return dq, dk, dv, None, None


def get_flashattention_autograd_function_pytorch():
    return SDPAAttention


def get_flashattention_autograd_function_triton():
    # SDPA is not a Triton kernel: the Triton-only checks (the interpreter rule) do not apply,
    # and every attention law already runs against it under the pytorch flavour.
    raise NotImplementedError("SDPA is not a Triton kernel; it is checked under the pytorch flavour")
