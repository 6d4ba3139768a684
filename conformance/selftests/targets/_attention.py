"""A correct attention Function that runs ``before()`` first: each fixture target breaks there."""

from __future__ import annotations


def attention_with(before):
    from impl.attention.flash_pytorch import FlashAttentionPytorch

    class Breaking:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            before()
            return FlashAttentionPytorch.apply(q, k, v, is_causal)

    return Breaking
