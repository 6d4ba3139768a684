"""The benchmarks the GPU gate compares against a stored per-GPU baseline.

On CUDA: our Triton FlashAttention-2 at the anchor shape B=1, H=16, N=16384, d=64, bf16,
causal, forward and forward+backward, 5 calls a round.  At N=4096 a call is ~0.1 ms and
bound by the host's launch overhead: medians of the same code moved by up to 64% from run
to run on an H100, too much for any threshold; at N=16384 a call is 1.2 to 5 ms of GPU
work (perf/GATE.md has the measured spread).
On the CPU the same code runs at a tiny size under the interpreter, so CI keeps it working;
CPU numbers are not compared.
"""

import pytest
import torch

from perf.lib.workloads import make_inputs, synchronize

FLAVOURS = ("forward", "forward_backward")


@pytest.mark.parametrize("passes", FLAVOURS)
def test_gate_flash_triton(benchmark, device, passes):
    from impl.attention.flash_triton import FlashAttentionTriton

    if device.type == "cuda":
        shape, dtype, rounds, iterations = (1, 16, 16384, 64), torch.bfloat16, 20, 5
    else:
        shape, dtype, rounds, iterations = (1, 2, 48, 32), torch.float32, 2, 1
    q, k, v, do = make_inputs(shape, dtype, device, seed=0)
    benchmark.extra_info.update(shape=list(shape), dtype=str(dtype), causal=True, device=str(device))
    if device.type == "cuda":
        benchmark.extra_info["gpu"] = torch.cuda.get_device_name(device)

    def run():
        for _ in range(iterations):
            o = FlashAttentionTriton.apply(q, k, v, True)
            if passes == "forward_backward":
                o.backward(do)
        synchronize(device)

    benchmark.pedantic(run, rounds=rounds, warmup_rounds=2 if device.type == "cuda" else 0, iterations=1)


@pytest.mark.parametrize("passes", FLAVOURS)
def test_gate_flash_gluon(benchmark, device, passes):
    """The Gluon flavour at the same anchor shape; a Hopper GPU only (no interpreter runs Gluon)."""
    from conformance.laws.attention.hopper import gluon_not_run_reason

    reason = gluon_not_run_reason(device)
    if reason:
        pytest.skip(f"not run here: {reason}")
    from impl.attention.flash_gluon import FlashAttentionGluon

    q, k, v, do = make_inputs((1, 16, 16384, 64), torch.bfloat16, device, seed=0)
    benchmark.extra_info.update(shape=[1, 16, 16384, 64], dtype="torch.bfloat16", causal=True, device=str(device),
                                gpu=torch.cuda.get_device_name(device))

    def run():
        for _ in range(5):
            o = FlashAttentionGluon.apply(q, k, v, True)
            if passes == "forward_backward":
                o.backward(do)
        synchronize(device)

    benchmark.pedantic(run, rounds=20, warmup_rounds=2, iterations=1)
