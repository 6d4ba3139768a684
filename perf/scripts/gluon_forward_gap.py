"""Where a short training forward's do_bench time goes: the GPU's timeline inside do_bench's loop
(L2 flush, start event, the call, end event), ours beside SDPA flash's, at CS336's short points.

    PYTHONPATH=. python perf/scripts/gluon_forward_gap.py [--seq 128 1024] [--iters 40]

Per iteration, from one torch.profiler trace (CUDA activity: kernels on the GPU's clock, and the
runtime and driver calls that launched them on the host's, both on the profiler's clock):

    flush       the flush kernel's device time
    lead        how long after the flush's launch call the call's first launch call came (host;
                from a second trace that records the host's calls too, which slows them)
    idle        first kernel's start minus the flush's end: how long the GPU waited for the call
    kernels     the call's kernels, first start to last end
    timed       what do_bench reads: idle (if any) + kernels, up to the end event

Medians over the iterations; beside them do_bench's own median for each (the sweep's measure).
A call whose lead exceeds the flush is host-bound in the sweep, whatever its kernels take.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from impl.attention.flash_gluon import FlashAttentionGluon
from perf.lib.measure import median_ms
from perf.lib.workloads import cuda_attention_inputs

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel", "cudaLaunchKernelExC")


def loop(fn, grads, iters):
    """do_bench's timed loop body, ``iters`` times."""
    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        for t in grads:
            t.grad = None
        driver.clear_cache(cache)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def timeline(fn, grads, iters, cpu: bool):
    """Medians of the columns over ``iters`` iterations; with ``cpu`` the profiler also records
    the host's calls (the launch calls among them, for ``lead``), which slows the host."""
    loop(fn, grads, 5)  # warm
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cpu else [ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        timed = loop(fn, grads, iters)
    kernels, launches = [], []
    for e in prof.events():
        r = e.time_range
        if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name:
            kernels.append((r.start, r.end, e.name))
        elif any(e.name.startswith(n) for n in LAUNCHES):
            launches.append(r.start)
    kernels.sort()
    launches.sort()
    # Each iteration's first kernel is the flush (a fill); a kernel's launch call is the n-th launch
    rows = []
    flush_at = [i for i, k in enumerate(kernels) if "fill" in k[2].lower() or "zero" in k[2].lower()]
    for j, i in enumerate(flush_at):
        nxt = flush_at[j + 1] if j + 1 < len(flush_at) else len(kernels)
        call = kernels[i + 1:nxt]
        if not call or i >= len(launches):
            continue
        flush = kernels[i]
        lead = launches[i + 1] - launches[i] if len(launches) == len(kernels) else float("nan")
        rows.append(dict(flush=flush[1] - flush[0], lead=lead, idle=call[0][0] - flush[1],
                         kernels=call[-1][1] - call[0][0]))
    med = {k: statistics.median(r[k] for r in rows) for k in ("flush", "lead", "idle", "kernels")}
    med["timed"] = statistics.median(timed)
    med["n"] = len(rows)
    return med


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, nargs="+", default=[128, 256, 1024])
    p.add_argument("--iters", type=int, default=40)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    print("| mask | d | N | impl | flush | lead | idle | kernels | timed (traced) | do_bench | iterations |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for causal in (True, False):
        for d in (64, 128):
            for n in a.seq:
                q, k, v, _ = cuda_attention_inputs(1, 1, n, d)
                grads = [q, k, v]

                def flash():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                ours = lambda: FlashAttentionGluon.apply(q, k, v, causal)  # noqa: E731
                for name, fn in (("gluon", ours), ("flash", flash), ("gluon", ours), ("flash", flash)):
                    m = timeline(fn, grads, a.iters, cpu=False)
                    lead = timeline(fn, grads, a.iters, cpu=True)["lead"]
                    bench = median_ms(fn, "cuda", warmup_ms=10, rep_ms=25, grad_to_none=grads) * 1e3
                    print(f"| {'causal' if causal else 'full'} | {d} | {n} | {name} | {m['flush']:.1f} | "
                          f"{lead:.1f} | {m['idle']:.1f} | {m['kernels']:.1f} | {m['timed']:.1f} | {bench:.1f} | "
                          f"{m['n']} |", flush=True)


if __name__ == "__main__":
    main()
