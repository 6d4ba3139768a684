"""A target as a student's adapters often are: right inside the course contract, narrower
beyond it.  Its PyTorch attention handles the handout's (B, N, d) inputs and ignores the
softmax scale argument it does not have; every check of the wider API that needs 4-D
inputs or ragged lengths fails, while every contract check passes."""

from __future__ import annotations


def get_flashattention_autograd_function_pytorch():
    from impl.attention.flash_pytorch import FlashAttentionPytorch

    class ThreeDimensionalOnly:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            if q.dim() != 3:
                raise ValueError(f"expected (batch, seq, d) inputs, got {q.dim()}-D")
            if q.shape[-2] % 16 or k.shape[-2] % 16:
                raise ValueError("sequence lengths must be multiples of the 16-row tile")
            return FlashAttentionPytorch.apply(q, k, v, is_causal)

    return ThreeDimensionalOnly
