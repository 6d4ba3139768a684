"""The Gluon forward's time at CS336's short sweep points (batch 1, one head) for each split of
the keys (split-KV), beside SDPA flash's: does ``_forward_splits`` pick the best count?
Microseconds per call as the sweep takes them (``measure.median_ms``: do_bench's median, L2
flushed before each call; where its memset keeps the GPU behind the host this is device time,
the combine included; on a host slower than the memset some rows read 2-10 x their kernels,
erratically: then read the ``--kernels`` table), medians of ``--rounds`` measurements, the
order shuffled each round.

    PYTHONPATH=. python perf/scripts/gluon_forward_splits.py [--seq 256 512 1024 2048 4096] [--rounds 5]

Each count is forced by replacing ``flash_gluon._forward_splits`` and building a fresh plan;
counts above the key tiles are skipped.  "picked" is the count the plan's heuristic gives.
The last column is the largest |O - O_ref| of any count's call (O_ref: SDPA in float32), a
check that each forced plan still computes attention (the laws are the real one).

``--train`` times flash as the sweep's forward pass does (inputs requiring grad, autograd
recording: SDPA then returns L too) and adds a column "Function": our training forward
(``FlashAttentionGluon``) on the heuristic's plan, the call the sweep times.  ``--pdl-ab``
adds each count with its combine launched plainly, not as the forward's programmatic
dependent (``flash_gluon.COMBINE_PDL`` off; with it on, the plan still launches plainly where
the forward's grid fills more than half the SMs).  ``--kernels``
adds a table of each kernel's device time per call (torch.profiler, the L2 flushed before
each call as do_bench does), so that a count's time splits into the forward, the combine and
what lies between them.
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
from perf.lib.measure import kernel_us_per_call, median_ms
from perf.lib.workloads import cuda_attention_inputs

COUNTS = (1, 2, 4, 8, 16)


def timed_us(fn) -> float:
    fn()  # builds the plan (and compiles) outside the timing
    return median_ms(fn, "cuda", warmup_ms=10, rep_ms=25) * 1e3


def forced(splits, pdl, measure):
    """``measure()`` with every new forward plan cut into ``splits`` splits, its combine
    launched as the forward's programmatic dependent or not (``pdl``)."""
    heuristic, pdl_default = fg._forward_splits, fg.COMBINE_PDL
    fg._forward_splits = lambda items, key_tiles, device, head_dim=None: splits
    fg.COMBINE_PDL = pdl
    fg._PLANS.clear()
    try:
        return measure()
    finally:
        fg._forward_splits, fg.COMBINE_PDL = heuristic, pdl_default
        fg._PLANS.clear()


def forward_us(q, k, v, causal, splits, pdl, errors: list) -> float:
    """The time; ``errors`` gets the largest |O - O_ref| of the call (the reference in float32)."""
    def measure():
        o, _ = fg.flash_forward(q, k, v, causal)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        errors.append((o.float() - ref).abs().max().item())
        return timed_us(lambda: fg.flash_forward(q, k, v, causal))
    return forced(splits, pdl, measure)


def label(variant) -> str:
    splits, pdl = variant
    return f"{splits} split{'s' * (splits > 1)}" + ("" if pdl or splits == 1 else ", no PDL")


def flash_call(q, k, v, causal):
    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def flushed(fn):
    """``fn`` after the L2 flush do_bench runs before each call (Triton's own buffer and clear)."""
    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    return lambda: (driver.clear_cache(cache), fn())


def kernels_row(label, fn) -> str:
    per_kernel = kernel_us_per_call(flushed(fn), calls=50)
    cells = [f"{name[:48]} {us:.2f}" for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])
             if "Fill" not in name and "fill" not in name]
    return f"| {label} | " + "; ".join(cells) + " |"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train", action="store_true", help="flash as the sweep's training forward; a Function column")
    p.add_argument("--kernels", action="store_true", help="a table of each kernel's device time per call")
    p.add_argument("--pdl-ab", action="store_true", help="each split count also with its combine launched plainly")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    variants = sorted([(c, True) for c in COUNTS] + ([(c, False) for c in COUNTS if c > 1] if a.pdl_ab else []),
                      key=lambda variant: (variant[0], not variant[1]))
    extra = ["Function"] if a.train else []
    print("| mask | d | N | picked | " + " | ".join(label(v) for v in variants)
          + "".join(f" | {e}" for e in extra) + " | flash | max abs O error (ours, any count) |")
    print("|---|---:|---:|---:|" + "---:|" * (len(variants) + 2 + len(extra)))
    kernel_rows = []
    shuffle = random.Random(0)
    for causal in (True, False):
        for d in (64, 128):
            for n in a.seq:
                q_, k_, v_, _ = cuda_attention_inputs(1, 1, n, d)  # requiring grad
                q, k, v = (t.detach() for t in (q_, k_, v_))
                flash = flash_call(*((q_, k_, v_) if a.train else (q, k, v)), causal)
                cfg = fg.FORWARD_CONFIGS[d]
                key_tiles = triton.cdiv(n, cfg.block_n)
                items = triton.cdiv(n, cfg.block_m)
                picked = fg._forward_splits(items, key_tiles, q.device, head_dim=d)
                if causal and cfg.block_n % cfg.block_m:
                    picked = 1
                here = [(c, pdl) for c, pdl in variants
                        if c <= key_tiles and not (causal and c > 1 and cfg.block_n % cfg.block_m)]
                function = lambda: fg.FlashAttentionGluon.apply(q_, k_, v_, causal)  # noqa: E731
                times = {variant: [] for variant in here + extra + ["flash"]}
                errors = []
                for _ in range(a.rounds):
                    order = list(times)
                    shuffle.shuffle(order)
                    for variant in order:
                        if variant == "flash":
                            times[variant].append(timed_us(flash))
                        elif variant == "Function":
                            times[variant].append(timed_us(function))
                        else:
                            times[variant].append(forward_us(q, k, v, causal, *variant, errors))
                cells = [f"{statistics.median(times[variant]):.2f}" if variant in times else ""
                         for variant in variants + extra]
                point = f"{'causal' if causal else 'full'} | {d} | {n}"
                print(f"| {point} | {picked} | " + " | ".join(cells)
                      + f" | {statistics.median(times['flash']):.2f} | {max(errors):.1e} |", flush=True)
                if a.kernels:
                    for c, pdl in here:
                        kernel_rows.append(forced(c, pdl, lambda: kernels_row(
                            f"{point} | {label((c, pdl))}", lambda: fg.flash_forward(q, k, v, causal))))
                    kernel_rows.append(kernels_row(f"{point} | flash", flash))
    if kernel_rows:
        print("\nDevice time per call by kernel (us; torch.profiler, 50 calls, L2 flushed before each):\n")
        print("| mask | d | N | splits | kernels |")
        print("|---|---:|---:|---|---|")
        print("\n".join(kernel_rows), flush=True)


if __name__ == "__main__":
    main()
