"""The Gluon forward's time at CS336's short sweep points (batch 1, one head) for each split of
the keys (split-KV), beside SDPA flash's: does ``_forward_splits`` pick the best count?
Microseconds per call as the sweep takes them (``measure.median_ms``: do_bench's median, L2
flushed before each call; at these points its memset keeps the GPU behind the host, so this is
device time, the combine included), medians of ``--rounds`` measurements, the order shuffled each round.

    PYTHONPATH=. python perf/scripts/gluon_forward_splits.py [--seq 256 512 1024 2048 4096] [--rounds 5]

Each count is forced by replacing ``flash_gluon._forward_splits`` and building a fresh plan;
counts above the key tiles are skipped.  "picked" is the count the plan's heuristic gives.
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention import flash_gluon as fg
from perf.lib.measure import median_ms
from perf.lib.workloads import cuda_attention_inputs

COUNTS = (1, 2, 4, 8, 16)


def timed_us(fn) -> float:
    fn()  # builds the plan (and compiles) outside the timing
    return median_ms(fn, "cuda", warmup_ms=10, rep_ms=25) * 1e3


def forward_us(q, k, v, causal, splits) -> float:
    heuristic = fg._forward_splits
    fg._forward_splits = lambda items, key_tiles, device: splits
    fg._PLANS.clear()
    try:
        return timed_us(lambda: fg.flash_forward(q, k, v, causal))
    finally:
        fg._forward_splits = heuristic
        fg._PLANS.clear()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    print("| mask | d | N | picked | " + " | ".join(f"{c} split{'s' * (c > 1)}" for c in COUNTS) + " | flash |")
    print("|---|---:|---:|---:|" + "---:|" * (len(COUNTS) + 1))
    shuffle = random.Random(0)
    for causal in (True, False):
        for d in (64, 128):
            for n in a.seq:
                q, k, v, _ = cuda_attention_inputs(1, 1, n, d)
                q, k, v = (t.detach() for t in (q, k, v))
                cfg = fg.FORWARD_CONFIGS[d]
                key_tiles = triton.cdiv(n, cfg.block_n)
                items = triton.cdiv(n, cfg.block_m)
                picked = fg._forward_splits(items, key_tiles, q.device)
                if causal and cfg.block_n % cfg.block_m:
                    picked = 1
                counts = [c for c in COUNTS if c <= key_tiles and not (causal and c > 1 and cfg.block_n % cfg.block_m)]
                times = {c: [] for c in counts}
                times["flash"] = []
                for _ in range(a.rounds):
                    order = counts + ["flash"]
                    shuffle.shuffle(order)
                    for c in order:
                        if c == "flash":
                            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                                times[c].append(timed_us(lambda: F.scaled_dot_product_attention(q, k, v,
                                                                                               is_causal=causal)))
                        else:
                            times[c].append(forward_us(q, k, v, causal, c))
                cells = [f"{statistics.median(times[c]):.2f}" if c in times else "" for c in COUNTS]
                print(f"| {'causal' if causal else 'full'} | {d} | {n} | {picked} | " + " | ".join(cells)
                      + f" | {statistics.median(times['flash']):.2f} |", flush=True)


if __name__ == "__main__":
    main()
