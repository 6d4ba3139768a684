"""Where the kept Gluon mutant ``v_slot_freed_before_its_product`` gives a wrong O, and where
the kernel does not: the largest |O - O_ref| (O_ref: float64 SDPA) over repeated calls, bf16,
(B, N, d) inputs as the contract passes them.

``--part shapes``: the contract's shapes (batch 1, 2, 4; N 16-1024; d 64 and 128; both masks),
three calls each, with the plan's grid, split count and key tiles a split (chunk).
``--part split``: a few shapes with the split count forced (1, 2, or the plan's) and the combine
launched as the forward's programmatic dependent or not (``COMBINE_PDL``): the mutant 20 calls a
variant, the kernel 200.

    PYTHONPATH=. python perf/scripts/gluon_split_mutant_map.py [--part shapes split]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton

from impl.attention import flash_gluon as fg

MUTANT = "v_slot_freed_before_its_product"


def inputs(batch, n, d):
    g = torch.Generator(device="cuda").manual_seed(n + d)
    return tuple(torch.randn(batch, n, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))


def worst_error(fn, q, k, v, causal, calls):
    """(largest |O - O_ref| over the calls, the index of the worst element)"""
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    worst, where = -1.0, None
    for _ in range(calls):
        err = (fn(q, k, v, causal).double() - ref).abs()
        if err.max().item() > worst:
            worst = err.max().item()
            where = tuple(int(i) for i in torch.nonzero(err == err.max())[0])
    return worst, where


def shapes(mutant):
    print("| B | N | d | causal | grid | splits | chunk | max err (3 calls) | worst (b, row, col) |")
    print("|---:|---:|---:|---|---|---:|---:|---:|---|")
    for batch in (1, 2, 4):
        for n in (16, 128, 256, 512, 1024):
            for d in (64, 128):
                for causal in (True, False):
                    q, k, v = inputs(batch, n, d)
                    err, where = worst_error(mutant.apply, q, k, v, causal, 3)
                    launch = fg._forward_plan(q, k, v, causal, None, fg.MUTANTS[MUTANT])[0].launch
                    print(f"| {batch} | {n} | {d} | {causal} | {launch.grid} | {launch.rest[-2]} | {launch.rest[-1]} "
                          f"| {err:.3g} | {where} |", flush=True)


def forced_split(mutant):
    heuristic = fg._forward_splits
    print("| fn | B | N | d | causal | splits asked | PDL | splits | combine | max err |")
    print("|---|---:|---:|---:|---|---|---|---:|---|---:|")
    try:
        for name, fn, calls in (("mutant", mutant.apply, 20), ("kernel", fg.FlashAttentionGluon.apply, 200)):
            for batch, n, d, causal in ((1, 256, 64, False), (1, 256, 64, True), (1, 1024, 64, True),
                                        (4, 1024, 128, False)):
                for asked, pdl in ((None, True), (None, False), (1, True), (2, False), (2, True)):
                    if asked == 2 and pdl and n > 256:
                        continue
                    fg._forward_splits = heuristic if asked is None else (lambda items, tiles, device, head_dim=None, s=asked: s)
                    fg.COMBINE_PDL = pdl
                    fg._PLANS.clear()
                    q, k, v = inputs(batch, n, d)
                    err, _ = worst_error(fn, q, k, v, causal, calls)
                    plan = fg._forward_plan(q, k, v, causal, None, 0)[0]
                    print(f"| {name} | {batch} | {n} | {d} | {causal} | {asked} | {pdl} | {plan.launch.rest[-2]} "
                          f"| {plan.combine is not None} | {err:.3g} |", flush=True)
    finally:
        fg._forward_splits, fg.COMBINE_PDL = heuristic, True
        fg._PLANS.clear()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", nargs="+", choices=("shapes", "split"), default=["shapes", "split"])
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    mutant = fg.mutant_function(MUTANT)
    if "shapes" in a.part:
        shapes(mutant)
    if "split" in a.part:
        forced_split(mutant)


if __name__ == "__main__":
    main()
