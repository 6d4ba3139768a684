"""The Gluon kernels before and after a change, side by side in one process: forward and
backward medians (do_bench, interleaved rounds) at the tracked shapes, and the largest
difference between the two versions' outputs (both are checked against float64 by the
probe and the laws; this only shows the change computes the same thing).

    PYTHONPATH=. python perf/scripts/gluon_ab.py --before impl.attention.flash_gluon_prev [--out DIR]

``--before`` names a copy of an earlier flash_gluon.py kept as a module for the run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
from pathlib import Path

import torch
import triton

SHAPES = [  # (B, H, N, d, causal)
    (1, 16, 16384, 64, True),  # the leaderboard
    (4, 16, 4096, 128, False),
    (8, 16, 1024, 64, True),
    (2, 16, 8192, 128, True),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--out", default="perf-out")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    mods = {"before": importlib.import_module(a.before), "after": importlib.import_module("impl.attention.flash_gluon")}
    rows = []
    for b, h, n, d, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        outs = {name: m.flash_forward(q, k, v, causal) for name, m in mods.items()}
        grads = {name: m.flash_backward(q, k, v, *outs[name], do, causal) for name, m in mods.items()}
        diff = max((x.float() - y.float()).abs().max().item()
                   for x, y in zip((outs["before"][0], *grads["before"]), (outs["after"][0], *grads["after"])))
        times = {(name, pas): [] for name in mods for pas in ("fwd", "bwd")}
        for _ in range(a.rounds):
            for name, m in mods.items():
                o, lse = outs[name]
                times[(name, "fwd")].append(triton.testing.do_bench(lambda: m.flash_forward(q, k, v, causal)))
                times[(name, "bwd")].append(
                    triton.testing.do_bench(lambda: m.flash_backward(q, k, v, o, lse, do, causal)))
        row = {"shape": f"B{b} H{h} N{n} d{d} {'causal' if causal else 'full'}", "max_diff_before_after": diff,
               **{f"{name}_{pas}_ms": statistics.median(t) for (name, pas), t in times.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gluon_ab.json").write_text(json.dumps(rows, indent=1))
    lines = ["| shape | fwd before | fwd after | bwd before | bwd after | max diff |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['shape']} | {r['before_fwd_ms']:.3f} | {r['after_fwd_ms']:.3f} | {r['before_bwd_ms']:.3f} | "
              f"{r['after_bwd_ms']:.3f} | {r['max_diff_before_after']:.3g} |" for r in rows]
    (out / "gluon_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
