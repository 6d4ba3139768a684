"""Where a short point of CS336's sweep (batch 1, one head, bf16) spends its time, for the
Gluon flavour and SDPA flash: the sweep's own figure (do_bench median, as
``perf.bench.attention`` takes it), the device's (profiler, kernels only) and the host's
(calls issued with nothing waiting, interleaved rounds, medians), then cProfile of the
forward and backward through the flavour's autograd.Function.

    PYTHONPATH=. python perf/scripts/gluon_sweep_host.py [--n 512 1024] [--rounds 7] [--no-profile]

Rows per shape:
    fwd / sdpa fwd          the forward with q, k, v requiring grad (the sweep's forward column)
    pair / sdpa pair        forward then backward (the sweep's "both" column)
    fwd / pair by plan      the same with the Function's C++ key look-up off (``run_bound``
                            unset for the call): the plan's key and look-up in Python
    plan fwd                ``flash_gluon.flash_forward``: the plan alone, no autograd
    op fwd                  the custom op (its C++ kernel once the call's key is bound); its
                            scale is given, so it shares the "1 launch" plan: unsplit
    fwd / pair 1 launch     the Function with the scale given (another plan), its forward
                            built unsplit: one launch, no combine
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from impl.attention import custom_ops, native_launch
from impl.attention import flash_gluon as fg
from perf.lib.measure import host_us_per_call, kernel_us_per_call
from perf.lib.workloads import cuda_attention_inputs


def variants(q, k, v, do, causal):
    def sdpa(q, k, v):  # flash forced around the whole run (main), as the sweep does, not per call
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def pair(attn):
        def run():
            attn(q, k, v).backward(do)
        return run

    ours = lambda q, k, v: fg.FlashAttentionGluon.apply(q, k, v, causal)  # noqa: E731
    # the scale given explicitly: another plan key, built (first call) with the forward unsplit
    unsplit = lambda q, k, v: fg.FlashAttentionGluon.apply(q, k, v, causal, q.shape[-1] ** -0.5)  # noqa: E731
    qd, kd, vd = (t.detach() for t in (q, k, v))
    return {"fwd": lambda: ours(q, k, v), "sdpa fwd": lambda: sdpa(q, k, v),
            "pair": pair(ours), "sdpa pair": pair(sdpa),
            "fwd by plan": _without_bound(lambda: ours(q, k, v)), "pair by plan": _without_bound(pair(ours)),
            "fwd 1 launch": lambda: unsplit(q, k, v), "pair 1 launch": pair(unsplit),
            "plan fwd": lambda: fg.flash_forward(qd, kd, vd, causal),
            "op fwd": lambda: custom_ops.flash_forward(qd, kd, vd, causal, q.shape[-1] ** -0.5, "gluon")}


def _without_bound(fn):
    """fn with the Function's C++ look-up off (the backward too: ``backward()`` returns after it)."""
    def run():
        saved = native_launch.run_bound
        native_launch.run_bound = None
        try:
            return fn()
        finally:
            native_launch.run_bound = saved
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[512, 1024])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--no-profile", action="store_true", help="skip cProfile")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        run(args)


def run(args):
    for n in args.n:
        for d, causal in ((64, True), (128, True), (64, False)):
            q, k, v, do = cuda_attention_inputs(1, 1, n, d)
            grads = (q, k, v)
            table = variants(q, k, v, do, causal)
            splits = fg._forward_splits
            for name, fn in table.items():
                fg._forward_splits = (lambda items, key_tiles, device, head_dim=None: 1) if "1 launch" in name else splits
                fn()  # builds the plans: the "1 launch" ones unsplit
            fg._forward_splits = splits
            host = {name: [] for name in table}
            for _ in range(args.rounds):
                for name, fn in table.items():
                    host[name].append(host_us_per_call(fn, "cuda", calls=200, grad_to_none=grads))
            print(f"--- B1 H1 N{n} d{d} {'causal' if causal else 'full'}: host us per call (median of {args.rounds})")
            for name, values in host.items():
                print(f"  {name:10s} {statistics.median(values):7.1f}")
            for name in ("fwd", "fwd 1 launch", "sdpa fwd", "pair", "pair 1 launch", "sdpa pair"):
                ms = do_bench(table[name], warmup=10, rep=25, grad_to_none=grads, return_mode="median")
                kernels = kernel_us_per_call(table[name])
                print(f"  {name:10s} do_bench {ms * 1e3:7.1f} us; kernels {sum(kernels.values()):6.1f} us: "
                      + ", ".join(f"{k[:40]} {v}" for k, v in kernels.items()), flush=True)
    if args.no_profile:
        return
    q, k, v, do = cuda_attention_inputs(1, 1, args.n[0], 64)
    table = variants(q, k, v, do, True)
    for name in ("fwd", "pair"):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            for t in (q, k, v):
                t.grad = None
            table[name]()
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
        print(f"--- cProfile, 2000 x {name}, N{args.n[0]} d64 causal")
        print(text.getvalue())


if __name__ == "__main__":
    main()
