"""Where the five-product Gluon backward's time goes: each kernel of the seven- and five-
product plans timed alone, and the fused dK/dV kernel with parts of its dQ work removed
(copies of the module with one line changed, loaded from a scratch folder; their gradients
are wrong on purpose, only their times mean anything).

The cuts are lines of the first five-product schedule (each tile's partial staged at the end
of its own tile), which the measurements in perf/results/2026-11-27-h200-gluon-five-products/
used; ``--source`` takes that copy of the module:

    git show bb1b96a:impl/attention/flash_gluon.py > /tmp/flash_gluon_v1.py
    PYTHONPATH=. python perf/scripts/gluon_dq_reduce_ablation.py --source /tmp/flash_gluon_v1.py [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import triton

import impl.attention.flash_gluon as fg

REDUCE = "                _tma_reduce_add(dqacc_desc, [b_i, h_i, q_start, 0], dq_smem)\n"
VARIANTS = {  # name -> (old, new) in the module source
    "fused": None,
    "no_reduce": (REDUCE, "                pass\n"),
    "reduce_from_one_warpgroup": (REDUCE, "                if (key_start // BLOCK_N) % 2 == 0:\n    " + REDUCE),
    "no_dq_staging": ("            if FUSE_DQ:\n                tma.store_wait(0)", "            if False:\n                tma.store_wait(0)"),
}
SHAPES = [(1, 16, 16384, 64, True), (4, 16, 4096, 64, False)]


def load_variant(name, change, folder, source: str):
    src = source if change is None else source.replace(*change)
    if change is not None and src == source:
        raise SystemExit(f"{name}: its line is not in the module given; pass --source, the schedule the cuts are for")
    path = Path(folder) / f"gluon_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"gluon_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--source", default=fg.__file__, help="the copy of flash_gluon.py to cut (see the docstring)")
    a = p.parse_args()
    source = Path(a.source).read_text()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        mods = {name: load_variant(name, change, folder, source) for name, change in VARIANTS.items()}
        for b, h, n, d, causal in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(n)
            q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
            o, lse = fg.flash_forward(q, k, v, causal)
            q4, k4, v4, do4, o4 = q, k, v, do, o
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            delta = torch.empty_like(lse)
            dq_acc = torch.zeros(b, h, n, d, device="cuda", dtype=torch.float32)
            times = {}
            torch.use_deterministic_algorithms(True)
            seven = fg._BackwardPlan(q, k, v, o, lse, do, causal, None)
            torch.use_deterministic_algorithms(False)
            times["seven: dQ kernel"] = lambda: seven.dq(q4, do4, k4, v4, o4, do4, dq, lse, delta)
            times["seven: dK/dV kernel"] = lambda: seven.dkdv(k4, v4, q4, do4, q4, dk, dv, lse, delta)
            for name, mod in mods.items():
                plan = mod._BackwardPlan(q, k, v, o, lse, do, causal, None)
                times[f"five {name}: dK/dV kernel"] = (lambda plan=plan: plan.dkdv(k4, v4, q4, do4, dq_acc, dk, dv, lse, delta))
                if name == "fused":
                    times["five: preprocess"] = lambda plan=plan: plan.pre(o4, do4, delta, dq_acc)
                    times["five: convert"] = lambda plan=plan: plan.convert(dq_acc, dq)
                    times["five: whole backward"] = lambda mod=mod: mod.flash_backward(q, k, v, o, lse, do, causal)
            times["seven: whole backward"] = lambda: seven(q, k, v, o, lse, do)
            med = {}
            for name, fn in times.items():
                fn()
                med[name] = statistics.median(triton.testing.do_bench(fn) for _ in range(3))
            row = {"shape": f"B{b} H{h} N{n} d{d} {'causal' if causal else 'full'}", **med}
            rows.append(row)
            print(json.dumps(row, indent=1), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dq_reduce_ablation.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
