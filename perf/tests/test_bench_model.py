"""GPT model benchmarks tracked by pytest-benchmark (``pytest perf --benchmark-compare``).

On CUDA: the small model (about 100 M parameters), batch 4 x 512 tokens, bf16 autocast;
forward, forward+backward and a full AdamW step, with SDPA, our Triton attention and
eager attention.  On the CPU: the tiny model with eager, SDPA and our PyTorch-tiled
attention, so CI keeps the harness working (CPU numbers are not compared).
"""

import pytest
import torch

from impl.models import gpt
from perf.bench import model as bench_model
from perf.lib.workloads import synchronize

ATTENTIONS = ("sdpa", "triton", "eager", "pytorch")


def _plan(device):
    if device.type == "cuda":
        return dict(size="small", precision="bf16", batch=4, context=512, rounds=10, warmup_rounds=3)
    return dict(size="tiny", precision="fp32", batch=2, context=32, rounds=2, warmup_rounds=1)


@pytest.mark.parametrize("mode", ("forward", "forward_backward", "step"))
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_model_benchmark(benchmark, device, attention, mode):
    if attention == "triton" and device.type != "cuda":
        pytest.skip("needs a GPU: the Triton interpreter makes a model step take seconds "
                    "(the CPU sweep in test_bench_attention covers our Triton kernels)")
    if attention == "pytorch" and device.type == "cuda":
        pytest.skip("PyTorch-tiled attention is benchmarked at the CPU's tiny size only (a Python loop over tiles)")
    plan = _plan(device)
    model = gpt.make_gpt(plan["size"], device=device)
    bench_model.set_attention(model, attention)
    optimizer = bench_model.make_optimizer(model) if mode == "step" else None
    step = bench_model.make_step(model, mode, plan["precision"], plan["batch"], plan["context"], optimizer)
    benchmark.group = f"model {plan['size']} {plan['precision']} {mode} {plan['batch']}x{plan['context']}"
    benchmark.extra_info.update(size=plan["size"], attention=attention, mode=mode, precision=plan["precision"],
                                batch=plan["batch"], context=plan["context"], device=str(device),
                                params=gpt.count_parameters(model))
    if device.type == "cuda":
        benchmark.extra_info["gpu"] = torch.cuda.get_device_name(device)

    def run():
        synchronize(device)
        step()
        synchronize(device)

    before = [p.detach().clone() for p in model.parameters()]
    benchmark.pedantic(run, rounds=plan["rounds"], warmup_rounds=plan["warmup_rounds"], iterations=1)
    # The benchmarked step did its work: gradients after backward, new weights after a step.
    if mode == "forward_backward":
        assert all(p.grad is not None for p in model.parameters())
    if mode == "step":
        assert any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))


def test_the_interleaved_step_script_rotates_backends_and_reports_each_against_the_first(tmp_path):
    """perf/scripts/model_step_interleaved.py on the CPU (a tiny model): one row per backend,
    every round timed for each, the first backend's ratio to itself exactly 1."""
    import json

    from perf.scripts import model_step_interleaved

    rows = model_step_interleaved.main(["--device", "cpu", "--size", "tiny", "--attention", "sdpa", "eager",
                                        "--context", "16", "--rounds", "3", "--steps", "1", "--warmup", "1",
                                        "--compile", "off", "--precision", "fp32", "--out", str(tmp_path)])
    assert [r["attention"] for r in rows] == ["sdpa", "eager"]
    assert rows[0]["ratio_to_first"] == 1.0 and rows[1]["ratio_to_first"] > 0
    assert all(len(r["rounds_ms"]) == 3 and r["median_ms"] > 0 for r in rows)
    written = json.loads((tmp_path / "model_interleaved.json").read_text())
    assert written["device"] == "cpu" and len(written["rows"]) == 2
    assert (tmp_path / "model_interleaved.md").read_text().count("\n") == 4
