"""A target whose parameters mix DTensor and plain tensors gets an optimizer that steps
them (``conformance.laws.optimizers``): torch's foreach kernels, its default on CUDA, refuse
such a list, and torch's own FSDP2 and tensor parallelism give one.  Checked on one gloo
rank, with foreach forced on as CUDA would have it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from conformance.harness import run_on_ranks
from conformance.laws import optimizers

pytestmark = pytest.mark.distributed


def _params():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(0)
    matrix = torch.nn.Parameter(distribute_tensor(torch.randn(4, 3, generator=g), mesh, [Replicate()]))
    gain = torch.nn.Parameter(torch.randn(3, generator=g))
    for p in (matrix, gain):
        p.grad = torch.ones_like(p)
    return matrix, gain


def step_mixed(ctx, optimizer_name: str, via_build: bool):
    matrix, gain = _params()
    cls = {"SGD": torch.optim.SGD, "AdamW": torch.optim.AdamW}[optimizer_name]
    try:
        opt = (optimizers.build(cls, [matrix, gain], lr=0.1) if via_build
               else cls([matrix, gain], lr=0.1, foreach=True))
        opt.step()
    except RuntimeError as exc:
        return f"raised: {exc}"
    return [matrix.full_tensor().detach().clone(), gain.detach().clone(), opt.defaults.get("foreach")]


def step_plain(ctx, optimizer_name: str):
    g = torch.Generator().manual_seed(0)
    matrix = torch.nn.Parameter(torch.randn(4, 3, generator=g))
    gain = torch.nn.Parameter(torch.randn(3, generator=g))
    for p in (matrix, gain):
        p.grad = torch.ones_like(p)
    cls = {"SGD": torch.optim.SGD, "AdamW": torch.optim.AdamW}[optimizer_name]
    opt = optimizers.build(cls, [matrix, gain], lr=0.1)
    opt.step()
    return [matrix.detach().clone(), gain.detach().clone(), opt.defaults.get("foreach")]


@pytest.mark.parametrize("optimizer_name", ["SGD", "AdamW"])
def test_torch_foreach_refuses_a_mixed_list_and_the_laws_optimizer_steps_it_right(optimizer_name):
    refused = run_on_ranks(step_mixed, 1, optimizer_name, False, device="cpu", timeout=120)[0]
    assert isinstance(refused, str) and "mixed" in refused, f"torch stepped a mixed list with foreach: {refused}"
    stepped = run_on_ranks(step_mixed, 1, optimizer_name, True, device="cpu", timeout=120)[0]
    assert not isinstance(stepped, str), stepped
    assert stepped[2] is False, "a mixed list must get the per-tensor loop: CUDA's default foreach refuses it"
    plain = run_on_ranks(step_plain, 1, optimizer_name, device="cpu", timeout=120)[0]
    for got, want in zip(stepped, plain[:2]):
        assert torch.equal(got, want)
    assert plain[2] is None, "a list of plain tensors keeps torch's default"
