"""Self-checks of the data-parallel spec: torch's DistributedDataParallel passes every case
(the cases accept a correct implementation), and impl's wrappers state their bad-input
errors.  Not part of any target's report."""

from __future__ import annotations

import pytest

from conformance.laws.ddp import spec as ddp_spec
from conformance.laws.ddp.flavours import FLAVOURS

pytestmark = pytest.mark.distributed

TORCH_DDP = "conformance.adapters.torch_ddp"


@pytest.mark.parametrize("case", list(ddp_spec.CASES))
def test_torch_ddp_passes_the_spec_cases(case):
    for flavour in FLAVOURS:
        for bucket_size_mb in ddp_spec.BUCKET_SIZES_MB[flavour]:
            ddp_spec.run_case(case, TORCH_DDP, flavour, bucket_size_mb)


# --- impl's own API contract: bad input is a clear error ---------------------------------


@pytest.mark.parametrize("bad, error, words", [
    (0, ValueError, "positive"),
    (-1.5, ValueError, "positive"),
    (float("nan"), ValueError, "finite"),
    (float("inf"), ValueError, "finite"),
    ("25", TypeError, "str"),
    (True, TypeError, "bool"),
])
def test_impl_bucketed_rejects_a_bad_bucket_size(bad, error, words):
    import torch

    from impl.ddp import BucketedDDP

    with pytest.raises(error, match="bucket_size_mb") as info:
        BucketedDDP(torch.nn.Linear(2, 2), bucket_size_mb=bad)
    assert words in str(info.value)


@pytest.mark.parametrize("name", ["NaiveDDP", "FlatDDP", "OverlappedIndividualDDP", "BucketedDDP"])
def test_impl_wrappers_reject_a_non_module_and_a_missing_process_group(name):
    import torch
    import torch.distributed as dist

    import impl.ddp

    cls = getattr(impl.ddp, name)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        cls(lambda x: x)
    if not dist.is_initialized():  # the test process never joins a process group
        with pytest.raises(RuntimeError, match="init_process_group"):
            cls(torch.nn.Linear(2, 2))
