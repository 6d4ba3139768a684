"""Short sequences, split into host time and device time, for our Triton attention and SDPA flash.

    PYTHONPATH=. python perf/scripts/attention_short_breakdown.py [--out DIR]

Host part: at the issue's short shapes, microseconds the host spends issuing each pass
(no synchronisation inside the loop) and the synchronised latency of one call, for the
forward with and without autograd recording, the backward alone (``.backward`` and
``autograd.grad``, graph retained) and forward + backward both ways.  Rounds interleave
the variants (the host's speed drifts); medians.  A torch.profiler table of the CPU ops of
forward + backward says where the host time goes.

Device part: the sum of kernel times per call (torch.profiler, CUDA activity) at batch 1,
one head (CS336's sweep), where a 128-row tile gives a few dozen programs on 132 SMs: the
default configs against smaller tiles, beside SDPA flash's kernels.  Kernel sums leave out
the host, which decides a do_bench time at these sizes.
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
from torch.profiler import ProfilerActivity, profile

from impl.attention import flash_triton as ft
from perf.lib.measure import kernel_us_per_call
from perf.lib.workloads import cuda_attention_inputs


def _inputs(b, h, n, d, dtype=torch.bfloat16):
    return cuda_attention_inputs(b, h, n, d, dtype)


def _host_and_latency(fn, calls, clear):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        clear()
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    lat = []
    for _ in range(calls // 2):
        clear()
        s = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - s) * 1e6)
    return host, statistics.median(lat)


def _passes(attn, q, k, v, do):
    kept = attn(q, k, v)

    def fwd():
        return attn(q, k, v)

    def fwd_nograd():
        with torch.no_grad():
            return attn(q, k, v)

    return {
        "forward": fwd,
        "forward_no_grad": fwd_nograd,
        "backward .backward": lambda: kept.backward(do, retain_graph=True),
        "backward autograd.grad": lambda: torch.autograd.grad(kept, (q, k, v), do, retain_graph=True),
        "fwd+bwd .backward": lambda: attn(q, k, v).backward(do),
        "fwd+bwd autograd.grad": lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), do),
    }


def _cpu_table(fn, calls, clear, rows=22):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            clear()
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def _kernel_us(fn, calls=10):
    """Device microseconds per call, all kernels together."""
    return round(sum(kernel_us_per_call(fn, calls).values()), 2)


def host_part(out, shapes, calls, rounds):
    ours = lambda q, k, v: ft.FlashAttentionTriton.apply(q, k, v, True)  # noqa: E731

    def flash(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    impls = {"triton": ours, "sdpa_flash": flash}
    result = {}
    for shape in shapes:
        q, k, v, do = _inputs(*shape)

        def clear():
            q.grad = k.grad = v.grad = None

        passes = {name: _passes(attn, q, k, v, do) for name, attn in impls.items()}
        samples = {(i, p): [] for i in impls for p in passes["triton"]}
        for _ in range(rounds):
            for i in impls:
                for p, fn in passes[i].items():
                    samples[(i, p)].append(_host_and_latency(fn, calls, clear))
        tag = "B{} H{} N{} d{}".format(*shape)
        rows = {}
        for (i, p), s in samples.items():
            rows[f"{i} | {p}"] = dict(host_us=round(statistics.median(x[0] for x in s), 1),
                                      latency_us=round(statistics.median(x[1] for x in s), 1),
                                      host_rounds=[round(x[0], 1) for x in s])
            print(tag, i, p, rows[f"{i} | {p}"], flush=True)
        result[tag] = rows
        for i in impls:
            table = _cpu_table(passes[i]["fwd+bwd .backward"], 20, clear)
            (out / f"cpu_ops_{i}_{tag.replace(' ', '_')}.txt").write_text(table)
    return result


FWD = {"default": None, "64x64 w4 s2": (64, 64, 4, 2), "64x32 w4 s2": (64, 32, 4, 2), "32x64 w4 s2": (32, 64, 4, 2)}
BWD = {"default": None, "64,64,64,64 w4 s2": (64, 64, 64, 64, 4, 2), "32,64,64,32 w4 s2": (32, 64, 64, 32, 4, 2),
       "64,32,32,64 w4 s2": (64, 32, 32, 64, 4, 2), "32,32,32,32 w4 s2": (32, 32, 32, 32, 4, 2)}


def device_part(seqs, dims):
    rows = []
    for d in dims:
        for causal in (True, False):
            for n in seqs:
                q, k, v, do = _inputs(1, 1, n, d)
                qd, kd, vd = (t.detach() for t in (q, k, v))
                scale = d ** -0.5
                o, lse = ft.flash_forward(qd, kd, vd, causal)
                row = dict(d=d, causal=causal, n=n, fwd={}, bwd={})
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    row["flash_fwd"] = _kernel_us(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal))
                    of = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    row["flash_bwd"] = _kernel_us(lambda: torch.autograd.grad(of, (q, k, v), do, retain_graph=True))
                for name, c in FWD.items():
                    cfg = None if c is None else ft.ForwardConfig(*c, longest_first=causal,
                                                                  tma=(d == 128))
                    try:
                        row["fwd"][name] = _kernel_us(lambda: ft.flash_forward(qd, kd, vd, causal, config=cfg))
                    except Exception as exc:  # noqa: BLE001
                        row["fwd"][name] = type(exc).__name__
                for name, c in BWD.items():
                    cfg = None if c is None else ft.BackwardConfig(*c, 64, longest_first=causal, tma=True)
                    try:
                        row["bwd"][name] = _kernel_us(lambda: ft._backward(qd, kd, vd, o, lse, do, causal, scale,
                                                                           config=cfg))
                    except Exception as exc:  # noqa: BLE001
                        row["bwd"][name] = type(exc).__name__
                rows.append(row)
                print(row, flush=True)
    return rows


GRID_FWD = {"default": None, "64x64 w4 s2": (64, 64, 4, 2)}
GRID_BWD = {"default": None, "64,64,64,64 w4 s2": (64, 64, 64, 64, 4, 2), "32,64,64,32 w4 s2": (32, 64, 64, 32, 4, 2)}


def grid_part(heads, seqs):
    """Device time of the default tiles against the small-grid candidates as the number of
    programs grows (batch 1, ``heads`` heads): where the default table starts to win."""
    rows = []
    for d, causal in ((64, True), (64, False), (128, True), (128, False)):
        for h in heads:
            for n in seqs:
                q, k, v, do = _inputs(1, h, n, d)
                qd, kd, vd = (t.detach() for t in (q, k, v))
                o, lse = ft.flash_forward(qd, kd, vd, causal)
                row = dict(d=d, causal=causal, heads=h, n=n, fwd={}, bwd={})
                for name, c in GRID_FWD.items():
                    cfg = None if c is None else ft.ForwardConfig(*c, longest_first=causal, tma=(d == 128))
                    row["fwd"][name] = _kernel_us(lambda: ft.flash_forward(qd, kd, vd, causal, config=cfg), 5)
                for name, c in GRID_BWD.items():
                    cfg = None if c is None else ft.BackwardConfig(*c, 64, longest_first=causal, tma=True)
                    row["bwd"][name] = _kernel_us(lambda: ft._backward(qd, kd, vd, o, lse, do, causal, d ** -0.5,
                                                                       config=cfg), 5)
                rows.append(row)
                print(row, flush=True)
                del q, k, v, do, qd, kd, vd, o, lse
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="perf-out")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seq", nargs="+", type=int, default=[1024, 2048, 4096, 8192])
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--parts", nargs="+", default=["host", "device"])
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    result["triton"] = triton.__version__
    if "host" in a.parts:
        result["host"] = host_part(out, [(8, 16, 1024, 64), (1, 1, 128, 64)], a.calls, a.rounds)
    if "device" in a.parts:
        result["device_us"] = device_part(a.seq, a.dims)
    if "grid" in a.parts:
        result["grid_us"] = grid_part([1, 4, 16, 64], [1024, 4096, 16384])
    (out / "short_breakdown.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
