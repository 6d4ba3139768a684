"""Tiles for few programs: at batch 1 and one head (CS336's sweep) a length-4096 sequence
gives the default 128-row tiles 32 programs on a 132-SM H100, and the time is one program's
latency.  Candidate forward and backward configs timed against the default and SDPA flash,
bf16, B=1, H=1, causal and not, d 64 and 128, N 2048 to 65536.

    PYTHONPATH=. python perf/scripts/attention_small_grids.py [--out DIR] [--seq ...]

Times: triton.testing.do_bench medians (ms); forward, and backward alone from a saved O, L.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from impl.attention import flash_triton as ft

FWD = [None, (64, 64, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2), (64, 128, 8, 2), (32, 32, 4, 2)]
BWD = [None, (64, 64, 64, 64, 4, 2), (32, 64, 64, 32, 4, 2), (32, 32, 32, 32, 4, 2), (64, 32, 64, 32, 4, 2),
       (32, 64, 32, 64, 4, 2)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--seq", nargs="+", type=int, default=[2048, 4096, 8192, 16384, 32768])
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--rep", type=int, default=30)
    a = p.parse_args()
    rows = []
    for d in a.dims:
        for causal in (True, False):
            for n in a.seq:
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (torch.randn(1, 1, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                               for _ in range(4))
                o, lse = ft.flash_forward(q, k, v, causal)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                    fl_f = do_bench(lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal),
                                    rep=a.rep, return_mode="median")
                    oo = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                    fl_b = do_bench(lambda: oo.backward(do, retain_graph=True), rep=a.rep, return_mode="median",
                                    grad_to_none=[qq, kk, vv])
                row = dict(d=d, causal=causal, n=n, flash_fwd=fl_f, flash_bwd=fl_b, fwd={}, bwd={})
                for c in FWD:
                    cfg = None if c is None else ft.ForwardConfig(*c)
                    try:
                        ms = do_bench(lambda: ft.flash_forward(q, k, v, causal, config=cfg), rep=a.rep,
                                      return_mode="median")
                    except Exception as exc:  # noqa: BLE001
                        ms = f"{type(exc).__name__}"
                    row["fwd"][str(c)] = ms
                for c in BWD:
                    cfg = None if c is None else ft.BackwardConfig(*c, 64)
                    try:
                        ms = do_bench(lambda: ft.flash_backward(q, k, v, o, lse, do, causal, config=cfg), rep=a.rep,
                                      return_mode="median")
                    except Exception as exc:  # noqa: BLE001
                        ms = f"{type(exc).__name__}"
                    row["bwd"][str(c)] = ms
                rows.append(row)
                fmt = lambda x: f"{x:.3f}" if isinstance(x, float) else x  # noqa: E731
                print(f"d={d} causal={causal} N={n}: flash fwd {fl_f:.3f} bwd {fl_b:.3f} | ours fwd "
                      + " ".join(f"{k}={fmt(v)}" for k, v in row["fwd"].items()) + " | bwd "
                      + " ".join(f"{k}={fmt(v)}" for k, v in row["bwd"].items()), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "small_grids.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
