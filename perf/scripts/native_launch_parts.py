"""Where a C++ pass's host time goes: per launch of the Gluon backward plan at the GPT-small
shape (B4 H12 N256 d64, causal, bf16), the host microseconds of ``launch`` with its grid
zeroed (the parameters filled and the tensor maps encoded, no driver call) and with its real
grid, and how many maps it encodes; then the whole pass.  Needs a Hopper GPU.

    PYTHONPATH=. python perf/scripts/native_launch_parts.py

Each figure: the median over 7 rounds of ``host_and_wall_us_per_call``'s host time
(perf/results/2026-11-28-h200-native-ops/: the driver's launch is about 5 us of each).
"""

from __future__ import annotations

import math
import os
import statistics

os.environ["LLM_SYSTEMS_NATIVE_LAUNCH"] = "1"  # read when the plans are built, below
os.environ["LLM_SYSTEMS_CALL_GRAPHS"] = "0"  # read at import: a plan takes a C++ pass only with graphs off

import torch  # noqa: E402

from impl.attention import flash_gluon as fg  # noqa: E402
from impl.attention import native_launch  # noqa: E402
from perf.lib.measure import host_and_wall_us_per_call  # noqa: E402

B, H, N, D = 4, 12, 256, 64
SCALE = 1 / math.sqrt(D)


def host_us(fn, calls: int) -> float:
    return statistics.median(host_and_wall_us_per_call(fn, calls)[0] for _ in range(7))


def main():
    ext = native_launch.extension()
    x = torch.randn(B, N, 3 * H * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.view(B, N, H, D).transpose(1, 2) for t in x.split(H * D, dim=-1))
    o, lse = fg.flash_forward(q, k, v, True, SCALE)
    do = torch.randn_like(o)
    inputs = (q, k, v, o, lse, do)
    fg.flash_backward(*inputs, True, SCALE)  # builds the plan and registers its pass
    plan = fg._PLANS.plans[fg._backward_key(inputs, True, SCALE)]
    assert plan.native is not None, "the plan took no C++ pass"
    stream = torch.cuda.current_stream().cuda_stream
    named = [*inputs, *native_launch.run_pass(plan.native, stream, inputs)]
    named += [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in plan.scratch]
    for step, where in plan.steps:
        tensors = [named[i] for i in where]
        spec = native_launch.template(step)
        no_grid = ext.register_launch(spec[0], [0, 1, 1], *spec[2:])  # launch() returns before the driver call
        maps = sum(slot[0] == native_launch.DESC for slot in spec[-1])
        print(f"{step.kernel.fn.__name__:34s} maps {maps}  "
              f"fill + encode {host_us(lambda: ext.launch(no_grid, stream, tensors), 2000):6.2f} us  "
              f"whole launch {host_us(lambda: ext.launch(step.native, stream, tensors), 300):6.2f} us", flush=True)
    whole = host_us(lambda: ext.run_pass(plan.native, stream, inputs), 300)
    print(f"{'the pass (allocations and launches)':34s} {whole:6.2f} us")


if __name__ == "__main__":
    main()
