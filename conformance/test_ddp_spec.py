"""Data-parallel spec cases (``conformance/ddp_spec.py``) against ``--target``, per flavour.

Also: torch's DistributedDataParallel (``conformance.adapters.torch_ddp``) passes every
case, which shows the cases accept a correct implementation; and this project's own
wrappers state their bad-input errors.
"""

from __future__ import annotations

import pytest

from conformance import ddp_spec
from conformance.ddp_flavours import FLAVOURS

pytestmark = pytest.mark.distributed

# The bucketed flavour runs each case with several small buckets and with one bucket.
BUCKET_SIZES_MB = {"individual": (None,), "bucketed": (1e-4, 100.0), "ddp2026": (None,)}
TORCH_DDP = "conformance.adapters.torch_ddp"


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    return request.param


@pytest.mark.parametrize("case", list(ddp_spec.CASES))
def test_spec_case(case, flavour, target):
    for bucket_size_mb in BUCKET_SIZES_MB[flavour]:
        ddp_spec.run_case(case, target.spec, flavour, bucket_size_mb)


@pytest.mark.capability("suite: ddp known-good target (torch DDP)")
@pytest.mark.parametrize("case", list(ddp_spec.CASES))
def test_torch_ddp_passes_the_spec_cases(case):
    for flavour in FLAVOURS:
        for bucket_size_mb in BUCKET_SIZES_MB[flavour]:
            ddp_spec.run_case(case, TORCH_DDP, flavour, bucket_size_mb)


# --- impl's own API contract: bad input is a clear error ---------------------------------


def _needs_impl(target):
    if target.spec != "impl":
        pytest.skip("checks impl's own wrappers' errors; runs with the default target")


@pytest.mark.parametrize("bad, error, words", [
    (0, ValueError, "positive"),
    (-1.5, ValueError, "positive"),
    (float("nan"), ValueError, "finite"),
    (float("inf"), ValueError, "finite"),
    ("25", TypeError, "str"),
    (True, TypeError, "bool"),
])
def test_impl_bucketed_rejects_a_bad_bucket_size(target, bad, error, words):
    _needs_impl(target)
    import torch

    from impl.ddp import BucketedDDP

    with pytest.raises(error, match="bucket_size_mb") as info:
        BucketedDDP(torch.nn.Linear(2, 2), bucket_size_mb=bad)
    assert words in str(info.value)


@pytest.mark.parametrize("name", ["NaiveDDP", "FlatDDP", "OverlappedIndividualDDP", "BucketedDDP"])
def test_impl_wrappers_reject_a_non_module_and_a_missing_process_group(target, name):
    _needs_impl(target)
    import torch
    import torch.distributed as dist

    import impl.ddp

    cls = getattr(impl.ddp, name)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        cls(lambda x: x)
    if not dist.is_initialized():  # the test process never joins a process group
        with pytest.raises(RuntimeError, match="init_process_group"):
            cls(torch.nn.Linear(2, 2))
