"""GPU check of the Triton FlashAttention-2 (impl/attention/flash_triton.py): compiles, is right, first timings.

    PYTHONUNBUFFERED=1 python3 -m perf.tune.attention_gpu_check [--budget SECONDS] [--out DIR]

1. Correctness: fixed cases across fp32/fp16/bf16, head dims 8..256, N = 1, N_q != N_k,
   causal or not, batch shapes (), (B,), (B, H), 5-D, non-contiguous layouts; O, L, dQ,
   dK, dV against float64 through conformance.oracle, with poisoned allocations.  Cases run
   in a pool of processes so that the kernels compile in parallel.
2. Score-consistency probe: one query row under causal masking sees only key 0, so P = 1
   and dV_0 must equal dO_0 bit for bit; that holds only if the forward and the dK/dV
   kernel compute that score to the same bit.
3. Timing (triton.testing.do_bench, median): B=1, H=16, N=16384, d=64, bf16, causal,
   forward and forward+backward, next to torch SDPA (flash and cuDNN backends), plus a few
   tile configurations as data for later tuning.
4. If time is left: the attention properties (Triton flavour) under pytest --device cuda.

Results go to stdout and to OUT/attention_gpu_check.json (OUT: --out, else $OUT, else .).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
import zlib
from pathlib import Path

import torch

from perf.lib.workloads import attention_flops, make_inputs, sdpa_attention, sdpa_backend
from perf.tune import checks

ROOT = Path(__file__).resolve().parents[2]  # the repository: pytest runs there

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# cuda; "cpu" (with TRITON_INTERPRET=1) only to dry-run the case code without a GPU
DEVICE = os.environ.get("ATTENTION_CHECK_DEVICE", "cuda")

# (batch, n_q, n_k, d, causal, dtype, layout, scale, config override or None)
CASES = [
    ((2, 3), 65, 65, 64, True, F32, "contig", None, None),
    ((2,), 1, 1, 64, True, F32, "contig", None, None),
    ((2,), 129, 77, 80, False, F32, "contig", None, None),
    ((1, 2), 200, 300, 128, True, F32, "bnhd", None, None),
    ((2,), 33, 190, 256, True, F32, "contig", None, None),
    ((3,), 17, 17, 24, False, F32, "slice", 0.3, None),
    ((2,), 257, 257, 8, True, F32, "contig", None, None),
    ((2,), 1, 1, 16, True, F16, "contig", None, None),
    ((2, 2), 127, 129, 32, True, F16, "bnhd", None, None),
    ((1, 2), 1000, 1000, 64, True, F16, "bnhd", None, None),
    ((2,), 300, 150, 80, True, F16, "contig", None, None),
    ((2,), 64, 300, 96, False, F16, "contig", 2.0, None),
    ((1, 2), 513, 513, 128, True, F16, "bnhd", None, None),
    ((2,), 70, 90, 200, True, F16, "slice", None, None),
    ((1, 2), 256, 256, 256, True, F16, "bnhd", None, None),
    ((1, 4), 1024, 1024, 64, True, BF16, "bnhd", None, None),
    ((2,), 1, 1, 80, True, BF16, "contig", None, None),
    ((2,), 300, 299, 128, False, BF16, "contig", None, None),
    ((2,), 129, 257, 256, True, BF16, "contig", None, None),
    ((3,), 55, 55, 24, True, BF16, "contig", 1.0, None),
    ((2, 2, 2), 70, 70, 64, True, BF16, "contig", None, None),
    ((2,), 100, 333, 64, True, BF16, "contig", None, None),
    ((1, 2), 190, 190, 64, True, F16, "bnhd", None,
     (dict(block_m=64, block_n=64, num_warps=4, num_stages=2),
      dict(dkdv_block_n=64, dkdv_block_m=64, dq_block_m=64, dq_block_n=64, num_warps=4, num_stages=2))),
]

# (dtype, d, n_k) for the single-key probe
PROBES = [(F32, 64, 50), (F16, 64, 50), (BF16, 64, 50), (F32, 80, 130), (BF16, 128, 70), (F16, 256, 33),
          (F32, 24, 20), (F32, 128, 200), (F32, 256, 40), (F16, 80, 90)]


def _make(shape, dtype, layout, device, g):
    *lead, n, d = shape
    if layout == "bnhd" and len(lead) >= 2:
        t = torch.randn(*lead[:-1], n, lead[-1], d, generator=g, device=device).to(dtype).transpose(-2, -3)
    elif layout == "slice":
        t = torch.randn(*lead, n, 2 * d, generator=g, device=device).to(dtype)[..., ::2]
    else:
        t = torch.randn(*shape, generator=g, device=device).to(dtype)
    return t


def _triton_fn(fwd_cfg, bwd_cfg):
    from impl.attention import flash_triton as ft

    if fwd_cfg is None and bwd_cfg is None:
        return ft.FlashAttentionTriton.apply
    return checks.configured_attention(fwd_cfg, bwd_cfg)


def run_case(case) -> dict:
    from conformance import oracle
    from conformance.laws.attention.magnitudes import attention_magnitudes
    from impl.attention.reference import attention_reference, default_scale

    batch, n_q, n_k, d, causal, dtype, layout, scale, cfg = case
    name = f"b={batch} nq={n_q} nk={n_k} d={d} causal={causal} {str(dtype)[6:]} {layout} scale={scale}" + (
        " config-override" if cfg else "")
    device = torch.device(DEVICE)
    g = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
    t0 = time.time()
    try:
        q, do = (_make((*batch, n_q, d), dtype, layout, device, g) for _ in range(2))
        k, v = (_make((*batch, n_k, d), dtype, layout, device, g) for _ in range(2))
        s = default_scale(d) if scale is None else scale
        fn = _triton_fn(*(cfg or (None, None)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with oracle.poisoned_allocations(device):
                got = checks.fwd_bwd(fn, q, k, v, do, causal, scale)
            if device.type == "cuda":
                torch.cuda.synchronize()
        q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
        ref = checks.fwd_bwd(attention_reference, q64, k64, v64, do64, causal, s)
        eager = checks.fwd_bwd(attention_reference, q, k, v, do, causal, s)
        mags = attention_magnitudes(q64, k64, v64, do64, causal, s)
        ratios, failures = checks.compare_with_reference(got, ref, eager, dtype, mags, digits=4)
        notes = [str(w.message) for w in caught if "retrying" in str(w.message)]
        return dict(name=name, status="FAIL" if failures else "ok", ratios=ratios, failures=failures,
                    notes=notes, seconds=round(time.time() - t0, 2))
    except Exception as exc:  # report and go on: one broken case must not hide the others
        return dict(name=name, status="ERROR", error=f"{type(exc).__name__}: {exc}",
                    trace=traceback.format_exc()[-3000:], seconds=round(time.time() - t0, 2))


def run_probe(probe) -> dict:
    """n_q = 1 under causal masking: P_00 = 1, so O_0 = V_0 and dV_0 = dO_0 exactly."""
    from impl.attention.flash_triton import FlashAttentionTriton

    dtype, d, n_k = probe
    name = f"probe {str(dtype)[6:]} d={d} n_k={n_k}"
    try:
        q, k, v, do = checks.probe_inputs(dtype, d, n_k, torch.device(DEVICE))
        for t in (q, k, v):
            t.requires_grad_()
        o = FlashAttentionTriton.apply(q, k, v, True)
        o.backward(do)
        found = checks.probe_checks(o, k.grad, v.grad, v, do)
        gap = float((v.grad[..., 0, :].double() - do[..., 0, :].double()).abs().max())
        return dict(name=name, status="ok" if all(found.values()) else "FAIL", checks=found, dv0_max_gap=gap)
    except Exception as exc:
        return dict(name=name, status="ERROR", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-3000:])


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


def run_timing(deadline: float) -> dict:
    from triton.testing import do_bench

    from impl.attention import flash_triton as ft

    b, h, n, d, dtype = 1, 16, 16384, 64, BF16
    results = {"shape": dict(B=b, H=h, N=n, d=d, dtype="bfloat16")}
    device = torch.device("cuda")
    q, k, v, do = make_inputs((b, h, n, d), dtype, device, seed=0)

    def bench(label, fn, causal, backward, grads=None):
        if time.time() > deadline:
            results[label] = "skipped: out of time"
            return
        try:
            ms = do_bench(fn, grad_to_none=grads, return_mode="median")
            tflops = attention_flops(b, h, n, d, causal, "forward_backward" if backward else "forward") / (ms * 1e-3) / 1e12
            results[label] = dict(ms=round(ms, 3), tflops=round(tflops, 1))
            print(f"  {label:55s} {ms:8.3f} ms  {tflops:6.1f} TFLOP/s", flush=True)
        except Exception as exc:
            results[label] = f"error: {type(exc).__name__}: {exc}"
            print(f"  {label:55s} error: {type(exc).__name__}: {exc}", flush=True)

    def fwd_bwd(call):
        def run():
            o = call()
            o.backward(do)
        return run

    def sdpa(causal):
        return lambda: sdpa_attention(q, k, v, causal)

    for causal in (True, False):
        tag = "causal" if causal else "full"
        tri = lambda causal=causal: ft.FlashAttentionTriton.apply(q, k, v, causal)  # noqa: E731
        with torch.no_grad():
            bench(f"triton fwd {tag}", tri, causal, False)
        bench(f"triton fwd+bwd {tag}", fwd_bwd(tri), causal, True, [q, k, v])
        for backend_name in ("flash", "cudnn"):
            with sdpa_backend(backend_name):
                with torch.no_grad():
                    bench(f"sdpa {backend_name} fwd {tag}", sdpa(causal), causal, False)
                bench(f"sdpa {backend_name} fwd+bwd {tag}", fwd_bwd(sdpa(causal)), causal, True, [q, k, v])

    # A few tile configurations around the defaults, as data for later tuning (causal only).
    fwd_configs = [
        ft.ForwardConfig(128, 64, 4, 3), ft.ForwardConfig(128, 64, 8, 3), ft.ForwardConfig(128, 128, 8, 3),
        ft.ForwardConfig(64, 64, 4, 3), ft.ForwardConfig(128, 32, 4, 4),
    ]
    for cfg in fwd_configs:
        with torch.no_grad():
            bench(f"triton fwd causal {cfg}", lambda cfg=cfg: ft.flash_forward(q, k, v, True, config=cfg), True, False)
    with torch.no_grad():
        o, lse = ft.flash_forward(q, k, v, True)
    bwd_configs = [
        ft.BackwardConfig(128, 32, 128, 32, 4, 3, 128), ft.BackwardConfig(128, 64, 128, 64, 8, 2, 128),
        ft.BackwardConfig(64, 64, 64, 64, 4, 2, 128), ft.BackwardConfig(128, 32, 64, 64, 4, 3, 128),
    ]
    for cfg in bwd_configs:
        def bwd_only(cfg=cfg):
            ft.flash_backward(q, k, v, o, lse, do, True, config=cfg)
        if time.time() > deadline:
            break
        try:
            ms = do_bench(bwd_only, return_mode="median")
            tflops = attention_flops(b, h, n, d, True, "backward") / (ms * 1e-3) / 1e12
            results[f"triton bwd-only causal {cfg}"] = dict(ms=round(ms, 3), tflops=round(tflops, 1))
            print(f"  triton bwd-only causal {cfg}: {ms:.3f} ms  {tflops:.1f} TFLOP/s", flush=True)
        except Exception as exc:
            results[f"triton bwd-only causal {cfg}"] = f"error: {type(exc).__name__}: {exc}"
            print(f"  triton bwd-only causal {cfg}: error {type(exc).__name__}: {exc}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=280.0, help="seconds this script may take in all")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--no-properties", action="store_true")
    args = parser.parse_args()
    start = time.time()
    deadline = start + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("needs a GPU: no CUDA device is visible")
        return 2

    import triton

    report = {
        "device": torch.cuda.get_device_name(0),
        "capability": torch.cuda.get_device_capability(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    print(json.dumps(report), flush=True)

    def save():
        (out / "attention_gpu_check.json").write_text(json.dumps(report, indent=1, default=str))

    # 1 + 2: correctness and the probe, compiled in parallel processes
    import concurrent.futures as cf
    import multiprocessing as mp

    print(f"\n== correctness: {len(CASES)} cases, {len(PROBES)} probes ({args.workers} processes)", flush=True)
    results = []
    with cf.ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(run_case, c) for c in CASES] + [pool.submit(run_probe, p) for p in PROBES]
        for fut in cf.as_completed(futures):
            r = fut.result()
            results.append(r)
            line = f"[{r['status']:5s}] {r['name']}"
            if "ratios" in r:
                line += f"  err/bound {r['ratios']}  {r['seconds']}s"
            if "checks" in r:
                line += f"  {r['checks']}  max|dV_0 - dO_0| = {r['dv0_max_gap']:.3e}"
            print(line, flush=True)
            for msg in r.get("failures", []) + r.get("notes", []):
                print(f"        {msg}", flush=True)
            if "error" in r:
                print(f"        {r['error']}\n{r['trace']}", flush=True)
    report["correctness"] = results
    n_bad = sum(r["status"] != "ok" for r in results)
    print(f"== correctness: {len(results) - n_bad} ok, {n_bad} not ok  ({time.time() - start:.0f}s)", flush=True)
    save()

    # 3: timing
    print("\n== timing (do_bench median)", flush=True)
    try:
        report["timing"] = run_timing(deadline - 40)
    except Exception as exc:
        report["timing"] = f"error: {type(exc).__name__}: {exc}"
        traceback.print_exc()
    save()

    # 4: the property suite, if time is left
    left = deadline - time.time() - 5
    if not args.no_properties and left > 30:
        print(f"\n== properties/test_attention.py -k triton --device cuda ({left:.0f}s left)", flush=True)
        cmd = [sys.executable, "-m", "pytest", "properties/test_attention.py", "-k", "triton", "--device", "cuda",
               "--hypothesis-profile", "ci", "-q", "-p", "no:cacheprovider", "-x"]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=left)
            tail = (proc.stdout + proc.stderr)[-4000:]
            report["properties"] = dict(rc=proc.returncode, tail=tail)
        except subprocess.TimeoutExpired as exc:
            tail = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or ""))[-4000:]
            report["properties"] = dict(rc="timeout", tail=tail)
        print(report["properties"]["tail"], flush=True)
        save()
    print(f"\ndone in {time.time() - start:.0f}s", flush=True)
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
