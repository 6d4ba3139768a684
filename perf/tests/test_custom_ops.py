"""The kernels as custom ops: torch.compile of a function that calls our Triton attention
traces one opaque node and matches the autograd.Function (CPU: the Triton interpreter).
The Gluon flavour shares the op and runs on Hopper only (perf/results/2026-11-27-h200-gluon-attention/)."""

import os

import pytest
import torch


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="not run here: the Triton kernels need a GPU or the interpreter (TRITON_INTERPRET=1)")
def test_compiled_call_of_the_triton_kernel_matches_eager_forward_and_backward():
    from impl.attention.custom_ops import attention
    from impl.attention.flash_triton import FlashAttentionTriton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 24, 16, generator=g).to(device).requires_grad_(True) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, True, "triton") * 2, fullgraph=True)
    out = compiled(q, k, v)
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = FlashAttentionTriton.apply(q, k, v, True) * 2
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, rtol=0, atol=1e-6)
