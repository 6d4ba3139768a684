"""The Gluon backward with five products (dQ added by TMA reductions) against its seven-product
form (the same module under torch.use_deterministic_algorithms) and SDPA's flash and cuDNN
backends: backward medians (do_bench, interleaved rounds), and how far the two Gluon forms'
gradients are apart.

    PYTHONPATH=. python perf/scripts/gluon_five_products.py [--out DIR] [--variant NAME=FILE ...]

``--variant`` adds the backward of another copy of flash_gluon.py (an earlier schedule) to the
same rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import statistics
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention.flash_gluon import flash_backward, flash_forward

SHAPES = [  # (B, H, N, d, causal)
    (1, 16, 16384, 64, True),  # the leaderboard
    (2, 16, 8192, 64, True),
    (4, 16, 4096, 64, False),
    (8, 16, 1024, 64, True),
]


def sdpa_backward(backend, q, k, v, do, causal):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(backend):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", action="append", default=[])
    a = p.parse_args()
    extra = {name: load(f"gluon_{name}", path) for name, path in (v.split("=", 1) for v in a.variant)}
    rows = []
    for b, h, n, d, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        o, lse = flash_forward(q, k, v, causal)
        five = lambda: flash_backward(q, k, v, o, lse, do, causal)  # noqa: E731

        def seven():
            torch.use_deterministic_algorithms(True)
            try:
                return flash_backward(q, k, v, o, lse, do, causal)
            finally:
                torch.use_deterministic_algorithms(False)

        g5, g7 = five(), seven()
        diff = {name: (x.float() - y.float()).abs().max().item() for name, x, y in zip("qkv", g5, g7)}
        scale = {name: y.float().abs().max().item() for name, y in zip("qkv", g7)}
        variants = {"gluon_five": five, "gluon_seven": seven,
                    "sdpa_cudnn": sdpa_backward(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal),
                    "sdpa_flash": sdpa_backward(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal),
                    **{f"gluon_{name}": (lambda m=m: m.flash_backward(q, k, v, o, lse, do, causal))
                       for name, m in extra.items()}}
        times = {name: [] for name in variants}
        for _ in range(a.rounds):
            for name, fn in variants.items():
                times[name].append(triton.testing.do_bench(fn))
        row = {"shape": f"B{b} H{h} N{n} d{d} {'causal' if causal else 'full'}",
               "max_diff_five_vs_seven": diff, "max_abs_seven": scale,
               **{f"{name}_bwd_ms": statistics.median(t) for name, t in times.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "five_products.json").write_text(json.dumps(rows, indent=1))
    lines = ["| shape | five | seven | cuDNN | flash | five / cuDNN | dQ, dK, dV max diff five vs seven |",
             "|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['shape']} | {r['gluon_five_bwd_ms']:.3f} | {r['gluon_seven_bwd_ms']:.3f} | "
              f"{r['sdpa_cudnn_bwd_ms']:.3f} | {r['sdpa_flash_bwd_ms']:.3f} | "
              f"{r['gluon_five_bwd_ms'] / r['sdpa_cudnn_bwd_ms']:.2f} | "
              f"{', '.join(f'{v:.3g}' for v in r['max_diff_five_vs_seven'].values())} |" for r in rows]
    (out / "five_products.md").write_text("\n".join(lines) + "\n")
    for name in extra:
        lines.append(f"\n{name}: " + ", ".join(f"{r['shape']} {r[f'gluon_{name}_bwd_ms']:.3f}" for r in rows))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
