"""One block of ring attention: our FlashAttention-2 forward and backward on a key block.

    block_forward(q, k, v, is_causal, scale)                -> (O, L)
    block_backward(q, k, v, o, lse, grad_o, is_causal, scale) -> (dQ, dK, dV)

No autograd: the ring's own autograd.Function calls these.  The kernel is the Triton one
when the tensors are on CUDA (and 16- or 32-bit), the PyTorch tiles otherwise (the CPU,
where Triton would need the slow interpreter, and float64).  Both return O in the input
dtype and L = natural-log logsumexp in float32 (float64 for float64 inputs), and both
apply ``is_causal`` top-left aligned within the block: the ring calls it only on blocks
whose queries and keys start at the same position (the diagonal blocks).

``block_backward`` takes the *final* O and L of the query rows (merged over every block),
so D = rowsum(dO * O) and P = exp(S - L) are the whole row's: the block's dQ, dK, dV are
then exactly its share of the full gradients.
"""

from __future__ import annotations

import torch

from impl.attention import flash_pytorch


def uses_triton(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and t.dtype in (torch.float16, torch.bfloat16, torch.float32)


def block_forward(q, k, v, is_causal: bool, scale: float):
    if uses_triton(q):
        from impl.attention import flash_triton

        return flash_triton._forward(q, k, v, bool(is_causal), scale)
    return flash_pytorch.flash_forward(q, k, v, bool(is_causal), scale)


def block_backward(q, k, v, o, lse, grad_o, is_causal: bool, scale: float):
    if uses_triton(q):
        from impl.attention import flash_triton

        return flash_triton._backward(q, k, v, o, lse, grad_o, bool(is_causal), scale)
    return flash_pytorch.flash_backward(q, k, v, o, lse, grad_o, bool(is_causal), scale)
