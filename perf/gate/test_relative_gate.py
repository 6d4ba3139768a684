"""Gate checks that compare ours with torch measured beside it, in one run on one GPU.

Where the host bounds the time (short sequences; a small model's step) absolute medians
move with the machine: the same code moved by up to 64 % between H100 runs (perf/GATE.md).
Torch's own kernels measured in the same process, interleaved with ours, move with it, so
the ratio holds still enough to refuse a regression of our launch path or of the kernels
at these shapes.

- short sequences: host time of one forward+backward call of our Triton attention over
  SDPA's (PyTorch's choice of backend), bf16, B=8, H=16, N=512, d=64, causal;
- model step: a small GPT's AdamW step (bf16 autocast, batch 4 x 512) with our Triton
  attention over the same step with SDPA, median of interleaved rounds.

The bounds: below, from the ratios measured on an H100 when the gate was set, and the
ratios before the launch plans they must refuse.  CUDA only: on the CPU both are skipped, and say so.
"""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.nn.functional as F

# ours / SDPA, each bound between the spread of the real code and the planted regression it
# must refuse (perf/gate/planted/no_launch_plans.py: no launch plans, every call validated and
# launched through Triton's Python path).  Measured on H100s (perf/GATE.md):
#   short sequences, host us per forward+backward: real 1.2, 1.40, 1.51 (single 20-call sweep
#   samples 0.9 to 2.4); planted 4.53; before the launch plans 2.4.
#   small GPT step, 4 x 512: real 1.03, 1.086, 1.153; planted 1.501; before the plans 1.76.
SHORT_HOST_RATIO_BOUND = 2.0  # host us per forward+backward call
MODEL_STEP_RATIO_BOUND = 1.3  # small GPT step, batch 4 x 512


def _needs_cuda(device):
    if device.type != "cuda":
        pytest.skip("needs a GPU: compares GPU times of ours and torch's")


def _assert_ratio_within(what: str, times: dict[str, list[float]], bound: float, unit: str, scale: float = 1.0):
    """Median of our rounds over the median of torch's, at most ``bound``; printed either way."""
    ours, theirs = statistics.median(times["triton"]) * scale, statistics.median(times["sdpa"]) * scale
    print(f"{what}: ours {ours:.2f} {unit}, SDPA {theirs:.2f} {unit}, ratio {ours / theirs:.3f} (bound {bound}); "
          f"rounds {times}")
    assert ours / theirs <= bound, (
        f"{what}: ours {ours:.2f} {unit} is {ours / theirs:.3f}x SDPA's {theirs:.2f} {unit} (bound {bound}x)")


def test_short_sequence_host_time_within_bound_of_sdpa(device):
    _needs_cuda(device)
    from impl.attention.flash_triton import FlashAttentionTriton
    from perf.lib import measure
    from perf.lib.workloads import make_inputs

    q, k, v, do = make_inputs((8, 16, 512, 64), torch.bfloat16, device, seed=0)
    variants = {"triton": lambda: FlashAttentionTriton.apply(q, k, v, True).backward(do),
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)}
    times = {name: [] for name in variants}
    for fn in variants.values():
        fn()
    for _ in range(7):  # interleaved rounds
        for name, fn in variants.items():
            times[name].append(measure.host_us_per_call(fn, device, calls=50))
    _assert_ratio_within("host time per forward+backward call, B8 H16 N512 d64 causal", times,
                         SHORT_HOST_RATIO_BOUND, "us")


def test_model_step_within_bound_of_sdpa(device):
    _needs_cuda(device)
    from impl.models import gpt
    from perf.bench.model import make_optimizer, make_step, set_attention
    from perf.lib import measure

    model = gpt.make_gpt("small", device=device, context_length=512)
    optimizer = make_optimizer(model)
    times = {"triton": [], "sdpa": []}
    steps = {}
    for name in times:
        set_attention(model, name)
        steps[name] = make_step(model, "step", "bf16", 4, 512, optimizer)
        for _ in range(3):
            steps[name]()
    for _ in range(5):  # interleaved rounds of 4 steps
        for name in times:
            set_attention(model, name)
            times[name] += measure.time_calls(steps[name], device, warmup=1, steps=4)
    _assert_ratio_within("small GPT step, bf16, 4 x 512", times, MODEL_STEP_RATIO_BOUND, "ms", scale=1e3)
