"""float32 tiles for the Triton attention: candidate forward and backward configs timed
side by side with the current default and SDPA's efficient backend (flash and cuDNN take
no float32), B=1, H=16, causal, N 1024 and 4096, d 64 and 128.

    PYTHONPATH=. python perf/scripts/attention_fp32_tiles.py [--out DIR]

Each candidate's O (forward) or dQ, dK, dV (backward) is also compared with the default's
(max abs difference, printed): a sanity check only; the suite's laws judge whichever
config becomes the default.  Times: triton.testing.do_bench medians (ms).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from impl.attention import flash_triton as ft

FWD = [(64, 32, 4, 2), (32, 32, 4, 2), (32, 32, 4, 1), (64, 64, 4, 2), (64, 32, 8, 2), (128, 32, 8, 2),
       (32, 64, 4, 2), (16, 32, 4, 2), (64, 16, 4, 2), (128, 64, 8, 2), (64, 64, 8, 3)]
BWD = [(64, 32, 64, 32, 4, 2), (32, 32, 32, 32, 4, 1), (32, 32, 32, 32, 4, 2), (64, 32, 64, 32, 8, 2),
       (64, 64, 64, 64, 8, 2), (32, 16, 32, 16, 4, 2), (16, 32, 16, 32, 4, 2), (64, 16, 64, 16, 8, 2),
       (128, 32, 128, 32, 8, 2), (64, 32, 64, 32, 8, 1)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--seq", nargs="+", type=int, default=[1024, 4096])
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    a = p.parse_args()
    rows = []
    for d in a.dims:
        for n in a.seq:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(1, 16, n, d, device="cuda", generator=g) for _ in range(4))
            o_ref, lse_ref = ft.flash_forward(q, k, v, True)
            grads_ref = ft.flash_backward(q, k, v, o_ref, lse_ref, do, True)
            default_f = ft.default_forward_config(torch.float32, d, q.device)
            default_b = ft.default_backward_config(torch.float32, d, q.device, True)
            sdpa_f = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), return_mode="median")
            rows.append(dict(d=d, n=n, kind="sdpa_efficient_fwd", config=None, ms=sdpa_f, diff=None))
            print(f"d={d} N={n} sdpa fwd {sdpa_f:.3f} ms  default fwd {default_f}  bwd {default_b}", flush=True)
            for bm, bn, w, s in FWD:
                cfg = ft.ForwardConfig(bm, bn, w, s)
                try:
                    o, _ = ft.flash_forward(q, k, v, True, config=cfg)
                    ms = do_bench(lambda: ft.flash_forward(q, k, v, True, config=cfg), return_mode="median")
                    diff = float((o - o_ref).abs().max())
                except Exception as exc:  # noqa: BLE001 - a config that does not fit is a row
                    ms, diff = None, f"{type(exc).__name__}: {str(exc)[:80]}"
                rows.append(dict(d=d, n=n, kind="fwd", config=[bm, bn, w, s], ms=ms, diff=diff))
                print(f"  fwd {bm:4d} {bn:4d} w{w} s{s}: {ms if ms is None else round(ms, 3)} ms  diff {diff}", flush=True)
            for dn, dm, qm, qn, w, s in BWD:
                cfg = ft.BackwardConfig(dn, dm, qm, qn, w, s, 64)
                try:
                    got = ft.flash_backward(q, k, v, o_ref, lse_ref, do, True, config=cfg)
                    ms = do_bench(lambda: ft.flash_backward(q, k, v, o_ref, lse_ref, do, True, config=cfg),
                                  return_mode="median")
                    diff = max(float((x - y).abs().max()) for x, y in zip(got, grads_ref))
                except Exception as exc:  # noqa: BLE001
                    ms, diff = None, f"{type(exc).__name__}: {str(exc)[:80]}"
                rows.append(dict(d=d, n=n, kind="bwd", config=[dn, dm, qm, qn, w, s], ms=ms, diff=diff))
                print(f"  bwd {dn} {dm} {qm} {qn} w{w} s{s}: {ms if ms is None else round(ms, 3)} ms  diff {diff}",
                      flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp32_tiles.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                                         rows=rows), indent=1))


if __name__ == "__main__":
    main()
