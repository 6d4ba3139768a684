"""Small grids, forward: the split-KV forward (ForwardConfig.split_keys) against the default
and SDPA flash; and the one-pass backward at the small grids the first runs did not cover
(d64 non-causal, d128).  bf16, batch 1.

    PYTHONPATH=. python perf/scripts/attention_split_forward.py [--out DIR] [--rounds 3] [--workers 12]

1. Correctness of every candidate (perf/tune/tune_attention.py's checks: O, L, dQ, dK, dV
   against float64 through the oracle, bf16 and fp16, causal and not, N 1000 and 1024; the
   single-key probe), in a pool of processes, which also compiles the kernels.
2. Forward alone, and backward alone from a saved O and L, ``--rounds`` interleaved rounds,
   medians of triton.testing.do_bench medians.
Writes DIR/split_forward.json and DIR/split_forward.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from perf.lib.measure import device_description, median_ms
from perf.scripts.attention_one_pass import CHECKS, PROBES, _one_pass, inputs, sdpa_backward
from perf.tune.tune_attention import _pool_check


def _split(block_m, block_n, warps, stages, keys, tma=False):
    return dict(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, longest_first=True,
                tma=tma, split_keys=keys)


FWD = {
    64: {"split 64x64 w4 s2 k256": _split(64, 64, 4, 2, 256), "split 64x64 w4 s2 k512": _split(64, 64, 4, 2, 512),
         "split 64x64 w4 s2 k1024": _split(64, 64, 4, 2, 1024),
         "split 64x64 w4 s2 k2048": _split(64, 64, 4, 2, 2048),
         "split 128x64 w8 s3 k512": _split(128, 64, 8, 3, 512),
         "split 128x64 w8 s3 k1024": _split(128, 64, 8, 3, 1024)},
    128: {"split 64x64 w4 s2 k256": _split(64, 64, 4, 2, 256, True),
          "split 64x64 w4 s2 k512": _split(64, 64, 4, 2, 512, True),
          "split 64x64 w4 s2 k1024": _split(64, 64, 4, 2, 1024, True),
          "split 64x64 w4 s2 k2048": _split(64, 64, 4, 2, 2048, True),
          "split 128x64 w8 s3 k512": _split(128, 64, 8, 3, 512, True),
          "split 128x64 w8 s3 k1024": _split(128, 64, 8, 3, 1024, True)},
}
BWD = {
    64: {"1p 64x64 w4 s3": _one_pass(64, 64, 4, 3), "1p 64x32 w4 s3": _one_pass(64, 32, 4, 3)},
    128: {"1p 64x64 w4 s2": _one_pass(64, 64, 4, 2), "1p 64x32 w4 s2": _one_pass(64, 32, 4, 2),
          "1p 32x32 w4 s2": _one_pass(32, 32, 4, 2)},
}
FWD_SHAPES = [(1, h, n, d, causal) for d in (64, 128) for causal in (True, False)
              for (h, n) in ((1, 1024), (1, 2048), (1, 4096), (1, 8192), (1, 16384), (4, 2048))]
BWD_SHAPES = [(1, 1, n, d, causal) for (d, causal) in ((64, False), (128, True), (128, False))
              for n in (2048, 8192, 16384, 32768)]


def correctness(workers: int) -> dict:
    jobs = [(dict(name=f"d{d} {name}", kind=kind, config=tuple(sorted(cfg.items()))), d, CHECKS, PROBES)
            for kind, table in (("fwd", FWD), ("bwd", BWD)) for d, cands in table.items() for name, cfg in cands.items()]
    with mp.get_context("spawn").Pool(workers) as pool:
        return {r["name"]: r for r in pool.map(_pool_check, jobs)}


def rounds(variants: dict, n_rounds: int, rep: int) -> dict:
    got = {key: [] for key in variants}
    for _ in range(n_rounds):
        for key, fn in variants.items():
            try:
                got[key].append(median_ms(fn, "cuda", rep_ms=rep))
            except Exception as exc:  # noqa: BLE001 - a variant that cannot run is a row saying so
                got[key].append(f"{type(exc).__name__}: {str(exc)[:120]}")
    return {key: statistics.median(v) for key, v in got.items() if all(isinstance(x, float) for x in v)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--rep", type=int, default=40)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from impl.attention import flash_triton as ft

    report = dict(device=device_description("cuda"), torch=torch.__version__, forward={}, backward={})
    t0 = time.time()
    report["correctness"] = correctness(a.workers)
    report["correctness_s"] = round(time.time() - t0, 1)
    passed = {name for name, r in report["correctness"].items() if r["status"] == "ok"}
    save = lambda: (out / "split_forward.json").write_text(json.dumps(report, indent=1, default=str))  # noqa: E731
    save()

    for b, h, n, d, causal in FWD_SHAPES:
        q, k, v, _ = inputs(b, h, n, d)
        variants = {"default": lambda: ft.flash_forward(q, k, v, causal)}
        for name, cfg in FWD[d].items():
            if f"d{d} {name}" in passed and cfg["split_keys"] < n:
                variants[name] = (lambda cfg=cfg: ft.flash_forward(q, k, v, causal, config=cfg))
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))

        def flash(qq=qq, kk=kk, vv=vv):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        variants["sdpa flash"] = flash
        key = f"B{b} H{h} N{n} d{d} {'causal' if causal else 'full'}"
        report["forward"][key] = rounds(variants, a.rounds, a.rep)
        print("fwd", key, json.dumps(report["forward"][key]), flush=True)
        save()

    for b, h, n, d, causal in BWD_SHAPES:
        q, k, v, do = inputs(b, h, n, d)
        o, lse = ft.flash_forward(q, k, v, causal)
        variants = {"default (2 kernels)": lambda: ft.flash_backward(q, k, v, o, lse, do, causal)}
        for name, cfg in BWD[d].items():
            if f"d{d} {name}" in passed:
                variants[name] = (lambda cfg=cfg: ft.flash_backward(q, k, v, o, lse, do, causal, config=cfg))
        variants["sdpa flash"] = sdpa_backward(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal)
        key = f"B{b} H{h} N{n} d{d} {'causal' if causal else 'full'}"
        report["backward"][key] = rounds(variants, a.rounds, a.rep)
        print("bwd", key, json.dumps(report["backward"][key]), flush=True)
        save()
    (out / "split_forward.md").write_text(render(report))
    print(render(report))


def render(report) -> str:
    lines = ["# Small grids: split-KV forward and one-pass backward", "",
             f"{report['device']}, torch {report['torch']}", "", "## Correctness", ""]
    for name, r in report["correctness"].items():
        lines.append(f"- {name}: {r['status']}" + (f" ({r['failures'][:2]})" if r["failures"] else ""))
    for part in ("forward", "backward"):
        lines += ["", f"## {part.capitalize()} alone (median ms of rounds)", ""]
        for key, row in report[part].items():
            lines.append(f"- {key}: " + ", ".join(f"{k}: {v:.4f}" for k, v in sorted(row.items(), key=lambda kv: kv[1])))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
