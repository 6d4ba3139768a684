"""The attention sweep: attention timed and measured across sequence length, head dim,
dtype and mask, ours against eager PyTorch and torch SDPA's backends.

    python -m perf.bench.attention [--seq 128:65536] [--dims 16 32 64 128] [--dtypes bf16 fp32]
        [--impls triton eager sdpa_flash sdpa_cudnn sdpa_efficient] [--passes forward backward forward_backward]
        [--masks causal full] [--batch 1] [--heads 1] [--time-budget-s S] [--target SPEC] [--out DIR]
        [--device auto|cpu|cuda]

The grid is CS336's flash_benchmarking one: batch 1, causal, sequence lengths 128 to 65536
(powers of two), head dims 16 to 128, bfloat16 and float32; one head unless ``--heads``;
``--masks causal full`` adds the non-causal cases.  Inputs are (B, H, N, d) standard normal.

Implementations (``--impls``)
    triton           this target's FlashAttention-2 in Triton (default target: impl)
    gluon            this target's Hopper FlashAttention in Gluon (warp-specialised; Hopper GPUs only)
    pytorch          this target's FlashAttention-2 in PyTorch tiles
    gluon_model      impl's Gluon kernels through the model's call (``custom_ops.attention``: its
                     autograd node in C++ where the C++ launcher is built, else the Function)
    eager            S = Q K^T / sqrt(d), causal mask, softmax, P V; autograd backward
    sdpa             torch SDPA, backend of PyTorch's choosing
    sdpa_flash, sdpa_cudnn, sdpa_efficient, sdpa_math
                     torch SDPA forced to one backend with torch.nn.attention.sdpa_kernel;
                     "unsupported" where that backend has no kernel for the inputs
                     (flash and cuDNN take no float32)
    compiled_eager   torch.compile of ``eager`` (static shapes: one compilation per case)
    NAME@TAG         a second copy of NAME timed as an implementation of its own (``sdpa_flash@2``):
                     a peer against itself, the sweep's noise floor at each point

The first call of every pass (kernel compilation, autotuning, torch.compile's tracing)
is timed apart as ``first_ms`` and never enters the median.

Passes: ``forward`` (the training forward: autograd records), ``backward`` (backward
alone, from one forward's graph kept with retain_graph) and ``forward_backward``.
Time: the median of ``triton.testing.do_bench`` on CUDA (a perf_counter median on the
CPU).  Host time (CUDA only): microseconds the CPU spends issuing one call, from 20 calls
with no synchronisation inside the loop; where it exceeds the GPU time the pass is
launch-bound and the median measures the host, not the kernels.  ``--device-time`` (CUDA):
also each pass's device time with the GPU held behind the host (``device_ms``: after the
flush a GPU sleep of three times the pass's host time, so the host has issued the whole call
before the GPU reaches it; ``measure.device_ms_held_behind``).  Memory:
torch.cuda.max_memory_allocated over one call of the pass, inputs and
(for backward) the forward's saved tensors included.  A case that runs out of memory is
recorded as "OOM" (the error is caught, memory freed, the sweep goes on).  ``--time-budget-s``
stops between cases and writes what was measured.

Outputs in ``--out`` (default ``perf-out/``): attention.md (time and memory tables),
attention.csv, attention.json, attention_time.png and attention_memory.png.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Sequence

import torch

from conformance.target import NotOffered
from perf.lib import measure
from perf.lib.measure import OK, Deadline, Outcome
from perf.lib.workloads import (PASSES, SDPA_BACKENDS, attention_flops, eager_attention, make_inputs, sdpa_attention,
                                sdpa_backend, synchronize)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SDPA_IMPLS = tuple(f"sdpa_{backend}" for backend in SDPA_BACKENDS)  # sdpa_flash, sdpa_cudnn, ...
IMPL_NAMES = ("triton", "gluon", "pytorch", "gluon_model", "eager", "sdpa", *SDPA_IMPLS, "compiled_eager")

# CS336's grid on a GPU; a tiny one on the CPU (Triton runs under its interpreter there).
CUDA_DEFAULTS = dict(seq=[2**i for i in range(7, 17)], dims=[16, 32, 64, 128], dtypes=["bf16", "fp32"],
                     impls=["triton", "eager", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient"])
CPU_DEFAULTS = dict(seq=[16, 32, 64], dims=[16, 32], dtypes=["fp32"], impls=["triton", "eager", "sdpa"])

TABLE_COLUMNS = ("impl", "causal", "dtype", "d", "seq", "pass", "batch", "heads", "ms", "tflops", "peak_mib", "first_ms",
                 "host_us", "device_ms", "status", "detail")
MASKS = {"causal": True, "full": False}


# --- implementations -------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionImpl:
    """An attention ``fn(q, k, v, causal)`` over (B, H, N, d) and the context it must run in."""

    name: str
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    context: Callable[[], ContextManager] = contextlib.nullcontext


@functools.lru_cache(maxsize=None)
def _attention_function(flavour: str, target_spec: str | None):
    from conformance.target import load_target

    return load_target(target_spec).attention(flavour)


def _target_attention(flavour: str, target_spec: str | None):
    def fn(q, k, v, causal=True):
        # resolved on first use (a target that lacks it is "not offered"), then cached
        return _attention_function(flavour, target_spec).apply(q, k, v, causal)

    return fn


def make_impl(name: str, target_spec: str | None = None) -> AttentionImpl:
    base, tagged, tag = name.partition("@")
    if tagged:  # the same implementation under another name: its rows are its own, its code is NAME's
        if not tag or "@" in tag:
            raise ValueError(f"a copy's name is NAME@TAG with one non-empty TAG, got {name!r}")
        copy = make_impl(base, target_spec)
        return AttentionImpl(name, copy.fn, copy.context)
    if name in ("triton", "gluon", "pytorch"):
        return AttentionImpl(name, _target_attention(name, target_spec))
    if name == "gluon_model":
        from impl.attention.custom_ops import attention

        return AttentionImpl(name, lambda q, k, v, causal=True: attention(q, k, v, causal, "gluon"))
    if name == "eager":
        return AttentionImpl(name, eager_attention)
    if name == "compiled_eager":
        # torch.compile of the materialised attention: Inductor fuses mask, scale and softmax
        # (recompiles per shape; the first call's time, compilation included, is first_ms)
        return AttentionImpl(name, torch.compile(eager_attention, dynamic=False))
    if name == "sdpa":
        return AttentionImpl(name, sdpa_attention)  # backend of PyTorch's choosing
    if name in SDPA_IMPLS:
        return AttentionImpl(name, sdpa_attention, functools.partial(sdpa_backend, name.removeprefix("sdpa_")))
    raise ValueError(f"unknown attention implementation {name!r}; expected one of {', '.join(IMPL_NAMES)}")


# --- one case ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    seq: int
    d: int
    dtype: str
    batch: int = 1
    heads: int = 1
    causal: bool = True

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        for name in ("seq", "d", "batch", "heads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")

    def inputs(self, device, seed: int = 0):
        """q, k, v (requiring grad) and dO of shape (B, H, N, d) in the case's dtype."""
        return make_inputs((self.batch, self.heads, self.seq, self.d), DTYPES[self.dtype], device, seed)

    def flops(self, pass_: str) -> float:
        """Matmul FLOPs of one pass (``workloads.attention_flops``)."""
        return attention_flops(self.batch, self.heads, self.seq, self.d, self.causal, pass_)


def pass_fn(impl: AttentionImpl, pass_: str, q, k, v, do, causal: bool = True):
    """The callable a timer repeats for one pass."""
    if pass_ == "forward":
        return lambda: impl.fn(q, k, v, causal)
    if pass_ == "forward_backward":
        return lambda: impl.fn(q, k, v, causal).backward(do)
    if pass_ == "backward":
        o = impl.fn(q, k, v, causal)  # one forward; its graph is kept for every timed backward
        return lambda: o.backward(do, retain_graph=True)
    raise ValueError(f"unknown pass {pass_!r}; expected one of {', '.join(PASSES)}")


def measure_pass(impl: AttentionImpl, case: Case, pass_: str, device, *, warmup_ms=25.0, rep_ms=100.0,
                 device_time: bool = False) -> dict:
    """One row: median ms, TFLOP/s and peak MiB of one pass, or the reason it has none;
    ``device_time``: also the pass's device time with the GPU held behind the host
    (``device_ms``, ``measure.device_ms_held_behind``; None on the CPU)."""
    device = torch.device(device)
    row = dict(impl=impl.name, dtype=case.dtype, d=case.d, seq=case.seq, batch=case.batch, heads=case.heads,
               causal=case.causal, ms=None, tflops=None, peak_mib=None, first_ms=None, host_us=None, device_ms=None,
               status=OK,
               detail="")
    row["pass"] = pass_
    outcome, caught = None, []
    try:
        with warnings.catch_warnings(record=True) as caught, impl.context():
            warnings.simplefilter("default")  # each distinct warning once: the backend's reasons, no per-call cost
            q, k, v, do = case.inputs(device)
            grads = [q, k, v]
            run = pass_fn(impl, pass_, q, k, v, do, case.causal)
            started = time.perf_counter()
            run()  # compiles kernels, picks algorithms: timed apart, never in the median
            synchronize(device)
            row["first_ms"] = (time.perf_counter() - started) * 1e3
            for t in grads:
                t.grad = None
            with measure.PeakMemory(device) as peak:
                run()
            ms = measure.median_ms(run, device, warmup_ms=warmup_ms, rep_ms=rep_ms, grad_to_none=grads)
            row["host_us"] = measure.host_us_per_call(run, device, grad_to_none=grads)
            if device_time and row["host_us"] is not None:
                row["device_ms"] = measure.device_ms_held_behind(run, device, host_us=row["host_us"],
                                                                 grad_to_none=grads)
        row.update(ms=ms, tflops=case.flops(pass_) / (ms * 1e-3) / 1e12, peak_mib=peak.mib)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, the sweep goes on
        outcome = Outcome("not offered", str(exc)) if isinstance(exc, NotOffered) else Outcome.of(exc)
        reasons = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, UserWarning)]
        row.update(status=outcome.label, detail=outcome.detail + (f" ({reasons[0][:200]})" if reasons else ""))
    finally:
        q = k = v = do = run = grads = None  # noqa: F841 - drop the case's tensors before freeing
    if outcome is not None:
        measure.free_memory(device)
    return row


# --- the sweep ---------------------------------------------------------------------------


@dataclass
class SweepResult:
    rows: list[dict] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)  # cases left when the time budget ran out

    @property
    def complete(self) -> bool:
        return not self.not_run


def sweep(seqs: Sequence[int], dims: Sequence[int], dtypes: Sequence[str], impls: Sequence[str | AttentionImpl],
          passes: Sequence[str] = PASSES, *, device="cpu", batch: int = 1, heads: int = 1,
          masks: Sequence[str] = ("causal",),
          time_budget_s: float | None = None, target: str | None = None, warmup_ms: float = 25.0,
          rep_ms: float = 100.0, rounds: int = 1, device_time: bool = False, log=print) -> SweepResult:
    """Every (dtype, d, seq, impl, pass), smallest sequences first, until the budget runs out.

    ``rounds`` > 1: each case measures every implementation once a round, the rounds one after
    another, and a row holds the median of its rounds (``ms_rounds`` the values).  Where the
    host decides the time (short sequences), the host's speed drifts by tens of percent over
    seconds; interleaving puts every implementation in every phase of it.  Each round measures
    the (implementation, pass) pairs in an order of its own (``round_orders``):
    in one fixed order the first implementation always ran right after the last one's
    measurements, and on an H200 the measurement right after SDPA's read 2-5 % slower whatever
    code it held (perf/results/2026-11-28-h200-backward-host-floor).
    """
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"unknown pass {p!r}; expected one of {', '.join(PASSES)}")
    impls = [i if isinstance(i, AttentionImpl) else make_impl(i, target) for i in impls]
    for m in masks:
        if m not in MASKS:
            raise ValueError(f"unknown mask {m!r}; expected one of {', '.join(MASKS)}")
    cases = [Case(s, d, dt, batch, heads, MASKS[m]) for m in masks for dt in dtypes for d in dims for s in sorted(seqs)]
    deadline = Deadline(time_budget_s)
    result = SweepResult()
    warm_up_device(device)
    for index, case in enumerate(cases):
        if deadline.expired:
            result.not_run.extend(f"{impl.name} {_case_label(case)}" for impl in impls)
            continue
        by_key: dict = {}
        for order in round_orders([(impl, pass_) for impl in impls for pass_ in passes], rounds, seed=index):
            for impl, pass_ in order:
                row = measure_pass(impl, case, pass_, device, warmup_ms=warmup_ms, rep_ms=rep_ms,
                                   device_time=device_time)
                by_key.setdefault((impl.name, pass_), []).append(row)
        for impl in impls:
            label = f"{impl.name} {_case_label(case)}"
            for pass_ in passes:
                row = _median_of_rounds(by_key[(impl.name, pass_)])
                result.rows.append(row)
                if log:
                    value = f"{row['ms']:10.3f} ms" if row["ms"] is not None else f"{row['status'][:60]:>13}"
                    mem = f"{row['peak_mib']:9.1f} MiB" if row["peak_mib"] is not None else ""
                    host = f" host {row['host_us']:8.1f} us" if row.get("host_us") is not None else ""
                    log(f"  {label:43s} {pass_:16s} {value} {mem}{host}")
    if result.not_run and log:
        log(f"time budget of {time_budget_s} s reached: {len(result.not_run)} (impl, case) pairs not run")
    return result


def round_orders(pairs: list, rounds: int, seed: int = 0) -> list[list]:
    """The order of ``pairs`` in each of ``rounds`` rounds: as listed for one round, else each
    round shuffled on its own (seeded: a rerun measures in the same orders).  A shuffle, not a
    rotation: a rotation keeps each pair behind the same one."""
    if rounds == 1:
        return [list(pairs)]
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(pairs)
        rng.shuffle(order)
        orders.append(order)
    return orders


def _case_label(case: Case) -> str:
    return f"{case.dtype} d={case.d} N={case.seq}" + ("" if case.causal else " full")


def _median_of_rounds(rows: list[dict]) -> dict:
    """One row from a pass's rounds: the median time, host time and device time (each round's
    kept in ``*_rounds``), the largest peak; the first round's first-call time (the one that
    compiled)."""
    row = dict(rows[0])
    ok = [r for r in rows if r["ms"] is not None]
    if len(rows) > 1:
        row["ms_rounds"] = [r["ms"] for r in rows]
        for reading in ("host_us", "device_ms"):
            if all(r.get(reading) is not None for r in rows):
                row[f"{reading}_rounds"] = [r[reading] for r in rows]
    if ok and len(ok) == len(rows):
        row["ms"] = statistics.median(r["ms"] for r in ok)
        row["tflops"] = statistics.median(r["tflops"] for r in ok)
        hosts = [r["host_us"] for r in ok if r.get("host_us") is not None]
        row["host_us"] = statistics.median(hosts) if hosts else None
        devices = [r["device_ms"] for r in ok if r.get("device_ms") is not None]
        row["device_ms"] = statistics.median(devices) if devices else None
        peaks = [r["peak_mib"] for r in ok if r.get("peak_mib") is not None]
        row["peak_mib"] = max(peaks) if peaks else None
    elif ok:  # some rounds failed: the row is the failure (a flaky case is not a time)
        row = dict(next(r for r in rows if r["ms"] is None))
    return row


def warm_up_device(device, seconds: float = 1.0) -> None:
    """Keep a GPU busy for ``seconds`` before the first measurement: an idle H100 sits at a
    few hundred MHz and the first cases of a sweep would otherwise run while it clocks up."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(device)


# --- outputs -----------------------------------------------------------------------------


def markdown_sections(result: SweepResult, impl_order: Sequence[str] | None = None) -> list[tuple[str, str]]:
    from perf.lib.tables import pivot_markdown

    index = ("causal", "dtype", "d", "seq", "pass")
    sections = [
        ("Attention time (ms, median; B=%s, H=%s)" % _batch_heads(result),
         pivot_markdown(result.rows, index, "impl", "ms", impl_order)),
        ("Host time per call (us: issuing the pass, no synchronisation; above the GPU time means launch-bound)",
         pivot_markdown(result.rows, index, "impl", "host_us", impl_order)),
        *([("Device time per call (ms, median: the GPU held behind the host by a sleep after the flush, so "
            "the events time the kernels, not the issue; --device-time)",
            pivot_markdown(result.rows, index, "impl", "device_ms", impl_order))]
          if any(r.get("device_ms") is not None for r in result.rows) else []),
        ("Attention peak memory (MiB, torch.cuda.max_memory_allocated)",
         pivot_markdown(result.rows, index, "impl", "peak_mib", impl_order)),
        ("First call (ms: compilation, autotuning and tracing included; not in the medians)",
         pivot_markdown(result.rows, index, "impl", "first_ms", impl_order)),
    ]
    failures = [r for r in result.rows if r["status"] not in (OK, measure.OOM, measure.UNSUPPORTED)]
    if failures:
        lines = "\n".join(f"- {r['impl']} {r['dtype']} d={r['d']} N={r['seq']} {r['pass']}: {r['detail']}" for r in failures)
        sections.append(("Attention errors", lines))
    if result.not_run:
        sections.append(("Attention cases not run (time budget)", ", ".join(result.not_run)))
    return sections


def _batch_heads(result: SweepResult):
    if not result.rows:
        return ("?", "?")
    return (result.rows[0]["batch"], result.rows[0]["heads"])


def write_outputs(result: SweepResult, out_dir: str | Path, meta: dict | None = None, plots: bool = True,
                  impl_order: Sequence[str] | None = None) -> list[Path]:
    from perf.lib import tables

    out_dir = Path(out_dir)
    paths = [
        tables.write_markdown(out_dir / "attention.md", markdown_sections(result, impl_order), title="Attention sweep"),
        tables.write_csv(out_dir / "attention.csv", result.rows, TABLE_COLUMNS),
        tables.write_json(out_dir / "attention.json", dict(meta=meta or {}, rows=result.rows, not_run=result.not_run)),
    ]
    if plots and result.rows:
        from perf.lib import plots as plotting

        paths += plotting.plot_attention(result.rows, out_dir)
    return paths


# --- command line ------------------------------------------------------------------------


def parse_lengths(items: Sequence[str]) -> list[int]:
    """Integers, or ``LO:HI`` for the powers of two from LO to HI."""
    values: list[int] = []
    for item in items:
        if ":" in str(item):
            lo, hi = (int(x) for x in str(item).split(":", 1))
            if lo < 1 or hi < lo:
                raise ValueError(f"bad range {item!r}: need 1 <= LO <= HI")
            n = 1 << (lo - 1).bit_length()
            while n <= hi:
                values.append(n)
                n *= 2
        else:
            values.append(int(item))
    if any(v < 1 for v in values):
        raise ValueError(f"lengths must be positive, got {values}")
    return sorted(set(values))


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    return torch.device(choice)


def use_interpreter_on_cpu(device: torch.device) -> None:
    """Triton kernels run on the CPU only under its interpreter, chosen before triton is imported."""
    if device.type == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("warning: triton was imported before TRITON_INTERPRET=1 was set; the triton impl may fail on the CPU")
        os.environ.setdefault("TRITON_INTERPRET", "1")


def impl_name(name: str) -> str:
    """``--impls``' check: a known implementation, or a copy of one (NAME@TAG)."""
    if name.partition("@")[0] not in IMPL_NAMES:
        raise argparse.ArgumentTypeError(f"unknown attention implementation {name!r}; expected one of "
                                         f"{', '.join(IMPL_NAMES)}, or NAME@TAG")
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m perf.bench.attention", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--seq", nargs="+", help="sequence lengths, or LO:HI for powers of two (default 128:65536 on CUDA)")
    parser.add_argument("--dims", nargs="+", type=int, help="head dims (default 16 32 64 128 on CUDA)")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), help="default bf16 fp32 on CUDA")
    parser.add_argument("--impls", nargs="+", type=impl_name, metavar="IMPL",
                        help=f"{', '.join(IMPL_NAMES)}, or NAME@TAG (a second copy of NAME)")
    parser.add_argument("--passes", nargs="+", choices=PASSES, default=list(PASSES))
    parser.add_argument("--masks", nargs="+", choices=sorted(MASKS), default=["causal"],
                        help="causal (CS336's sweep) and/or full (no mask)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warm-up (milliseconds)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetition time (milliseconds)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every implementation once a round, this many rounds; rows are medians")
    parser.add_argument("--time-budget-s", type=float, default=None, help="stop between cases after this long")
    parser.add_argument("--device-time", action="store_true",
                        help="also each pass's device time with the GPU held behind the host (CUDA; column device_ms)")
    parser.add_argument("--target", default=None, help="implementation under test for triton/pytorch (default impl)")
    parser.add_argument("--out", default="perf-out", help="folder for the tables and plots")
    parser.add_argument("--no-plots", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> SweepResult:
    opts = build_parser().parse_args(argv)
    device = resolve_device(opts.device)
    use_interpreter_on_cpu(device)
    defaults = CUDA_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    seqs = parse_lengths(opts.seq) if opts.seq else defaults["seq"]
    dims, dtypes, impls = opts.dims or defaults["dims"], opts.dtypes or defaults["dtypes"], opts.impls or defaults["impls"]
    meta = dict(measure.device_description(device), seqs=seqs, dims=dims, dtypes=dtypes, impls=impls,
                passes=opts.passes, batch=opts.batch, heads=opts.heads, masks=opts.masks, rounds=opts.rounds,
                device_time=opts.device_time,
                timing="triton.testing.do_bench median" if device.type == "cuda" else "perf_counter median",
                target=opts.target or "impl")
    print(f"attention sweep on {meta.get('gpu', device)}: seq {seqs}, d {dims}, {dtypes}, {impls}, {opts.passes}")
    result = sweep(seqs, dims, dtypes, impls, opts.passes, device=device, batch=opts.batch, heads=opts.heads,
                   masks=opts.masks,
                   time_budget_s=opts.time_budget_s, target=opts.target, warmup_ms=opts.warmup_ms, rep_ms=opts.rep_ms,
                   rounds=opts.rounds, device_time=opts.device_time)
    paths = write_outputs(result, opts.out, meta, plots=not opts.no_plots, impl_order=impls)
    print((Path(opts.out) / "attention.md").read_text())
    print("wrote " + ", ".join(str(p) for p in paths))
    return result


if __name__ == "__main__":
    main()
