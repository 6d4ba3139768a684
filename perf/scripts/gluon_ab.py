"""Versions of the Gluon kernels side by side in one process, with cuDNN's: forward and
backward medians (do_bench, interleaved rounds) at the tracked shapes, and the largest
difference of each version's outputs from the current module's (each is checked against
float64 by the probe and the laws; this only shows a change computes the same thing).

    PYTHONPATH=. python perf/scripts/gluon_ab.py [--variant NAME=SOURCE ...] [--dims 64 128] [--out DIR]
        [--short] [--passes fwd bwd] [--peers cudnn flash]

SOURCE is a module name or a path to a copy of flash_gluon.py (an earlier schedule).  The
current module always runs as ``now``.  Each round runs the variants in an order shuffled
anew (a rotation keeps each call behind the same one, which read 2-5 % slow after SDPA's:
perf/results/2026-11-28-h200-backward-host-floor), and every round's time is kept: a copy of
``now`` as a variant shows how far two runs of the same kernel are apart.  ``--short``: CS336's
short sweep points instead (B1 H1, N 256-4096, both masks), where a forward takes 5-30 us.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import random
import statistics
import sys
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # (B, H, N, d, causal)
    (1, 16, 16384, 64, True),  # the leaderboard
    (4, 16, 4096, 128, False),  # the d 128 shape
    (4, 16, 4096, 64, False),
    (2, 16, 8192, 128, True),
    (8, 16, 1024, 64, True),
]
SHORT_SHAPES = [(1, 1, n, d, causal) for causal in (True, False) for d in (64, 128) for n in (256, 512, 1024, 2048, 4096)]


def load(name: str, source: str):
    if not source.endswith(".py"):
        source = importlib.util.find_spec(source).origin
    spec = importlib.util.spec_from_file_location(name, source)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def variant(text: str):
    name, source = text.split("=", 1)
    return name, load(f"gluon_ab_{name}", source)


class Sdpa:
    """One SDPA backend with the module interface the rounds call."""

    def __init__(self, backend):
        self.backend = backend

    def flash_forward(self, q, k, v, causal):
        with sdpa_kernel(self.backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), None

    def backward_fn(self, q, k, v, do, causal):
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel(self.backend):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


PEERS = {"cudnn": Sdpa(SDPBackend.CUDNN_ATTENTION), "flash": Sdpa(SDPBackend.FLASH_ATTENTION)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", action="append", default=[])
    p.add_argument("--out", default="perf-out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128], help="only the shapes of these head dims")
    p.add_argument("--short", action="store_true", help="CS336's short sweep points instead of the tracked shapes")
    p.add_argument("--passes", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"])
    p.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=["cudnn"])
    a = p.parse_args()
    mods = {"now": importlib.import_module("impl.attention.flash_gluon"), **dict(map(variant, a.variant))}
    rows = []
    shuffle = random.Random(0)
    for b, h, n, d, causal in (shape for shape in (SHORT_SHAPES if a.short else SHAPES) if shape[3] in a.dims):
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        outs = {name: m.flash_forward(q, k, v, causal) for name, m in mods.items()}
        grads = {name: m.flash_backward(q, k, v, *outs[name], do, causal) for name, m in mods.items()}
        ref = (outs["now"][0], *grads["now"])
        diff = {name: max((x.float() - y.float()).abs().max().item() for x, y in zip((outs[name][0], *grads[name]), ref))
                for name in mods}
        calls = {}
        for name, m in mods.items():
            o, lse = outs[name]
            calls[(name, "fwd")] = lambda m=m: m.flash_forward(q, k, v, causal)
            calls[(name, "bwd")] = lambda m=m, o=o, lse=lse: m.flash_backward(q, k, v, o, lse, do, causal)
        for peer in a.peers:
            calls[(peer, "fwd")] = lambda peer=PEERS[peer]: peer.flash_forward(q, k, v, causal)
            calls[(peer, "bwd")] = PEERS[peer].backward_fn(q, k, v, do, causal)
        calls = {key: fn for key, fn in calls.items() if key[1] in a.passes}
        times = {key: [] for key in calls}
        keys = list(calls)
        for _ in range(a.rounds):
            shuffle.shuffle(keys)
            for key in keys:
                times[key].append(triton.testing.do_bench(calls[key]))
        row = {"shape": f"B{b} H{h} N{n} d{d} {'causal' if causal else 'full'}", "max_diff_vs_now": diff,
               **{f"{name}_{pas}_ms": statistics.median(t) for (name, pas), t in times.items()},
               "rounds_ms": {f"{name}_{pas}": t for (name, pas), t in times.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gluon_ab.json").write_text(json.dumps(rows, indent=1))
    names = [*mods, *a.peers]
    lines = []
    for pas in a.passes:
        lines += [f"\n{pas} (ms)\n", "| shape | " + " | ".join(names) + " | max diff vs now |",
                  "|---|" + "---:|" * len(names) + "---|"]
        lines += [f"| {r['shape']} | " + " | ".join(f"{r[f'{x}_{pas}_ms']:.4f}" for x in names) + " | "
                  + ", ".join(f"{x} {v:.3g}" for x, v in r["max_diff_vs_now"].items() if x != "now") + " |"
                  for r in rows]
    (out / "gluon_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
