"""Registers, spills and shared memory of the Triton FlashAttention-2 kernels on sm_90, without a GPU.

    python -m perf.tune.attention_sm90_report [--match TEXT] [--out FILE.json]

Compiles each candidate of perf/tune/tune_attention.py (and the current defaults) ahead of time
for an H100 (sm_90, CUDA target, the anchor shapes' argument specialisation: bf16,
contiguous, full tiles) with Triton's own compiler and the ptxas it ships, and prints per
kernel: registers per thread, spill stores/loads (bytes), shared memory, and the number of
wgmma and TMA (cp.async.bulk.tensor) instructions in the PTX.  Costs no device time; use it
to drop configs that spill or cannot fit before spending a GPU run on them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

try:
    from triton._C.libtriton import native_specialize_impl  # Triton 3.4+
except ImportError:  # pragma: no cover
    native_specialize_impl = None


def compile_sm90(kernel, args: tuple, constexprs: dict, num_warps: int, num_stages: int, fp_fusion: bool) -> dict:
    """Compile a @triton.jit kernel for sm_90 as the launcher would specialise it for ``args``."""
    sig, consts, attrs = {}, {}, {}
    runtime = iter(args)
    for i, p in enumerate(kernel.params):
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            consts[(i,)] = constexprs[p.name]
            continue
        arg = next(runtime)
        ty, attr = native_specialize_impl(BaseBackend, arg, False, not p.do_not_specialize, True)
        sig[p.name] = ty
        if ty == "constexpr":  # an int equal to 1 becomes a constant, as at launch
            consts[(i,)] = attr
        elif isinstance(attr, str) and attr:
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    t0 = time.time()
    compiled = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=fp_fusion))
    seconds = time.time() - t0
    ptx = compiled.asm["ptx"]
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.o")],
                              capture_output=True, text=True)
    info = proc.stdout + proc.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    return dict(regs=int(regs.group(1)) if regs else None,
                spill_bytes=[int(spills.group(1)), int(spills.group(2))] if spills else None,
                shared_bytes=compiled.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                tma=ptx.count("cp.async.bulk.tensor"), compile_s=round(seconds, 1))


def kernels_of(cand, anchor) -> dict:
    """name -> (kernel, args, constexprs, warps, stages, fusion) as the launcher would call them."""
    from impl.attention import flash_triton as ft

    b, h, n, d = anchor.batch, anchor.heads, anchor.n, anchor.d
    t = torch.empty(b, h, n, d, dtype=torch.bfloat16)
    vec = torch.empty(b, h, n, dtype=torch.float32)
    cfg = cand.config_dict
    dots = dict(DOT_PRECISION="tf32", DOT_IN_FP32=False, INTERPRETED=False)
    block_d = max(16, triton.next_power_of_2(d))
    causal = anchor.causal
    if cand.kind == "fwd":
        c = ft.ForwardConfig(**cfg)
        splits = triton.cdiv(n, c.split_keys) if c.split_keys else 1
        args = (t, t, t, t, vec, vec, vec, *t.stride() * 4, h, n, n, n // c.block_m, splits, 0.125, 0.18)
        ce = dict(HEAD_DIM=d, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_D=block_d, IS_CAUSAL=causal,
                  LONGEST_FIRST=c.longest_first and causal, USE_TMA=c.tma, SPLIT_KEYS=c.split_keys, **dots)
        return {"fwd": (ft._flash_fwd_kernel, args, ce, c.num_warps, c.num_stages, c.fp_fusion)}
    c = ft.BackwardConfig(**cfg)
    lpt = c.longest_first and causal
    dkdv_args = (t, t, t, t, vec, vec, t, t, vec, *t.stride() * 6, h, n, n, n // c.dkdv_block_n, 0.125)
    dkdv_ce = dict(HEAD_DIM=d, BLOCK_M=c.dkdv_block_m, BLOCK_N=c.dkdv_block_n, BLOCK_D=block_d, IS_CAUSAL=causal,
                   KEYS_EVEN=True, LONGEST_FIRST=lpt, USE_TMA=c.tma, ATOMIC_DQ=c.dq_atomic, **dots)
    dq_args = (t, t, t, t, t, vec, vec, t, *t.stride() * 6, h, n, n, n // c.dq_block_m, 0.125)
    dq_ce = dict(HEAD_DIM=d, BLOCK_M=c.dq_block_m, BLOCK_N=c.dq_block_n, BLOCK_D=block_d, IS_CAUSAL=causal,
                 LONGEST_FIRST=lpt, USE_TMA=c.tma, **dots)
    return {
        "dkdv": (ft._flash_bwd_dkdv_kernel, dkdv_args, dkdv_ce, c.num_warps, c.num_stages, False),
        "dq": (ft._flash_bwd_dq_kernel, dq_args, dq_ce, c.dq_num_warps or c.num_warps,
               c.dq_num_stages or c.num_stages, False),
    }


def main() -> int:
    from perf.tune import tune_attention as tune

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--match", default="", help="only candidates whose name contains this")
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    args = parser.parse_args()
    if native_specialize_impl is None:
        print("needs Triton 3.4 or newer (native_specialize_impl)")
        return 2
    cands = [c for c in tune.default_candidates(tune.ANCHORS) + tune.sweep_candidates() if args.match in c.name]
    rows, seen = [], {}
    print(f"{'candidate':72s} {'kernel':5s} {'regs':>4s} {'spill st/ld':>11s} {'smem KB':>7s} {'wgmma':>5s} {'tma':>4s}")
    for cand in cands:
        for kname, (kernel, kargs, ce, warps, stages, fusion) in kernels_of(cand, tune.ANCHORS[cand.anchor]).items():
            key = (kname, tuple(sorted(ce.items())), warps, stages, fusion)
            try:
                r = seen[key] if key in seen else compile_sm90(kernel, kargs, ce, warps, stages, fusion)
            except Exception as exc:  # a config that does not compile is a finding, not a crash
                r = dict(error=f"{type(exc).__name__}: {exc}"[:300])
            seen[key] = r
            rows.append(dict(candidate=cand.name, kernel=kname, **r))
            if "error" in r:
                print(f"{cand.name:72s} {kname:5s} error: {r['error'][:120]}", flush=True)
            else:
                spill = "/".join(map(str, r["spill_bytes"] or ["?"]))
                print(f"{cand.name:72s} {kname:5s} {r['regs']:4d} {spill:>11s} {r['shared_bytes'] / 1024:7.1f} "
                      f"{r['wgmma']:5d} {r['tma']:4d}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # compiling for a GPU, not interpreting
    sys.exit(main())
