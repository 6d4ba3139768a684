"""Compile our Triton attention kernels for the cases the gate's laws draw, in parallel.

    python -m perf.gate.warm_triton_cache [--procs P]

A fresh machine has an empty Triton cache, and the laws then compile inside the tests:
several xdist workers compile the same kernel at once, and a law waits on each compile
in turn.  This runs one small forward and backward for each combination that selects a
different compiled kernel (head dim, dtype, causal flag, layout, whether the key length
is a tile multiple, the stride and address divisibility Triton specialises on), spread over P
processes (default: one per core), so the laws find their kernels in the cache.  The
head dims and dtypes are the GPU budget's (conformance.laws.attention.strategies).
On a Hopper GPU the Gluon flavour's are warmed too, over its own budget (d 64 and 128, 16-bit),
with the boundary cases every one of its wider laws runs first (a split-KV head of 1000 keys,
40 heads of them), each backward in both of torch's deterministic modes (the laws run both,
and the Gluon backward takes another form in each).  Gate run 31 compiled 743 kernels inside
the laws, most of them Gluon's, with only the Triton flavour warmed.
Prints the number of combinations, kernels compiled and the wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def combinations(flavour: str = "triton") -> list[tuple]:
    """(batch, n, d, dtype name, causal, layout): one per distinct compiled kernel set."""
    import torch

    from conformance.laws.attention.strategies import budget_for

    budget = budget_for(flavour, torch.device("cuda"))
    seen, out = set(), []
    for d in budget.head_dims:
        for dtype in budget.dtypes:
            for causal in (True, False):
                for layout, batch in (("contiguous", (2,)), ("strided", (2,)), ("transposed", (1, 2)), ("misaligned", (2,))):
                    # keys a tile multiple or not (the backward's KEYS_EVEN); misaligned inputs
                    # (one law's neighbours only): the ragged length alone
                    for n in (129,) if layout == "misaligned" else (128, 129):
                        key = (d, dtype, causal, n % 16 == 0, layout == "misaligned", _stride_pattern(batch, n, d, layout))
                        if flavour == "gluon":  # TMA descriptors: what Triton specialises in them is not pinned here
                            key += (layout,)
                        if key not in seen:
                            seen.add(key)
                            out.append((batch, n, d, str(dtype).split(".")[-1], causal, layout))
    return out


def _stride_pattern(batch, n, d, layout) -> tuple:
    """Which (B, H, N, d) strides are multiples of 16 (Triton specialises integers on it)."""
    heads = batch[1] if len(batch) > 1 else 1
    if layout == "transposed" and len(batch) > 1:
        strides = (n * heads * d, d, heads * d, 1)
    else:
        row = 2 * d if layout == "strided" else d
        strides = (heads * n * row, n * row, row, 1)
    return tuple(s % 16 == 0 for s in strides)


def gluon_cases() -> list:
    """The Gluon flavour's warm-up cases (AttentionCase): its combinations, plus the boundary
    cases its wider laws run first (``strategies.boundary_cases``, fitted to its budget)."""
    import torch

    from conformance.laws.attention.strategies import AttentionCase, boundary_cases, budget_for

    cases = [AttentionCase(batch, n, n, d, getattr(torch, dtype), causal, None, 1.0, layout, 0)
             for batch, n, d, dtype, causal, layout in combinations("gluon")]
    return cases + boundary_cases(budget_for("gluon", torch.device("cuda")), "gluon")


def _run(share: list[tuple]) -> tuple[int, list[str]]:
    """(kernels compiled, failures): a Gluon case that fails is named, never fatal (the laws judge it)."""
    import torch
    from triton import knobs

    from conformance.laws.attention.strategies import AttentionCase

    compiled, failures = [0], []

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        compiled[0] += not cache_hit

    knobs.compilation.listener = listener
    for flavour, case in share:
        if flavour == "triton":
            from impl.attention.flash_triton import FlashAttentionTriton

            batch, n, d, dtype, causal, layout = case
            case = AttentionCase(batch, n, n, d, getattr(torch, dtype), causal, None, 1.0, layout, 0)
            (q, k, v, do), _ = case.make("cuda")
            FlashAttentionTriton.apply(q, k, v, causal).backward(do)
            continue
        from impl.attention.flash_gluon import FlashAttentionGluon

        was = torch.are_deterministic_algorithms_enabled()
        try:
            for deterministic in (False, True):
                torch.use_deterministic_algorithms(deterministic, warn_only=True)
                (q, k, v, do), _ = case.make("cuda")
                FlashAttentionGluon.apply(q, k, v, case.is_causal).backward(do)
        except Exception as exc:  # noqa: BLE001 - the warm-up only fills a cache
            failures.append(f"{case}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        finally:
            torch.use_deterministic_algorithms(was)
    torch.cuda.synchronize()
    return compiled[0], failures


def _hopper() -> bool:
    from impl.attention.flash_gluon import hopper_reason

    return hopper_reason() is None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    todo = [("triton", c) for c in combinations()] + ([("gluon", c) for c in gluon_cases()] if _hopper() else [])
    # d=256 and fp32 compile slowest: deal round-robin so every process gets a mix
    shares = [todo[i::args.procs] for i in range(args.procs)]
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.procs) as pool:
        results = pool.map(_run, [s for s in shares if s])
    for _, failures in results:
        for failure in failures:
            print(f"warm_triton_cache: not warmed: {failure}")
    gluon = sum(flavour == "gluon" for flavour, _ in todo)
    print(f"warm_triton_cache: {len(todo)} combinations ({gluon} Gluon), {sum(c for c, _ in results)} kernels "
          f"compiled, {time.perf_counter() - start:.0f} s on {args.procs} processes")


if __name__ == "__main__":
    main()
