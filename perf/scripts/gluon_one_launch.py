"""The Gluon flavour's backward on small grids: its three launches (D and zeroed dQ sums, the
Gluon dK/dV kernel adding dQ, dQ cast) against the one-launch backward (the Triton flavour's
``_flash_bwd_one_launch_kernel``: dQ and dK/dV programs in one grid, each computing its D rows),
beside SDPA flash.  Per shape and variant, medians over ``--rounds`` rounds in shuffled order:

    bwd, fwd+bwd   the sweep's measure (``measure.median_ms``, do_bench's median, L2 flushed),
                   through ``FlashAttentionGluon`` as ``perf.bench.attention`` calls it, in us
    host           host us to issue one ``o.backward(dO)`` (100 calls, no sync inside)
    kernels        device us a backward by torch.profiler (30 calls, L2 flushed before each)

    PYTHONPATH=. python perf/scripts/gluon_one_launch.py [--rounds 3] [--out FILE]

``--flavour triton``: the Triton flavour instead (``FlashAttentionTriton``), whose small grids
take its table's backward: "plan" is the table without its one-launch entries
(``flash_triton._SMALL_GRID_BWD``: the one-pass with atomic dQ at d 64, two kernels at d 128),
a candidate's one launch takes every grid.  ``--shapes B,H,N,d,causal|full ...`` measures those
shapes instead of the default ones.

A variant is forced by setting ``flash_gluon.ONE_LAUNCH_CONFIGS`` (any grid size) and clearing the plans and the C++ passes bound to call keys.  The last column is the largest
|grad - grad_ref| of any variant (ref: SDPA's math backend in float32): a check that each
forced plan computes the gradients (the laws are the real one).
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
from impl.attention import flash_triton as ft
from impl.attention import native_launch
from impl.attention.flash_triton import BackwardConfig
from perf.lib.measure import host_us_per_call, kernel_us_per_call, median_ms
from perf.lib.workloads import cuda_attention_inputs

SHAPES = [(1, 1, n, d, causal) for causal in (True, False) for d in (64, 128)
          for n in (128, 256, 512, 1024, 2048, 4096)]
WIDER = [(1, 4, 1024, 64, True), (1, 8, 1024, 64, True), (1, 16, 512, 64, True), (2, 8, 512, 128, False),
         (4, 12, 256, 64, True)]
# (dkdv_block_n, dkdv_block_m, dq_block_m, dq_block_n, warps, stages)
CANDIDATES = {
    64: {"one 64x64": (64, 64, 64, 64, 4, 2), "one 128x64": (128, 64, 64, 64, 8, 2),
         "one 64x32": (64, 32, 64, 32, 4, 2), "one 32x32": (32, 32, 32, 32, 4, 2)},
    128: {"one 64x64": (64, 64, 64, 64, 4, 2), "one 128x64": (128, 64, 64, 64, 8, 2),
          "one 64x32": (64, 32, 64, 32, 4, 2), "one 32x32": (32, 32, 32, 32, 4, 1)},
}

TRITON_CANDIDATES = {
    64: {"one 64x64": (64, 64, 64, 64, 4, 2), "one 64x64 tma": (64, 64, 64, 64, 4, 2, True),
         "one 64x32": (64, 32, 64, 32, 4, 2)},
    128: {"one 64x32": (64, 32, 64, 32, 4, 2), "one 64x64": (64, 64, 64, 64, 4, 2),
          "one 32x32": (32, 32, 32, 32, 4, 1)},
}


def use_triton(variant: str, d: int) -> None:
    """Every new Triton backward plan takes this variant: 'plan' (the table without its one-launch
    entries, ``flash_triton._ONE_LAUNCH_BWD``) or a candidate's one launch at every grid of head
    dim d, causal or not."""
    if variant == "plan":
        ft._ONE_LAUNCH_BWD = {}
    else:
        n, m, qm, qn, warps, stages, *tma = TRITON_CANDIDATES[d][variant]
        cfg = BackwardConfig(n, m, qm, qn, warps, stages, one_launch=True, tma=bool(tma and tma[0]))
        bucket = 64 if d <= 64 else 128
        ft._ONE_LAUNCH_BWD = {(True, bucket): (cfg, 1e9), (False, bucket): (cfg, 1e9)}
    ft._PLANS.clear()


def use(variant: str, d: int) -> None:
    """Every new backward plan takes this variant: 'plan' (the Gluon kernels' three launches at
    every grid) or a candidate's one launch (at every grid)."""
    if variant == "plan":
        fg.ONE_LAUNCH_CONFIGS = {}
    else:
        n, m, qm, qn, warps, stages = CANDIDATES[d][variant]
        fg.ONE_LAUNCH_CONFIGS = {d: (BackwardConfig(n, m, qm, qn, warps, stages), float(1 << 20))}
    fg._PLANS.clear()
    if native_launch.built() is not None:
        native_launch.built().clear_bound()


def flushed(fn):
    """``fn`` after the L2 flush do_bench runs before each call (Triton's own buffer and clear)."""
    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    return lambda: (driver.clear_cache(cache), fn())


def kernels_us(fn) -> float:
    per_kernel = kernel_us_per_call(flushed(fn), calls=30)
    return sum(us for name, us in per_kernel.items() if "fill" not in name.lower() and "zero" not in name.lower())


def measure(attend, q, k, v, do, grads, out: dict, ref: dict | None, errors: list) -> None:
    o = attend()
    if ref is not None:
        for t in grads:
            t.grad = None
        o.backward(do, retain_graph=True)
        errors.append(max((t.grad.float() - ref[i]).abs().max().item() for i, t in enumerate(grads)))
    backward = lambda: o.backward(do, retain_graph=True)  # noqa: E731
    both = lambda: attend().backward(do)  # noqa: E731
    out.setdefault("bwd", []).append(median_ms(backward, "cuda", warmup_ms=10, rep_ms=25, grad_to_none=grads) * 1e3)
    out.setdefault("fwd+bwd", []).append(median_ms(both, "cuda", warmup_ms=10, rep_ms=25, grad_to_none=grads) * 1e3)
    out.setdefault("host", []).append(host_us_per_call(backward, "cuda", calls=100, grad_to_none=grads))
    out.setdefault("kernels", []).append(kernels_us(backward))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-wider", action="store_true", help="only CS336's short points (B1 H1)")
    p.add_argument("--flavour", default="gluon", choices=["gluon", "triton"])
    p.add_argument("--shapes", nargs="+", default=None, help="B,H,N,d,causal|full each (default: the sweep's and WIDER)")
    p.add_argument("--candidates", nargs="+", default=None, help="only these candidates (by name)")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    shuffle = random.Random(0)
    columns = ("bwd", "fwd+bwd", "host", "kernels")
    print("| B H N d mask | variant | programs | " + " | ".join(columns) + " |")
    print("|---|---|---:|" + "---:|" * len(columns))
    shapes = SHAPES + ([] if a.no_wider else WIDER)
    if a.shapes:
        shapes = [(*map(int, x.split(",")[:4]), x.split(",")[4] == "causal") for x in a.shapes]
    for B, H, n, d, causal in shapes:
        q, k, v, do = cuda_attention_inputs(B, H, n, d)
        grads = [q, k, v]
        with sdpa_kernel(SDPBackend.MATH):
            qf, kf, vf = (t.detach().float().requires_grad_(True) for t in grads)
            F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal).backward(do.float())
            ref = [qf.grad, kf.grad, vf.grad]
        candidates = TRITON_CANDIDATES if a.flavour == "triton" else CANDIDATES
        use_variant = use_triton if a.flavour == "triton" else use
        function = ft.FlashAttentionTriton if a.flavour == "triton" else fg.FlashAttentionGluon
        variants = ["plan", *(c for c in candidates[d] if not a.candidates or c in a.candidates), "flash"]
        times = {name: {} for name in variants}
        errors = {name: [] for name in variants}
        for r in range(a.rounds):
            order = list(variants)
            shuffle.shuffle(order)
            for name in order:
                if name == "flash":
                    def attend():
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                else:
                    use_variant(name, d)
                    attend = lambda: function.apply(q, k, v, causal)  # noqa: E731
                measure(attend, q, k, v, do, grads, times[name], ref if r == 0 else None, errors[name])
        use_variant("plan", d)
        shape = f"B{B} H{H} N{n} d{d} {'causal' if causal else 'full'}"
        for name in variants:
            if name in candidates[d]:
                bn, _, qm, *_ = candidates[d][name]
                programs = B * H * (triton.cdiv(n, qm) + triton.cdiv(n, bn))
            else:
                programs = ""
            cells = " | ".join(f"{statistics.median(times[name][c]):.1f}" for c in columns)
            print(f"| {shape} | {name} | {programs} | {cells} | err {max(errors[name]):.1e}", flush=True)


if __name__ == "__main__":
    main()
