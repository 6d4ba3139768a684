"""Does the d 128 full forward pay for its last, partly filled round of work items?  The
persistent forward gives each of P programs (one an SM) ceil(items / P) items when full
attention's items are all alike, so at B4 H16 N4096 (2048 items of 128 query rows, P = 132)
the busiest programs walk 16 items where the average is 15.52.

Times the training forward (inputs requiring grad, no backward) at N 4096, d 128, full, batch 1,
for head counts whose items fill 15 rounds or just spill into a 16th, and at B4 H16, ours beside
cuDNN's and flash's through SDPA, in rounds whose order rotates (do_bench medians).  If rounds
decide our time, t / ceil(items / P) stays level across the heads while t / items does not.

    PYTHONPATH=. python perf/scripts/forward_wave_tail.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
import triton

from perf.bench.attention import make_impl
from perf.lib.measure import median_ms
from perf.lib.workloads import cuda_attention_inputs

IMPLS = ("gluon", "sdpa_cudnn", "sdpa_flash")
SHAPES = ((1, 60), (1, 61), (1, 62), (1, 64), (1, 66), (4, 16))  # (batch, heads) at N 4096, d 128
N, D, BLOCK_M = 4096, 128, 128


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          "SMs", programs, flush=True)
    impls = {name: make_impl(name) for name in IMPLS}
    print(f"| B | H | items | rounds | impl | forward us | us / round | us / item x {programs} |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|")
    for batch, heads in SHAPES:
        q, k, v, _ = cuda_attention_inputs(batch, heads, N, D)
        items = batch * heads * math.ceil(N / BLOCK_M)
        rounds = math.ceil(items / programs)
        times = {name: [] for name in IMPLS}
        for r in range(args.rounds):
            order = IMPLS[r % 3:] + IMPLS[:r % 3]
            for name in order:
                fn = lambda f=impls[name].fn: f(q, k, v, False)  # noqa: E731
                with impls[name].context():
                    times[name].append(median_ms(fn, "cuda", warmup_ms=5, rep_ms=40, grad_to_none=[q, k, v]) * 1e3)
        for name in IMPLS:
            us = statistics.median(times[name])
            print(f"| {batch} | {heads} | {items} | {rounds} | {name} | {us:.1f} | {us / rounds:.2f} "
                  f"| {us / items * programs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
