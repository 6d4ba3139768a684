"""Tile configurations of the Gluon flavour on a Hopper GPU: each candidate checked against
the Triton flavour's outputs, then timed (do_bench medians, the candidates of one kernel in
interleaved rounds); and the host time of a short forward + backward next to the Triton
flavour and SDPA.

    PYTHONPATH=. python -m perf.tune.gluon_configs [--out DIR] [--host-only] [--kinds fwd dq dkdv fused]

A candidate is (BLOCK_M, BLOCK_N, STAGES); the table's other fields (warps, registers) stay.

Prints one table per kernel and shape and writes OUT/gluon_configs.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import torch
import triton.testing

import impl.attention.flash_gluon as fg
from impl.attention.flash_triton import FlashAttentionTriton
from impl.attention.flash_gluon import FlashAttentionGluon

SHAPES = {"leaderboard B1 H16 N16384 d64 causal": (1, 16, 16384, 64, True),
          "B4 H16 N4096 d128 full": (4, 16, 4096, 128, False),
          "B8 H16 N1024 d64 causal": (8, 16, 1024, 64, True)}
CANDIDATES = {
    "fwd": {64: [(128, 128, 3), (128, 128, 2), (128, 64, 3), (128, 64, 4)],
            128: [(128, 128, 2), (128, 64, 3), (128, 64, 4)]},
    "dq": {64: [(128, 64, 3), (128, 128, 2), (128, 128, 3)], 128: [(128, 64, 2), (128, 64, 3)]},
    "dkdv": {64: [(64, 128, 3), (64, 128, 4), (32, 128, 4)], 128: [(32, 128, 3), (32, 128, 4), (64, 128, 3)]},
    "fused": {64: [(64, 128, 3), (64, 128, 2), (64, 128, 4)]},  # the five-product dK/dV kernel
}
TABLES = {"fwd": fg.FORWARD_CONFIGS, "dq": fg.BACKWARD_DQ_CONFIGS, "dkdv": fg.BACKWARD_DKDV_CONFIGS,
          "fused": fg.BACKWARD_FUSED_CONFIGS}


def inputs(b, h, n, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                   for _ in range(4))
    return [t.requires_grad_(True) for t in (q, k, v)], do


def run(fn, q, k, v, do, causal):
    for t in (q, k, v):
        t.grad = None
    o = fn.apply(q, k, v, causal)
    o.backward(do)
    return o.detach(), [t.grad for t in (q, k, v)]


def _with(default, cand):
    block_m, block_n, stages = cand
    return dataclasses.replace(default, block_m=block_m, block_n=block_n, stages=stages)


def tune(kind, shape_name, rounds=3):
    b, h, n, d, causal = SHAPES[shape_name]
    if d not in CANDIDATES[kind]:
        return []
    if kind in ("dq", "dkdv") and d in fg.BACKWARD_FUSED_CONFIGS:  # seven products run only in deterministic mode
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return _tune(kind, shape_name, b, h, n, d, causal, rounds)
        finally:
            torch.use_deterministic_algorithms(was)
    return _tune(kind, shape_name, b, h, n, d, causal, rounds)


def _tune(kind, shape_name, b, h, n, d, causal, rounds):
    (q, k, v), do = inputs(b, h, n, d)
    ref_o, ref_g = run(FlashAttentionTriton, q, k, v, do, causal)
    table, default = TABLES[kind], TABLES[kind][d]
    rows, times = [], {}
    for cand in CANDIDATES[kind][d]:
        table[d] = _with(default, cand)
        fg._PLANS.clear()
        try:
            o, g = run(FlashAttentionGluon, q, k, v, do, causal)
            err = max([(o.float() - ref_o.float()).abs().max().item()]
                      + [(a.float() - r.float()).abs().max().item() for a, r in zip(g, ref_g)])
            times[cand] = []
            rows.append(dict(kind=kind, shape=shape_name, config=cand, max_diff_vs_triton=err))
        except Exception as exc:  # noqa: BLE001 - a candidate that does not fit is a row
            rows.append(dict(kind=kind, shape=shape_name, config=cand, error=f"{type(exc).__name__}: {exc}"[:200]))
    for _ in range(rounds):
        for cand in list(times):
            table[d] = _with(default, cand)
            fg._PLANS.clear()
            if kind == "fwd":
                f = lambda: FlashAttentionGluon.apply(q, k, v, causal)  # noqa: E731
            else:
                o = FlashAttentionGluon.apply(q, k, v, causal)
                f = lambda o=o: o.backward(do, retain_graph=True)  # noqa: E731
            times[cand].append(triton.testing.do_bench(f, warmup=10, rep=40, grad_to_none=[q, k, v]))
    for r in rows:
        if r["config"] in times:
            r["ms"] = statistics.median(times[r["config"]])
    table[d] = default
    fg._PLANS.clear()
    return rows


def host_us(fn, q, k, v, do, causal, calls=50):
    for _ in range(5):
        fn(q, k, v, do, causal)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(q, k, v, do, causal)
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--host-only", action="store_true", help="only the host time of a short forward + backward")
    p.add_argument("--kinds", nargs="+", default=["fwd", "dq", "dkdv", "fused"], choices=list(CANDIDATES))
    a = p.parse_args()
    rows = []
    for kind in () if a.host_only else a.kinds:
        for shape in SHAPES:
            for r in tune(kind, shape):
                rows.append(r)
                print(json.dumps(r), flush=True)
    (q, k, v), do = inputs(1, 1, 128, 64)
    sdpa = lambda q, k, v, do, c: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c).backward(do)  # noqa: E731
    for name, fn in (("gluon", lambda *x: run(FlashAttentionGluon, *x)), ("triton", lambda *x: run(FlashAttentionTriton, *x)),
                     ("sdpa", sdpa)):
        us = [host_us(fn, q, k, v, do, True) for _ in range(3)]
        row = dict(kind="host fwd+bwd B1 H1 N128 d64 causal", impl=name, host_us=statistics.median(us))
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "gluon_configs.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
