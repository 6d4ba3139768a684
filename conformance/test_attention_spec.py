"""Attention spec cases: the CS336 contract and this project's API contract."""

import pytest

from conformance import attention_spec as spec

FLAVOURS = ("pytorch", "triton")


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    return request.param


@pytest.fixture
def attn(target, flavour):
    return target.attention(flavour)


@pytest.mark.parametrize("check", spec.CS336, ids=lambda f: f.__name__)
def test_cs336_contract(check, attn, device):
    check(attn, device)


@pytest.mark.parametrize("check", spec.API, ids=lambda f: f.__name__)
def test_api_contract(check, attn, device):
    try:
        check(attn, device)
    except spec._NeedsGPU as exc:
        pytest.skip(str(exc))


def test_api_cpu_tensor_to_triton_without_interpreter(target):
    target.attention("triton")  # not offered -> reported as such
    spec.cpu_tensor_to_triton_without_interpreter(target.spec or "impl")
