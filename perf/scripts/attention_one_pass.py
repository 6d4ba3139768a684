"""The one-pass backward (BackwardConfig.dq_atomic: dK/dV kernel adds dS K into a float32 dQ
with atomics, 5 matmul units a tile pair) against the two-kernel default (7) and SDPA.

    PYTHONPATH=. python perf/scripts/attention_one_pass.py [--phase anchors|waves] [--out DIR] [--rounds 3]

--phase anchors: the tracked shapes (leaderboard, d128 anchor, B8 H16 N1024, B1 H1 long
sequences), d 64 and 128; --phase waves: d64 causal at 1, 2 and 4 heads, N 1024 to 65536.

1. Correctness of each one-pass candidate on the GPU, as perf/tune/tune_attention.py checks
   its candidates (O, L, dQ, dK, dV against float64 through the oracle, bf16 and fp16, causal
   and not, N 1000 and 1024, outputs poisoned; the single-key probe), in a pool of processes.
2. Backward alone (from a saved O, L) at each shape: the default, every candidate that passed,
   SDPA flash and cuDNN; then forward + backward of the default, the best one-pass candidate
   and SDPA.  ``--rounds`` interleaved rounds, medians of triton.testing.do_bench medians.
Writes DIR/one_pass.json and DIR/one_pass.md.
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
from perf.tune.tune_attention import _pool_check

# (name, B, H, N, d, causal)
SHAPES = [
    ("leaderboard", 1, 16, 16384, 64, True),
    ("d128 anchor", 4, 16, 4096, 128, False),
    ("B8 H16 N1024 causal", 8, 16, 1024, 64, True),
    ("B1 H1 N8192 d64 causal", 1, 1, 8192, 64, True),
    ("B1 H1 N32768 d64 causal", 1, 1, 32768, 64, True),
    ("B1 H1 N32768 d64 full", 1, 1, 32768, 64, False),
    ("B1 H1 N8192 d128 causal", 1, 1, 8192, 128, True),
    ("B1 H1 N32768 d128 causal", 1, 1, 32768, 128, True),
    ("B1 H1 N32768 d128 full", 1, 1, 32768, 128, False),
]


def _one_pass(block_n, block_m, warps, stages, tma=True, lpt=True, pre=64):
    return dict(dkdv_block_n=block_n, dkdv_block_m=block_m, num_warps=warps, num_stages=stages, tma=tma,
                longest_first=lpt, dq_atomic=True, preprocess_block_m=pre,
                dq_block_m=64, dq_block_n=64)  # dq_* unused in one pass


CANDIDATES = {
    64: {"1p 128x32 w4 s3": _one_pass(128, 32, 4, 3), "1p 128x64 w8 s2": _one_pass(128, 64, 8, 2),
         "1p 64x64 w4 s2": _one_pass(64, 64, 4, 2), "1p 128x32 w8 s3": _one_pass(128, 32, 8, 3),
         "1p 64x32 w4 s3": _one_pass(64, 32, 4, 3), "1p 128x64 w8 s3": _one_pass(128, 64, 8, 3)},
    128: {"1p 64x32 w4 s2": _one_pass(64, 32, 4, 2), "1p 64x64 w4 s2": _one_pass(64, 64, 4, 2),
          "1p 128x32 w8 s2": _one_pass(128, 32, 8, 2), "1p 128x64 w8 s2": _one_pass(128, 64, 8, 2),
          "1p 64x64 w8 s2": _one_pass(64, 64, 8, 2)},
}
# --phase waves: where does the one pass win?  d64 causal (the only kind it won in the first
# run), batch 1, heads x sequence from a fraction of one wave of SMs to several.
WAVE_CANDIDATES = {"1p 64x32 w4 s3": _one_pass(64, 32, 4, 3), "1p 64x32 w4 s2": _one_pass(64, 32, 4, 2),
                   "1p 64x64 w4 s3": _one_pass(64, 64, 4, 3), "1p 128x64 w8 s3": _one_pass(128, 64, 8, 3),
                   "1p 128x64 w4 s3": _one_pass(128, 64, 4, 3)}
WAVE_SHAPES = [(f"B1 H{h} N{n} d64 causal", 1, h, n, 64, True)
               for h in (1, 2, 4) for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536)]
CHECKS = [(dt, causal, n) for dt in ("bf16", "fp16") for causal in (True, False) for n in (1000, 1024)]
PROBES = [("bf16", 1), ("bf16", 77), ("fp16", 1)]


def correctness(workers: int, candidates: dict) -> dict:
    jobs = [(dict(name=f"d{d} {name}", kind="bwd", config=tuple(sorted(cfg.items()))), d, CHECKS, PROBES)
            for d, cands in candidates.items() for name, cfg in cands.items()]
    with mp.get_context("spawn").Pool(workers) as pool:
        return {r["name"]: r for r in pool.map(_pool_check, jobs)}


def inputs(b, h, n, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)]


def sdpa_backward(backend, q, k, v, do, causal):
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
    return lambda: torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True)


def sdpa_fwd_bwd(backend, q, k, v, do, causal):
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))

    def run():
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        torch.autograd.grad(o, (qq, kk, vv), do)
    return run


def ours_fwd_bwd(ft, q, k, v, do, causal, bwd_cfg):
    def run():
        o, lse = ft.flash_forward(q, k, v, causal)
        ft.flash_backward(q, k, v, o, lse, do, causal, config=bwd_cfg)
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--rep", type=int, default=60)
    p.add_argument("--phase", choices=("anchors", "waves"), default="anchors")
    a = p.parse_args()
    global CANDIDATES, SHAPES
    if a.phase == "waves":
        CANDIDATES, SHAPES = {64: WAVE_CANDIDATES}, WAVE_SHAPES
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from impl.attention import flash_triton as ft

    report = dict(device=device_description("cuda"), torch=torch.__version__, phase=a.phase, shapes={})
    t0 = time.time()
    report["correctness"] = correctness(a.workers, CANDIDATES)
    report["correctness_s"] = round(time.time() - t0, 1)
    passed = {name for name, r in report["correctness"].items() if r["status"] == "ok"}
    (out / "one_pass.json").write_text(json.dumps(report, indent=1, default=str))

    for name, b, h, n, d, causal in SHAPES:
        q, k, v, do = inputs(b, h, n, d)
        o, lse = ft.flash_forward(q, k, v, causal)
        default = ft.default_backward_config(q.dtype, d, q.device, causal, b * h, n)
        variants = {"default (2 kernels)": lambda: ft.flash_backward(q, k, v, o, lse, do, causal)}
        for cname, cfg in CANDIDATES[64 if d <= 64 else 128].items():
            if f"d{64 if d <= 64 else 128} {cname}" in passed:
                variants[cname] = (lambda cfg=cfg: ft.flash_backward(q, k, v, o, lse, do, causal, config=cfg))
        variants["sdpa flash"] = sdpa_backward(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal)
        variants["sdpa cudnn"] = sdpa_backward(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal)
        bwd = {key: [] for key in variants}
        for _ in range(a.rounds):
            for key, fn in variants.items():
                try:
                    bwd[key].append(median_ms(fn, "cuda", rep_ms=a.rep))
                except Exception as exc:  # noqa: BLE001 - a variant that cannot run is a row saying so
                    bwd[key].append(f"{type(exc).__name__}: {str(exc)[:120]}")
        med = {key: statistics.median(v) for key, v in bwd.items() if all(isinstance(x, float) for x in v)}
        ones = {key: ms for key, ms in med.items() if key.startswith("1p")}
        best = min(ones, key=ones.get) if ones else None
        fb_variants = {"ours default": ours_fwd_bwd(ft, q, k, v, do, causal, None),
                       "sdpa flash": sdpa_fwd_bwd(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal),
                       "sdpa cudnn": sdpa_fwd_bwd(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal)}
        if best:
            cfg = CANDIDATES[64 if d <= 64 else 128][best]
            fb_variants[f"ours {best}"] = ours_fwd_bwd(ft, q, k, v, do, causal, cfg)
        fb = {key: [] for key in fb_variants}
        for _ in range(a.rounds):
            for key, fn in fb_variants.items():
                fb[key].append(median_ms(fn, "cuda", rep_ms=a.rep))
        report["shapes"][name] = dict(shape=[b, h, n, d], causal=causal, default_config=repr(default),
                                      backward=bwd, backward_median=med, best_one_pass=best,
                                      fwd_bwd=fb, fwd_bwd_median={k_: statistics.median(v) for k_, v in fb.items()})
        (out / "one_pass.json").write_text(json.dumps(report, indent=1, default=str))
        print(name, json.dumps(report["shapes"][name]["backward_median"]),
              json.dumps(report["shapes"][name]["fwd_bwd_median"]), flush=True)
        del q, k, v, do, o, lse
        torch.cuda.empty_cache()
    (out / "one_pass.md").write_text(render(report))
    print(render(report))


def render(report) -> str:
    lines = [f"# One-pass backward (atomic dQ) vs two kernels and SDPA", "",
             f"{report['device']}, torch {report['torch']}", "", "## Correctness", ""]
    for name, r in report["correctness"].items():
        lines.append(f"- {name}: {r['status']}" + (f" ({r['failures'][:2]})" if r["failures"] else ""))
    lines += ["", "## Backward alone (median ms of rounds)", ""]
    for name, s in report["shapes"].items():
        row = ", ".join(f"{k}: {v:.3f}" for k, v in sorted(s["backward_median"].items(), key=lambda kv: kv[1]))
        lines.append(f"- {name} (causal={s['causal']}): {row}")
    lines += ["", "## Forward + backward (median ms of rounds)", ""]
    for name, s in report["shapes"].items():
        row = ", ".join(f"{k}: {v:.3f}" for k, v in sorted(s["fwd_bwd_median"].items(), key=lambda kv: kv[1]))
        lines.append(f"- {name}: {row}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
