"""The training forward at CS336's short points (batch 1, one head, N 128-512, d 64 and 128),
three readings a call, for impl's model call (``gluon_model``: the custom op's C++ node), the
protocol's Function (``gluon``) and SDPA flash, in 9 rounds whose order rotates:

- do_bench's median as the sweep takes it (L2 flushed before each call, 2 ms warm-up, 4 ms);
- host microseconds per call (200 calls, no synchronisation inside the loop);
- device microseconds with the GPU held behind the host (``measure.device_ms_held_behind``: the
  flush and a GPU sleep of three times the call's host time before each start event), so that
  the events time the kernels and not the host's issue;

and how many of 100 further calls took the forward plan's Python path (0: the bound C++ pass).
Where do_bench's reading sits above the device time, the host's issue decided it.

    PYTHONPATH=. python perf/scripts/short_forward_readings.py
"""

from __future__ import annotations

import statistics

import torch
import triton

from impl.attention import flash_gluon as fg
from perf.bench.attention import make_impl
from perf.lib.measure import device_ms_held_behind, host_us_per_call, median_ms
from perf.lib.workloads import cuda_attention_inputs

ROUNDS = 9
IMPLS = ("gluon_model", "gluon", "sdpa_flash")  # perf.bench.attention's implementations of those names


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    plan_calls = [0]
    python_path = fg._ForwardPlan.__call__

    def counted(self, *args):
        plan_calls[0] += 1
        return python_path(self, *args)

    fg._ForwardPlan.__call__ = counted
    impls = {name: make_impl(name) for name in IMPLS}
    names = list(IMPLS)
    print("| mask | d | N | impl | do_bench us (median of rounds) | host us/call | device us (GPU behind) "
          "| plan-path calls of 100 |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for causal in (True, False):
        for d in (64, 128):
            for n in (128, 256, 512):
                q, k, v, _ = cuda_attention_inputs(1, 1, n, d)
                readings = {name: ([], [], []) for name in names}
                for r in range(ROUNDS):
                    for name in names[r % 3:] + names[:r % 3]:
                        fn = lambda f=impls[name].fn: f(q, k, v, causal)  # noqa: E731
                        bench, host, device = readings[name]
                        with impls[name].context():
                            fn()
                            bench.append(median_ms(fn, "cuda", warmup_ms=2, rep_ms=4, grad_to_none=[q, k, v]) * 1e3)
                            host.append(host_us_per_call(fn, "cuda", calls=200))
                            device.append(device_ms_held_behind(fn, "cuda", host_us=host[-1], reps=200,
                                                                grad_to_none=[q, k, v]) * 1e3)
                for name in names:
                    plan_calls[0] = 0
                    with impls[name].context():
                        for _ in range(100):
                            impls[name].fn(q, k, v, causal)
                    torch.cuda.synchronize()
                    bench, host, device = (statistics.median(x) for x in readings[name])
                    print(f"| {'causal' if causal else 'full'} | {d} | {n} | {name} | {bench:.2f} | {host:.2f} "
                          f"| {device:.2f} | {plan_calls[0]} |", flush=True)


if __name__ == "__main__":
    main()
