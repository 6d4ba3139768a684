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

ROOT = Path(__file__).resolve().parents[2]  # the repository: pytest runs there

import torch  # noqa: E402

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


def _fwd_bwd(fn, q, k, v, do, causal, scale):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal, scale)
    if isinstance(out, tuple):
        o, lse = out
    else:
        o = out
        lse = [t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1]]
        assert len(lse) == 1, f"expected one saved tensor of shape {tuple(q.shape[:-1])}"
        lse = lse[0]
    o.backward(do)
    return {"O": o.detach(), "L": lse.detach(), "dQ": q.grad, "dK": k.grad, "dV": v.grad}


def _triton_fn(fwd_cfg, bwd_cfg):
    from impl.attention import flash_triton as ft

    if fwd_cfg is None and bwd_cfg is None:
        return ft.FlashAttentionTriton.apply

    class WithConfig(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            o, lse = ft.flash_forward(q, k, v, causal, scale, config=fwd_cfg)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.scale = causal, scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            return (*ft.flash_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, config=bwd_cfg), None, None)

    return WithConfig.apply


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
                got = _fwd_bwd(fn, q, k, v, do, causal, scale)
            if device.type == "cuda":
                torch.cuda.synchronize()
        q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
        ref = _fwd_bwd(lambda *a: attention_reference(*a), q64, k64, v64, do64, causal, s)
        eager = _fwd_bwd(lambda *a: attention_reference(*a), q, k, v, do, causal, s)
        mags = attention_magnitudes(q64, k64, v64, do64, causal, s)
        ratios, failures = {}, []
        for key in ref:
            want = torch.float32 if key == "L" else dtype
            if got[key].dtype != want:
                failures.append(f"{key} dtype {got[key].dtype}, expected {want}")
                continue
            verdict = oracle.judge(key, got[key], ref[key], eager[key], dtype=dtype, magnitude=mags[key])
            ratios[key] = round(verdict.error / max(verdict.bound, 1e-300), 4)
            if not verdict.ok:
                failures.append(verdict.message())
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
        device = torch.device(DEVICE)
        g = torch.Generator(device=device).manual_seed(d * 1000 + n_k)
        q = (4 * torch.randn(2, 3, 1, d, generator=g, device=device)).to(dtype).requires_grad_()
        k = (4 * torch.randn(2, 3, n_k, d, generator=g, device=device)).to(dtype).requires_grad_()
        v = torch.randn(2, 3, n_k, d, generator=g, device=device).to(dtype).requires_grad_()
        do = torch.randn(2, 3, 1, d, generator=g, device=device).to(dtype)
        o = FlashAttentionTriton.apply(q, k, v, True)
        o.backward(do)
        checks = {
            "O_0 == V_0": torch.equal(o[..., 0, :], v[..., 0, :]),
            "dV_0 == dO_0": torch.equal(v.grad[..., 0, :], do[..., 0, :]),
            "dV_j>0 == 0": bool((v.grad[..., 1:, :] == 0).all()),
            "dK_j>0 == 0": bool((k.grad[..., 1:, :] == 0).all()),
        }
        gap = float((v.grad[..., 0, :].double() - do[..., 0, :].double()).abs().max())
        return dict(name=name, status="ok" if all(checks.values()) else "FAIL", checks=checks, dv0_max_gap=gap)
    except Exception as exc:
        return dict(name=name, status="ERROR", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-3000:])


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


def attention_flops(b, h, n, d, causal, backward):
    fwd = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)  # two matmuls, half the tiles under causal
    return fwd * (3.5 if backward else 1.0)  # backward: five matmuls against the forward's two


def run_timing(deadline: float) -> dict:
    from triton.testing import do_bench
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from impl.attention import flash_triton as ft

    b, h, n, d, dtype = 1, 16, 16384, 64, BF16
    results = {"shape": dict(B=b, H=h, N=n, d=d, dtype="bfloat16")}
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, generator=g, device=device).to(dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()

    def bench(label, fn, causal, backward, grads=None):
        if time.time() > deadline:
            results[label] = "skipped: out of time"
            return
        try:
            ms = do_bench(fn, grad_to_none=grads, return_mode="median")
            tflops = attention_flops(b, h, n, d, causal, backward) / (ms * 1e-3) / 1e12
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
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    for causal in (True, False):
        tag = "causal" if causal else "full"
        tri = lambda causal=causal: ft.FlashAttentionTriton.apply(q, k, v, causal)  # noqa: E731
        with torch.no_grad():
            bench(f"triton fwd {tag}", tri, causal, False)
        bench(f"triton fwd+bwd {tag}", fwd_bwd(tri), causal, True, [q, k, v])
        for backend_name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(backend):
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
            tflops = attention_flops(b, h, n, d, True, True) / 3.5 * 2.5 / (ms * 1e-3) / 1e12
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
