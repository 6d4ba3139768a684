"""Attention spec cases: the CS336 contract and this project's API contract, by flavour.

The PyTorch flavour's CS336 tier leaves out causal masking (the handout lets it ignore
``is_causal``); those checks run in its API tier.  See ``conformance/laws/attention/spec.py``.
"""

import pytest

from conformance.laws.attention.hopper import gluon_not_run_reason
from conformance.verdicts import EnvironmentRefusal
from conformance.laws.attention import spec
from conformance.laws.attention.laws import fresh_compile_caches

FLAVOURS = ("pytorch", "triton", "gluon")


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    return request.param


@pytest.fixture
def attn(target, flavour, device):
    fn = target.attention(flavour)
    if flavour == "gluon" and (reason := gluon_not_run_reason(device)):
        pytest.skip(EnvironmentRefusal(reason).reason)  # a Hopper GPU only: elsewhere "not run here"
    return fn


def _by_flavour(tier):
    """(flavour, check) pairs; parametrizing ``flavour`` directly overrides the fixture."""
    return [pytest.param(fl, check, id=f"{fl}-{check.__name__}") for fl in FLAVOURS for check in tier[fl]]


@pytest.mark.parametrize("flavour, check", _by_flavour(spec.CS336))
def test_cs336_contract(check, attn, device):
    fresh_compile_caches()  # each case judged on its own, as the laws judge theirs
    check(attn, device)


@pytest.mark.parametrize("flavour, check", _by_flavour(spec.API))
def test_api_contract(check, attn, device):
    fresh_compile_caches()
    check(attn, device)


def test_api_cpu_tensor_to_triton_without_interpreter(target):
    target.attention("triton")  # not offered -> reported as such
    spec.cpu_tensor_to_triton_without_interpreter(target.spec or "impl")
