"""Where the time goes at short sequences: host time per call, the Python functions that
take it, and the device time of each kernel, for our Triton attention and torch SDPA.

    python perf/scripts/attention_host_overhead.py [--out DIR] [--seq 128 512] [--calls 200]
        [--before MODULE] [--impls triton triton_run sdpa gluon gluon_new_maps]

Variants of ours: ``triton`` (launch plans, compiled kernels launched directly),
``triton_run`` (the same plans, every launch through Triton's JITFunction.run), and, with
``--before impl.attention.some_module``, an older flash_triton kept as a module (the
comparison in one run).  On Hopper: ``gluon`` (the Gluon flavour, its tensor maps cached by
address as a training loop that reuses its allocations would hit them) and
``gluon_new_maps`` (the cache emptied before every call: each tensor map encoded anew).

Host time: ``perf_counter`` around ``calls`` launches with no synchronisation inside the
loop (what the CPU spends issuing the work), then one synchronise; ``rounds`` rounds that
interleave the variants (a slow phase of the host hits all of them), the median reported.  If host time per call
exceeds the device time per call, the pass is launch-bound and the GPU idles between
kernels.  ``cProfile`` of the backward launches names the Python functions responsible;
the torch profiler gives each kernel's device time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from perf.lib.measure import host_and_wall_us_per_call, kernel_us_per_call
from perf.lib.workloads import cuda_attention_inputs


def _inputs(n, batch=8, heads=16, d=64, dtype=torch.bfloat16):
    return cuda_attention_inputs(batch, heads, n, d, dtype)


def python_profile(fn, calls, lines) -> str:
    """cProfile of ``calls`` calls, the ``lines`` functions with the most time of their own."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--seq", nargs="+", type=int, default=[128, 512])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", default=None, help="module of an older flash_triton to compare with")
    p.add_argument("--impls", nargs="+", default=["triton", "triton_run", "sdpa"])
    a = p.parse_args()
    import importlib

    from impl.attention import triton_launch
    from impl.attention.flash_triton import FlashAttentionTriton

    def direct(on):
        def fn(q, k, v):
            triton_launch.DIRECT = on
            return FlashAttentionTriton.apply(q, k, v, True)
        return fn

    def gluon(new_maps):
        from impl.attention.flash_gluon import FlashAttentionGluon

        def fn(q, k, v):
            triton_launch.DIRECT = True
            if new_maps:
                triton_launch._ENCODED.clear()
            return FlashAttentionGluon.apply(q, k, v, True)
        return fn

    known = {"triton": lambda: direct(True), "triton_run": lambda: direct(False),
             "sdpa": lambda: lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             "gluon": lambda: gluon(False), "gluon_new_maps": lambda: gluon(True)}
    impls = {name: known[name]() for name in a.impls}
    if a.before:
        before = importlib.import_module(a.before).FlashAttentionTriton
        impls["before"] = lambda q, k, v: before.apply(q, k, v, True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for n in a.seq:
        q, k, v, do = _inputs(n)
        graphs = {name: attn(q, k, v) for name, attn in impls.items()}  # compiles; one graph each for backward

        def passes(name):
            attn, o = impls[name], graphs[name]
            fwd = lambda: attn(q, k, v)  # noqa: E731
            grad = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
            if name == "gluon_new_maps":
                def bwd():
                    triton_launch._ENCODED.clear()
                    return grad()
                return fwd, bwd
            return fwd, grad

        # Rounds interleave the variants, so a slow phase of the host hits all of them; medians.
        host = {name: {"forward": [], "backward": []} for name in impls}
        for _ in range(a.rounds):
            for name in impls:
                fwd, bwd = passes(name)
                fwd()  # sets this variant's DIRECT flag, under which its backward then runs
                host[name]["forward"].append(host_and_wall_us_per_call(fwd, a.calls)[0])
                host[name]["backward"].append(host_and_wall_us_per_call(bwd, a.calls)[0])
        for name in impls:
            fwd, bwd = passes(name)
            fwd()
            row = {"forward_host_us": statistics.median(host[name]["forward"]),
                   "backward_host_us": statistics.median(host[name]["backward"]),
                   "forward_host_us_rounds": [round(x, 1) for x in host[name]["forward"]],
                   "backward_host_us_rounds": [round(x, 1) for x in host[name]["backward"]],
                   "forward_kernels_us": kernel_us_per_call(fwd), "backward_kernels_us": kernel_us_per_call(bwd)}
            if name in ("triton", "gluon"):
                row["backward_profile"] = python_profile(bwd, a.calls, 25)
                row["forward_profile"] = python_profile(fwd, a.calls, 15)
            result[f"{name} N={n}"] = row
            print(name, n, {k: v for k, v in row.items() if "profile" not in k}, flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_overhead.json").write_text(json.dumps(result, indent=1))
    for key, row in result.items():
        if isinstance(row, dict) and "backward_profile" in row:
            (out / f"profile_{key.replace(' ', '_').replace('=', '')}.txt").write_text(row["forward_profile"] + "\n\n" + row["backward_profile"])


if __name__ == "__main__":
    main()
