"""First look at the Gluon flavour on a Hopper GPU: forward and backward against float64
attention at a handful of shapes (ragged tails, N_q != N_k, causal, both head dims, a
transposed layout), and each kept mutant in a child process with a time limit, so that a
barrier deadlock reads as such.

    PYTHONPATH=. python perf/scripts/gluon_probe.py
"""

import subprocess
import sys
import time

import torch

from impl.attention.flash_gluon import HOST_MUTANTS, FlashAttentionGluon, MUTANTS, mutant_function
from impl.attention.reference import attention_reference


def case(b, h, n_q, n_k, d, causal, dtype=torch.bfloat16, transposed=False, fn=FlashAttentionGluon):
    g = torch.Generator(device="cuda").manual_seed(n_q * 7 + n_k + d)
    mk = lambda n: (torch.randn(b, n, h, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)  # noqa: E731
                    if transposed else torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g))
    q, k, v = mk(n_q), mk(n_k), mk(n_k)
    do = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, generator=g)
    for t in (q, k, v):
        t.requires_grad_(True)
    t0 = time.perf_counter()
    o = fn.apply(q, k, v, causal)
    o.backward(do)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    qr, kr, vr = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = attention_reference(qr, kr, vr, causal)[0]  # float64 inputs: the reference in float64
    ref.backward(do.double())
    errs = [(o.double() - ref).abs().max().item()] + [(a.grad.double() - b.grad).abs().max().item()
                                                       for a, b in ((q, qr), (k, kr), (v, vr))]
    return errs, took


SHAPES = [(1, 1, 128, 128, 64, False), (1, 1, 128, 128, 64, True), (2, 3, 256, 256, 64, True),
          (1, 2, 129, 129, 64, True), (1, 2, 100, 300, 128, False), (1, 2, 300, 100, 128, True),
          (2, 2, 1, 65, 64, False), (2, 2, 65, 1, 128, True), (1, 4, 1000, 1000, 128, True),
          (1, 4, 1024, 1024, 64, False),
          # small grids, keys in splits (_forward_splits): a non-causal split past the last key
          # tile (9 tiles in 4 splits of 3), causal splits past a tile's diagonal, N_q < N_k and,
          # causal, most of eight splits of each query tile discarded
          (1, 1, 1100, 1100, 64, False), (1, 1, 2000, 2000, 128, True), (1, 2, 300, 3000, 64, False),
          (1, 1, 700, 3000, 128, True)]

MUTANT_LIMIT_S = 60  # a mutant's case, compilation included, takes a few seconds


# Each mutant's case: 8 key tiles (past the ring); the split one on a causal small grid, whose
# first query tiles have splits with no keys of their own; the Q one on 512 query tiles, so each
# program walks several work items.
MUTANT_CASES = {"discarded_split_counted": (1, 2, 1000, 1000, 64, True),
                "q_freed_before_its_last_scores": (4, 16, 1000, 1000, 64, False)}


def mutant_case(name: str) -> None:
    """One kept mutant at its case (MUTANT_CASES, else 8 key tiles); a launch failure is its
    result too."""
    try:
        errs, _ = case(*MUTANT_CASES.get(name, (2, 4, 1000, 1000, 64, False)), fn=mutant_function(name))
        print(f"mutant {name}: max|err| O, dQ, dK, dV = " + ", ".join(f"{e:.3g}" for e in errs), flush=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a mutant is reported as such
        print(f"mutant {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--mutant"]:
    mutant_case(sys.argv[2])
elif __name__ == "__main__":
    bad = 0
    for shape in SHAPES:
        for transposed in (False, True):
            errs, took = case(*shape, transposed=transposed)
            ok = all(e < 0.06 for e in errs)
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {shape} transposed={transposed} max|err| O,dQ,dK,dV = "
                  + ", ".join(f"{e:.2e}" for e in errs) + f"  ({took:.2f} s)", flush=True)
    # Grids in groups of heads (_tile_and_head) with a short last group: at these sizes every
    # head fits in L2 and the plans run heads fastest, so the grouping is forced here.
    import impl.attention.flash_gluon as fg
    saved_group = fg._group_heads
    fg._group_heads = lambda n_heads, per_head_bytes, device: max(1, n_heads - 1)
    fg._PLANS = fg.PlanCache(64)
    fg._plan = fg._PLANS.get
    for shape in (s for s in SHAPES if s[0] * s[1] > 1):
        errs, took = case(*shape)
        ok = all(e < 0.06 for e in errs)
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {shape} grouped max|err| O,dQ,dK,dV = " + ", ".join(f"{e:.2e}" for e in errs),
              flush=True)
    # More work items than resident programs (B * H * query tiles > SMs), ragged: a persistent
    # kernel's programs each walk several items; forced to a handful of programs as well.
    fg._group_heads = saved_group
    many = [(4, 16, 1000, 1000, 128, True), (3, 20, 333, 700, 64, False), (2, 24, 900, 900, 64, True)]
    runs = [("many", None)] + ([("5 programs", 5)] if hasattr(fg, "_resident_programs") else [])
    for label, programs in runs:
        if programs is not None:
            fg._resident_programs = lambda device, programs=programs: programs
        fg._PLANS = fg.PlanCache(64)
        fg._plan = fg._PLANS.get
        for shape in many:
            errs, took = case(*shape)
            ok = all(e < 0.06 for e in errs)
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {shape} {label} max|err| O,dQ,dK,dV = "
                  + ", ".join(f"{e:.2e}" for e in errs) + f"  ({took:.2f} s)", flush=True)
    errs, _ = case(1, 2, 200, 200, 64, True, dtype=torch.float16)
    print("fp16", errs, flush=True)
    # Each mutant in a child process with a limit (the phase mutant may deadlock); --no-mutants
    # leaves them out (a variant of the module run through perf-out/run_as.py: the children
    # would import the module itself).
    # (The host path's mutants show only when a call recurs at the same addresses: the laws run them.)
    for name in sorted(set(MUTANTS) - set(HOST_MUTANTS)) if "--no-mutants" not in sys.argv else ():
        try:
            child = subprocess.run([sys.executable, __file__, "--mutant", name], capture_output=True, text=True,
                                   timeout=MUTANT_LIMIT_S)
            lines = (child.stdout + child.stderr).strip().splitlines()
            print(lines[-1] if lines else f"mutant {name}: exit {child.returncode}, no output", flush=True)
        except subprocess.TimeoutExpired:
            print(f"mutant {name}: no result within {MUTANT_LIMIT_S} s (a hang)", flush=True)
    sys.exit(1 if bad else 0)
