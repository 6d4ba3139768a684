"""The host time of one Gluon attention call with its launches replayed from CUDA graphs
(impl/attention/call_graphs.py) and launched directly, beside SDPA's.

    PYTHONPATH=. python perf/scripts/gluon_host_graphs.py [--out DIR] [--n 128 1024] [--calls 400] [--rounds 7]

As perf/scripts/gluon_host_parts.py does (``calls`` passes with no synchronisation inside the
loop, rounds interleaving the variants, medians; B1 H1 d64 causal bf16):

    sdpa_flash        o.backward(dO) through torch's C++ node (the peer)
    ours              o.backward(dO) through FlashAttentionGluon (graphs on, as this script sets them)
    ours_direct       the same with call_graphs.ENABLED off: every launch through Triton's C launcher
    ours_no_work      the Function's backward returns ready gradients: engine and node alone
    fwd_*             the forward: SDPA with torch's choice of backend, SDPA flash (its context
                      manager inside the call, as the sweep runs it), ours, ours direct
    pair_*            forward + backward, as the sweep's "both" column issues them

(An earlier version, commit 108a998, patched a prototype of the graphs over the plans.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from contextlib import nullcontext
from pathlib import Path
from unittest.mock import patch

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# what this script measures: the graphs on, and the direct path on Triton's launcher (both read at import)
os.environ["LLM_SYSTEMS_CALL_GRAPHS"] = "1"
os.environ["LLM_SYSTEMS_NATIVE_LAUNCH"] = "0"
from impl.attention import call_graphs  # noqa: E402
from impl.attention import flash_gluon as fg  # noqa: E402
from perf.lib.measure import host_and_wall_us_per_call  # noqa: E402
from perf.lib.workloads import cuda_attention_inputs  # noqa: E402


def _timed(ctx, fn):
    def measure(calls):
        with ctx:
            return host_and_wall_us_per_call(fn, calls)[0]
    return measure


def variants(n, d=64, causal=True):
    q, k, v, do = cuda_attention_inputs(1, 1, n, d)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o_ours = fg.FlashAttentionGluon.apply(q, k, v, causal)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    direct = patch.object(call_graphs, "ENABLED", False)
    no_work = patch.object(fg.FlashAttentionGluon, "backward", staticmethod(lambda ctx, grad_o: (*grads, None, None)))

    def fwd_sdpa_flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    fwd_sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    fwd_ours = lambda: fg.FlashAttentionGluon.apply(q, k, v, causal)  # noqa: E731

    def pair(fwd):
        def run():
            for t in (q, k, v):
                t.grad = None
            fwd().backward(do)
        return run

    return {
        "sdpa_flash": _timed(nullcontext(), lambda: o_sdpa.backward(do, retain_graph=True)),
        "ours": _timed(nullcontext(), lambda: o_ours.backward(do, retain_graph=True)),
        "ours_direct": _timed(direct, lambda: o_ours.backward(do, retain_graph=True)),
        "ours_no_work": _timed(no_work, lambda: o_ours.backward(do, retain_graph=True)),
        "fwd_sdpa": _timed(nullcontext(), fwd_sdpa),
        "fwd_sdpa_flash": _timed(nullcontext(), fwd_sdpa_flash),
        "fwd_ours": _timed(nullcontext(), fwd_ours),
        "fwd_ours_direct": _timed(direct, fwd_ours),
        "pair_sdpa": _timed(nullcontext(), pair(fwd_sdpa)),
        "pair_ours": _timed(nullcontext(), pair(fwd_ours)),
        "pair_ours_direct": _timed(direct, pair(fwd_ours)),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--n", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for n in args.n:
        measures = variants(n)
        rows = {name: [] for name in measures}
        for _ in range(args.rounds):
            for name, measure in measures.items():
                rows[name].append(measure(args.calls))
        med = {name: round(statistics.median(x), 1) for name, x in rows.items()}
        # per round, ours against SDPA in the same round (the host's speed drifts between rounds)
        ratio = {f"{a}/{b}": round(statistics.median(x / y for x, y in zip(rows[a], rows[b])), 3)
                 for a, b in (("ours", "sdpa_flash"), ("ours_direct", "sdpa_flash"), ("fwd_ours", "fwd_sdpa"),
                              ("pair_ours", "pair_sdpa"), ("pair_ours_direct", "pair_sdpa"))}
        result[f"N{n}"] = {"median_us": med, "median_ratio_in_round": ratio,
                           "rounds_us": {k: [round(x, 1) for x in v] for k, v in rows.items()},
                           "graphs": call_graphs.graph_count()}
        print(f"N={n}", json.dumps(med), flush=True)
        print("  ratios", json.dumps(ratio), "graphs", call_graphs.graph_count(), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gluon_host_graphs.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
