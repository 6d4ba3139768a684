"""The host time of one attention backward (and forward), taken apart by subtraction.

    PYTHONPATH=. python perf/scripts/attention_host_parts.py [--out DIR] [--n 128] [--calls 400] [--rounds 7]

At a short sequence a pass is decided by how long the host takes to issue it.  Each
variant below issues ``calls`` passes with no synchronisation inside the loop; rounds
interleave the variants (the host's speed drifts) and the median per call is reported.

    sdpa_flash        o.backward(dO) through torch's C++ node (the peer)
    ours              o.backward(dO) through FlashAttentionTriton
    ours_no_launch    the same with every kernel launch a no-op: our Python and allocations
    ours_no_work      FlashAttentionTriton.backward returns ready gradients: the engine,
                      the Python node and the gradients' accumulation, nothing of ours
    parts             each piece of our backward alone: the plan key, the plan look-up, the
                      four allocations, each launch

The differences name the parts: ours - ours_no_launch = the launches; ours_no_launch -
ours_no_work = our Python and allocations; ours_no_work - (sdpa's engine share) = what a
Python autograd node costs over a C++ one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention import flash_triton as ft
from impl.attention import triton_launch
from perf.lib.measure import host_and_wall_us_per_call
from perf.lib.workloads import cuda_attention_inputs


class _NoLaunch:
    """Launch.__call__ replaced by a no-op while active."""

    def __enter__(self):
        self.saved = triton_launch.Launch.__call__
        triton_launch.Launch.__call__ = lambda self, *tensors: None

    def __exit__(self, *exc):
        triton_launch.Launch.__call__ = self.saved


class _NoWork:
    """FlashAttentionTriton.backward returns the given gradients while active."""

    def __init__(self, grads):
        self.grads = grads

    def __enter__(self):
        self.saved = ft.FlashAttentionTriton.backward
        grads = self.grads
        ft.FlashAttentionTriton.backward = staticmethod(lambda ctx, grad_o: (*grads, None, None))

    def __exit__(self, *exc):
        ft.FlashAttentionTriton.backward = self.saved


def backward_variants(b, h, n, d, causal=True):
    q, k, v, do = cuda_attention_inputs(b, h, n, d)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o_ours = ft.FlashAttentionTriton.apply(q, k, v, causal)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    no_launch, no_work = _NoLaunch(), _NoWork(grads)

    sdpa = lambda: o_sdpa.backward(do, retain_graph=True)  # noqa: E731
    ours = lambda: o_ours.backward(do, retain_graph=True)  # noqa: E731

    # Contexts entered once around the whole loop, not per call: patch, time, restore.
    def timed(ctx, fn):
        def measure(calls):
            with ctx:
                return host_and_wall_us_per_call(fn, calls)[0]
        return measure

    class _Null:
        def __enter__(self):
            return None

        def __exit__(self, *exc):
            return None

    return {
        "sdpa_flash": timed(_Null(), sdpa),
        "ours": timed(_Null(), ours),
        "ours_no_launch": timed(no_launch, ours),
        "ours_no_work": timed(no_work, ours),
    }, (q, k, v, do, o_ours)


def forward_variants(b, h, n, d, causal=True):
    q, k, v, do = cuda_attention_inputs(b, h, n, d)

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def sdpa_bare():  # the backend chosen by torch, no context manager per call
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    ours = lambda: ft.FlashAttentionTriton.apply(q, k, v, causal)  # noqa: E731

    class _Null:
        def __enter__(self):
            return None

        def __exit__(self, *exc):
            return None

    def timed(ctx, fn):
        def measure(calls):
            with ctx:
                return host_and_wall_us_per_call(fn, calls)[0]
        return measure

    return {
        "fwd_sdpa_flash_ctx": timed(_Null(), sdpa),
        "fwd_sdpa_default": timed(_Null(), sdpa_bare),
        "fwd_ours": timed(_Null(), ours),
        "fwd_ours_no_launch": timed(_NoLaunch(), ours),
    }


def parts(q, k, v, do, o, causal=True, calls=2000):
    """Each piece of the backward, alone (perf_counter over `calls`, no synchronisation)."""
    node = o.grad_fn
    key = node.plan_key if hasattr(node, "plan_key") else ft._forward_key(q, k, v, causal, None)
    lse = ft.flash_forward(q.detach(), k.detach(), v.detach(), causal)[1]
    qd, kd, vd, od = (t.detach() for t in (q, k, v, o))
    det = ft._determinism()
    bkey = ("bwd", key, ft._signature(do), det)
    plan = ft._PLANS[bkey]
    out = {}

    def t(name, fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out[name] = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()

    t("signature(dO)", lambda: ft._signature(do))
    t("determinism()", ft._determinism)
    t("key tuple + dict get", lambda: ft._PLANS.get(("bwd", key, ft._signature(do), ft._determinism())))
    t("dict get, key prebuilt", lambda: ft._PLANS.get(bkey))
    t("3 empty_strided + empty",
      lambda: ([torch.empty_strided(s, st, dtype=plan.dtype, device=plan.device)
                for s, st in zip((plan.q_shape, plan.k_shape, plan.v_shape), plan.grad_strides)],
               torch.empty(plan.lse_shape, dtype=torch.float32, device=plan.device)))
    t("plan call (allocs + 2 launches)", lambda: plan(qd, kd, vd, od, lse, do))
    with _NoLaunch():
        t("plan call, launches no-op", lambda: plan(qd, kd, vd, od, lse, do))
    dq = torch.empty_like(qd)
    delta = torch.empty(plan.lse_shape, dtype=torch.float32, device="cuda")
    dk, dv = torch.empty_like(kd), torch.empty_like(vd)
    if plan.launches and len(plan.launches) == 2:
        dq_launch, dkdv = plan.launches
        t("dQ launch", lambda: dq_launch(qd, kd, vd, od, do, lse, delta, dq))
        t("dK/dV launch", lambda: dkdv(qd, kd, vd, do, lse, delta, dk, dv, delta))
        t("hooks_active()", triton_launch._hooks_active)
        t("current_device()", torch.cuda.current_device)
        t("raw stream", lambda: torch._C._cuda_getCurrentRawStream(0))
    t("saved_tensors unpack", lambda: node.saved_tensors)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--n", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for n in args.n:
        bwd, held = backward_variants(1, 1, n, 64)
        fwd = forward_variants(1, 1, n, 64)
        variants = {**bwd, **fwd}
        rows = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, measure in variants.items():
                rows[name].append(measure(args.calls))
        med = {name: round(statistics.median(v), 1) for name, v in rows.items()}
        result[f"N{n}"] = {"median_us": med, "rounds_us": {k: [round(x, 1) for x in v] for k, v in rows.items()},
                           "parts_us": {k: round(x, 2) for k, x in parts(*held).items()}}
        print(f"N={n}", json.dumps(result[f"N{n}"]["median_us"]), flush=True)
        print("  parts", json.dumps(result[f"N{n}"]["parts_us"]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_parts.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
