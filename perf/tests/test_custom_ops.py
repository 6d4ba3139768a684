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


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="not run here: the Triton kernels need a GPU or the interpreter (TRITON_INTERPRET=1)")
def test_one_tensor_passed_as_q_k_and_v_compiles_in_one_graph_and_matches_eager():
    """Dynamo traces no autograd.Function given one tensor twice; self-attention on x, x, x still
    compiles without a graph break, and x's gradient sums the three inputs' as in eager."""
    from impl.attention.custom_ops import attention
    from impl.attention.flash_triton import FlashAttentionTriton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(1, 2, 20, 16, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_(True)
    out = torch.compile(lambda x: attention(x, x, x, False, "triton"), fullgraph=True)(x)
    out.sum().backward()
    got, x.grad = x.grad.clone(), None
    ref = FlashAttentionTriton.apply(x, x, x, False)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(got, x.grad, rtol=0, atol=1e-6)


def test_the_compiled_paths_ops_carry_no_autograd_kernel_of_their_own():
    """torch.library.custom_op's autograd kernel (Python, at the Autograd key) costs 5-8 us of
    dispatch a call, twice a layer in a compiled step; the gradient comes from the
    autograd.Function Dynamo traces instead (perf/notes/ATTENTION_NOTES.md, ninth pass)."""
    import impl.attention.custom_ops  # noqa: F401 - defines the ops

    for op in ("llm_systems::flash_forward", "llm_systems::flash_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CompositeExplicitAutograd"), op
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(op, "Autograd"), op
