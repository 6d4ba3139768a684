"""Does Triton warp-specialise our attention loops on sm_90?  Compiled without a GPU.

    PYTHONPATH=. python perf/scripts/attention_warp_specialize_probe.py

Compiles, for an H100 (sm_90, Triton's own compiler), a plain matmul loop over tensor
descriptors (the control: the case Triton's automatic warp specialisation is built for)
and each of our attention kernels with its key or query loop marked
``tl.range(..., warp_specialize=True)``, tiles through descriptors (TMA).  Prints per
kernel whether the TTGIR holds a ``ttg.warp_specialize`` region and how many ``setmaxnreg``
(the producer / consumer register split) the PTX has, or that the compiler failed.
The marked copy of the kernels is made from impl's source text in a temporary folder;
impl itself is not changed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compiling for a GPU, not interpreting

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOOPS = {"for start_n in range(lo, hi, BLOCK_N):": "for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):",
         "for start_m in range(lo, hi, BLOCK_M):": "for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=True):"}


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), warp_specialize=WS):
        a = a_desc.load([tl.program_id(0) * BM, k * BK])
        b = b_desc.load([tl.program_id(1) * BN, k * BK])
        acc = tl.dot(a, b.T, acc)
    c_desc.store([tl.program_id(0) * BM, tl.program_id(1) * BN], acc.to(tl.bfloat16))


def compile_sm90(kernel, sig: dict, consts: dict, attrs: dict, num_warps: int, num_stages: int) -> str:
    """'warp-specialised (N setmaxnreg)', 'not warp-specialised' or 'compiler failed: ...'."""
    try:
        k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=num_warps, num_stages=num_stages))
    except Exception as exc:  # noqa: BLE001 - a failed pass is the finding
        return f"compiler failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    if "ttg.warp_specialize" in k.asm["ttgir"]:
        return f"warp-specialised ({k.asm['ptx'].count('setmaxnreg')} setmaxnreg)"
    return "not warp-specialised"


def marked_kernels():
    """impl's attention kernels with their tile loops marked warp_specialize=True (a copy)."""
    text = (ROOT / "impl/attention/flash_triton.py").read_text()
    for plain, marked in LOOPS.items():
        assert plain in text, f"loop not found: {plain}"
        text = text.replace(plain, marked)
    text = text.replace("from .", "from impl.attention.")
    folder = Path(tempfile.mkdtemp())
    (folder / "flash_triton_ws.py").write_text(text)
    spec = importlib.util.spec_from_file_location("flash_triton_ws", folder / "flash_triton_ws.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def attention_signature(kernel, args, constexprs):
    from triton._C.libtriton import native_specialize_impl  # Triton 3.4+

    sig, consts, attrs = {}, {}, {}
    runtime = iter(args)
    for i, p in enumerate(kernel.params):
        if p.is_constexpr:
            sig[p.name], consts[(i,)] = "constexpr", constexprs[p.name]
            continue
        ty, attr = native_specialize_impl(BaseBackend, next(runtime), False, not p.do_not_specialize, True)
        sig[p.name] = ty
        if ty == "constexpr":
            consts[(i,)] = attr
        elif isinstance(attr, str) and attr:
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    return sig, consts, attrs


def main() -> int:
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "WS": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    print(f"Triton {triton.__version__}, sm_90")
    for ws in (False, True):
        consts = {(6,): ws, (7,): 128, (8,): 128, (9,): 64}
        print(f"matmul 128x128x64 w4 s3, warp_specialize={ws}: {compile_sm90(_matmul, sig, consts, {}, 4, 3)}")

    sys.path.insert(0, str(ROOT))
    from perf.tune import attention_sm90_report as report
    from perf.tune import tune_attention as tune
    import impl.attention as attention_pkg
    import impl.attention.flash_triton  # noqa: F401  (so the package has the attribute to swap)

    marked = marked_kernels()
    original = attention_pkg.flash_triton
    for cand in [c for c in tune.default_candidates(tune.ANCHORS) if "default" in c.name]:
        sys.modules["impl.attention.flash_triton"], attention_pkg.flash_triton = marked, marked
        try:
            kernels = report.kernels_of(cand, tune.ANCHORS[cand.anchor])  # the marked copy's kernels
        finally:
            sys.modules["impl.attention.flash_triton"], attention_pkg.flash_triton = original, original
        for name, (kernel, args, ce, warps, stages, _) in kernels.items():
            for w in sorted({warps, 4}):
                s, c, a = attention_signature(kernel, args, dict(ce, USE_TMA=True))
                print(f"{cand.name} {name} TMA w{w} s{stages}, loop marked: {compile_sm90(kernel, s, c, a, w, stages)}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
