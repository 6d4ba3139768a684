"""Attention spec cases: the CS336 contract and this project's API contract, by flavour.

The PyTorch flavour's CS336 tier leaves out causal masking (the handout lets it ignore
``is_causal``); those checks run in its API tier.  See ``conformance/attention_spec.py``.
"""

import pytest

from conformance import attention_spec as spec

FLAVOURS = ("pytorch", "triton")


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    return request.param


@pytest.fixture
def attn(target, flavour):
    return target.attention(flavour)


def _by_flavour(tier):
    """(flavour, check) pairs; parametrizing ``flavour`` directly overrides the fixture."""
    return [pytest.param(fl, check, id=f"{fl}-{check.__name__}") for fl in FLAVOURS for check in tier[fl]]


@pytest.mark.parametrize("flavour, check", _by_flavour(spec.CS336))
def test_cs336_contract(check, attn, device):
    check(attn, device)


@pytest.mark.parametrize("flavour, check", _by_flavour(spec.API))
def test_api_contract(check, attn, device):
    try:
        check(attn, device)
    except spec._NeedsGPU as exc:
        pytest.skip(str(exc))


def test_api_cpu_tensor_to_triton_without_interpreter(target):
    target.attention("triton")  # not offered -> reported as such
    spec.cpu_tensor_to_triton_without_interpreter(target.spec or "impl")


class _IgnoresIsCausal:
    """impl's PyTorch flavour as the handout allows a student's to be: is_causal accepted, ignored."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, q, k, v, is_causal=False):
        return self.fn.apply(q, k, v, False)


@pytest.mark.capability("suite: attention spec tiers")
def test_the_cs336_tier_lets_the_pytorch_flavour_ignore_is_causal(device):
    from conformance.target import load_target

    attn = _IgnoresIsCausal(load_target("impl").attention("pytorch"))
    for check in spec.CS336["pytorch"]:
        check(attn, device)
    for check in (spec.is_causal_defaults_to_false, spec.cs336_causal_forward_backward):
        assert check in spec.API["pytorch"] and check in spec.CS336["triton"]
        with pytest.raises(AssertionError):
            check(attn, device)
