"""FlashAttention laws, checked against the target's PyTorch and Triton implementations.

Every law in ``conformance.laws.attention.laws.LAWS`` runs under Hypothesis for each flavour
the target offers; a flavour it lacks is reported "not offered".  On the CPU the Triton
flavour runs under the interpreter (fp32 and fp16; bf16 needs a GPU).
"""

import pytest
import torch

from conformance.laws.attention.laws import LAWS, check_law

FLAVOURS = ("pytorch", "triton")


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    return request.param


@pytest.fixture
def attn(target, flavour):
    return target.attention(flavour)


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.name)
def test_attention_law(law, attn, flavour, device):
    if law.flavours and flavour not in law.flavours:
        pytest.skip(f"law {law.name} applies to the {'/'.join(law.flavours)} flavour only")
    check_law(law, attn, device, flavour)


def test_bf16_is_checked_where_it_can_run(device):
    """On a GPU the strategies must draw bf16 for both flavours (a green GPU run that skipped
    bf16 would be a false green); on the CPU the Triton interpreter cannot run bf16 tl.dot."""
    from conformance.laws.attention.strategies import budget_for

    if device.type != "cuda":
        pytest.skip("needs a GPU: the Triton interpreter's bf16 tl.dot is broken (triton issue 11584), so bf16 is drawn on CUDA")
    for flavour in FLAVOURS:
        assert torch.bfloat16 in budget_for(flavour, device).dtypes
