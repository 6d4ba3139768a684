"""Attention benchmarks tracked by pytest-benchmark (``pytest perf --benchmark-compare``).

On CUDA: B=1, H=16, N=4096, d=64, bf16, causal; forward and forward+backward; our Triton
FlashAttention-2 against SDPA's flash and cuDNN backends and eager attention.  Each round
runs several calls between CUDA syncs, so launch jitter averages out.
On the CPU the same code runs at a tiny size (Triton under its interpreter), so CI keeps
the harness working; CPU numbers mean nothing and are not compared.
"""

import pytest
import torch

from perf.bench import attention as bench_attention
from perf.lib.workloads import synchronize

IMPLS = ("triton", "sdpa_flash", "sdpa_cudnn", "eager")
PASSES = ("forward", "forward_backward")


def _plan(device):
    if device.type == "cuda":
        return dict(case=bench_attention.Case(seq=4096, d=64, dtype="bf16", heads=16), rounds=20, warmup_rounds=3, calls=5)
    return dict(case=bench_attention.Case(seq=48, d=16, dtype="fp32", heads=2), rounds=2, warmup_rounds=0, calls=1)


@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("impl_name", IMPLS)
def test_attention_benchmark(benchmark, device, impl_name, pass_):
    if impl_name == "sdpa_cudnn" and device.type != "cuda":
        pytest.skip("needs a GPU: SDPA's cuDNN backend runs on CUDA only")
    plan = _plan(device)
    case = plan["case"]
    impl = bench_attention.make_impl(impl_name)
    benchmark.group = f"attention {pass_} {case.dtype} B={case.batch} H={case.heads} N={case.seq} d={case.d}"
    benchmark.extra_info.update(impl=impl_name, pass_=pass_, shape=[case.batch, case.heads, case.seq, case.d],
                                dtype=case.dtype, causal=True, calls_per_round=plan["calls"], device=str(device))
    if device.type == "cuda":
        benchmark.extra_info["gpu"] = torch.cuda.get_device_name(device)
    with impl.context():
        q, k, v, do = case.inputs(device)
        step = bench_attention.pass_fn(impl, pass_, q, k, v, do)
        step()  # compile, pick algorithms; also proves the backend takes these inputs

        def run():
            synchronize(device)
            for _ in range(plan["calls"]):
                for t in (q, k, v):
                    t.grad = None
                step()
            synchronize(device)

        benchmark.pedantic(run, rounds=plan["rounds"], warmup_rounds=plan["warmup_rounds"], iterations=1)
    if pass_ == "forward_backward":
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_tiny_sweep_measures_every_case_and_pass(device):
    """The sweep itself, at a tiny size: one row per (impl, case, pass), each with a time."""
    result = bench_attention.sweep([32], [16], ["fp32"], ["triton", "eager", "sdpa"], device=device, heads=2,
                                   warmup_ms=1, rep_ms=2, log=None)
    assert result.complete
    assert len(result.rows) == 3 * len(bench_attention.PASSES)
    for row in result.rows:
        assert row["status"] == "ok", row
        assert row["ms"] > 0 and row["tflops"] > 0
        assert (row["peak_mib"] is not None and row["peak_mib"] > 0) == (device.type == "cuda")
    seen = {(r["impl"], r["seq"], r["pass"]) for r in result.rows}
    assert len(seen) == len(result.rows)
