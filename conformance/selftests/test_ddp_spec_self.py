"""Self-checks of the data-parallel spec: torch's DistributedDataParallel passes every case
(the cases accept a correct implementation), impl's wrappers state their bad-input
errors, and they step a module with nothing to train.  Not part of any target's report."""

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


def _step_with_nothing_to_train(ctx, name, bucket_size_mb):
    """Every parameter frozen: wrap, a synced step, a second one; grads stay None."""
    import torch

    import impl.ddp

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for p in net.parameters():
        p.requires_grad_(False)
    cls = getattr(impl.ddp, name)
    wrapped = cls(net, bucket_size_mb=bucket_size_mb) if name == "BucketedDDP" else cls(net)
    for _ in range(2):
        wrapped.on_train_batch_start()
        wrapped(torch.randn(2, 3, requires_grad=True)).sum().backward()
        wrapped.finish_gradient_synchronization()
    return [p.grad is None for p in net.parameters()]


@pytest.mark.parametrize("name", ["NaiveDDP", "FlatDDP", "OverlappedIndividualDDP", "BucketedDDP"])
def test_impl_wrappers_step_a_module_with_nothing_to_train(name):
    from conformance.harness import run_on_ranks

    for result in run_on_ranks(_step_with_nothing_to_train, 2, name, 1.0, timeout=60, device="cpu"):
        assert all(result), result
