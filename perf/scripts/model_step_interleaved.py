"""The GPT step with two or more attention backends in one process, their steps interleaved:
what ``perf.bench.model`` (one backend after another) cannot resolve where the host decides
the step.  On a shared host the step's median drifts by 10-30 % between minutes; interleaved
rounds see the same drift for every backend, so their ratio holds.

    PYTHONPATH=. python perf/scripts/model_step_interleaved.py [--attention sdpa gluon] [--context 256 1024]
        [--compile on] [--rounds 12] [--steps 5] [--warmup 5] [--out DIR] [--device auto|cuda|cpu]

A backend named ``gluon:function`` is the Gluon backend with ``custom_ops.NATIVE_OPS`` off during
its steps: eager calls go through the flavour's autograd.Function, not the C++ node.

One model per backend, the same weights (a copy), each with its own AdamW and batch, each
compiled on its own (no ``torch._dynamo.reset`` between them, unlike ``perf.bench.model``).
A round runs ``--steps`` timed steps of each backend, in an order of its own (``round_order``); each
step sits between device synchronisations.  The numbers mean something on a GPU; ``--device
cpu`` (a tiny model, say) only shows the script works.  Reported: each backend's median step and
the median over rounds of its round median over the first backend's, with the call graphs'
counts (``impl/attention/call_graphs.py``) over its timed steps, and the time Python's garbage
collector took during them (``GcClock``: milliseconds and collections a step).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

from impl.attention import call_graphs
from impl.models import gpt
from perf.bench import model as bench
from perf.lib.measure import time_calls


class GcClock:
    """Python's garbage collections during each backend's timed steps (a ``gc.callbacks`` entry):
    collections by generation and seconds spent in them, per backend.  ``current`` names the
    backend whose steps run; collections outside them are not counted."""

    def __init__(self):
        self.current, self.started, self.by = None, None, {}

    def __call__(self, phase, info):
        if self.current is None:
            return
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            counts, seconds = self.by.setdefault(self.current, ([0, 0, 0], [0.0]))
            counts[info["generation"]] += 1
            seconds[0] += time.perf_counter() - self.started
            self.started = None


FUNCTION_SUFFIX = ":function"  # the backend with custom_ops.attention's C++ node off


@contextlib.contextmanager
def attention_route(name: str):
    """``name``'s route: for ``<backend>:function``, eager calls through the autograd.Function."""
    if not name.endswith(FUNCTION_SUFFIX):
        yield
        return
    from impl.attention import custom_ops

    was, custom_ops.NATIVE_OPS = custom_ops.NATIVE_OPS, False
    try:
        yield
    finally:
        custom_ops.NATIVE_OPS = was


def round_order(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order: the orderings of ``names`` in turn (two backends alternate).  A rotation
    of three or more keeps each backend behind the same one in every round, and a step right after
    another backend's reads slower on these hosts whatever it runs (ATTENTION_NOTES, nineteenth pass)."""
    orders = list(itertools.permutations(names))
    return list(orders[r % len(orders)])


def run_context(opts, context: int, device: torch.device) -> list[dict]:
    base = gpt.make_gpt(opts.size, device=device, context_length=max(context, gpt.SIZES[opts.size].context_length))
    steps, counts, times = {}, {}, {}
    for name in opts.attention:
        model = copy.deepcopy(base)
        bench.set_attention(model, name.removesuffix(FUNCTION_SUFFIX))
        optimizer = bench.make_optimizer(model)
        forward_model = torch.compile(model, dynamic=False) if opts.compile == "on" else model
        # make_step's compiled=True resets Dynamo; here each backend keeps its own compiled graph
        steps[name] = bench.make_step(forward_model, "step", opts.precision, opts.batch, context, optimizer)
        with attention_route(name):
            time_calls(steps[name], device, warmup=opts.warmup, steps=1)
        counts[name] = dict.fromkeys(("direct", "recorded", "replayed", "declined"), 0)
        times[name] = []
    rounds, clock = [], GcClock()
    gc.callbacks.append(clock)
    for r in range(opts.rounds):
        order = round_order(opts.attention, r)
        medians = {}
        for name in order:
            before = call_graphs.stats()
            clock.current = name
            with attention_route(name):
                these = time_calls(steps[name], device, warmup=0, steps=opts.steps)
            clock.current = None
            after = call_graphs.stats()
            for k in counts[name]:
                counts[name][k] += after[k] - before[k]
            times[name] += these
            medians[name] = statistics.median(these)
        rounds.append(medians)
    gc.callbacks.remove(clock)
    first = opts.attention[0]
    rows = []
    for name in opts.attention:
        collections, seconds = clock.by.get(name, ([0, 0, 0], [0.0]))
        n = len(times[name])
        rows.append(dict(context=context, attention=name, compiled=opts.compile == "on", size=opts.size,
                         batch=opts.batch, precision=opts.precision,
                         median_ms=statistics.median(times[name]) * 1e3,
                         ratio_to_first=statistics.median(m[name] / m[first] for m in rounds),
                         rounds_ms=[m[name] * 1e3 for m in rounds], call_graphs=counts[name],
                         gc_ms_per_step=seconds[0] * 1e3 / n, gc_collections_per_step=[c / n for c in collections]))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small")
    p.add_argument("--attention", nargs="+", default=["sdpa", "gluon"],
                   choices=[*bench.ATTENTIONS, *(a + FUNCTION_SUFFIX for a in ("triton", "gluon"))])
    p.add_argument("--context", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--precision", default="bf16", choices=bench.PRECISIONS)
    p.add_argument("--compile", default="on", choices=["on", "off"])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default="perf-out/model_interleaved")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    opts = p.parse_args(argv)
    from perf.bench.attention import resolve_device

    device = resolve_device(opts.device)
    rows = []
    for context in opts.context:
        rows += run_context(opts, context, device)
        for r in rows[-len(opts.attention):]:
            print(f"ctx {r['context']:5d} {r['attention']:6s} compiled {r['compiled']}: median {r['median_ms']:.2f} ms, "
                  f"/ {opts.attention[0]} {r['ratio_to_first']:.3f}  call graphs {r['call_graphs']}; "
                  f"gc {r['gc_ms_per_step']:.2f} ms a step, collections a step by generation "
                  f"{[round(c, 2) for c in r['gc_collections_per_step']]}", flush=True)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    (out / "model_interleaved.json").write_text(json.dumps(dict(device=name, torch=torch.__version__, rows=rows), indent=1))
    lines = [f"| context | attention | median ms | / {opts.attention[0]} (median of rounds) | Python gc ms a step "
             "(collections by generation) |", "|---:|---|---:|---:|---:|"]
    lines += [f"| {r['context']} | {r['attention']} | {r['median_ms']:.2f} | {r['ratio_to_first']:.3f} | "
              f"{r['gc_ms_per_step']:.2f} ({', '.join(f'{c:.2f}' for c in r['gc_collections_per_step'])}) |"
              for r in rows]
    (out / "model_interleaved.md").write_text("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
