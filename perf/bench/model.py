"""End-to-end benchmark of the GPT-style model (``impl.models.gpt``): time and memory of
inference, forward, forward+backward and a full AdamW step, per size, attention backend
and precision.

    python -m perf.bench.model [--sizes small medium large xl 2.7B] [--attention sdpa triton eager]
        [--precision fp32 bf16] [--modes forward forward_backward step] [--batch 4]
        [--context 512 ...] [--warmup 5] [--steps 10] [--out DIR] [--time-budget-s S]
        [--memory-snapshot FILE.pickle] [--profile-trace FILE.json[.gz]] [--device auto|cpu|cuda]

Random weights (``make_gpt``) and random token batches.  Modes:
    inference          forward under torch.inference_mode (nothing saved for backward)
    forward            the training forward and the loss (autograd records; ranges "forward")
    forward_backward   forward, then backward of the cross-entropy loss ("backward")
    step               zero_grad, forward, backward, AdamW step ("optimizer_step")
Precision: ``fp32`` or ``bf16`` (torch.autocast to bfloat16 around forward and loss;
parameters, gradients and optimizer state stay float32).  Attention: ``eager``
(materialised softmax), ``sdpa`` (torch's), ``triton`` and ``pytorch`` (this project's
FlashAttention-2), swapped in place on one model per size, so every backend runs the
same weights.

``--cuda-graph on``: each step is captured once in a CUDA graph (after three eager steps on
a side stream) and replayed, so the host's cost per kernel launch leaves every backend's
time (CUDA only; a capturable AdamW).  With ``--compile on`` too, a row captures the compiled
forward's step: compilation happens in those eager steps, and compile_s is their time and the
capture's.

Timing: ``--warmup`` untimed steps, then ``--steps`` timed ones, each between
``torch.cuda.synchronize`` calls (a Python timer otherwise reads kernel launches, not
kernels); the table gives mean, standard deviation, the first timed step and the
minimum.  ``--warmup 0`` shows what warm-up hides: the first step pays for CUDA context
and cuBLAS handle creation, Triton compilation, autotuning and the caching allocator's
first allocations (the optimizer's state too), so ``first_ms`` and the deviation blow up.
Run it in a fresh process, or the earlier rows' warm-up has already paid those costs.

Backends run one after another, each in its own minutes: where the host decides the step (the
small sizes, ungraphed) its median can drift 10-30 % between them on a shared machine, more
than a few per cent between backends.  ``perf/scripts/model_step_interleaved.py`` times such
a comparison with the backends' steps interleaved in one process.

Memory: torch.cuda.max_memory_allocated over the timed steps (``peak_mib``; empty on the
CPU).  ``--memory-snapshot`` writes ``torch.cuda.memory._dump_snapshot`` of one training
step (open it at https://pytorch.org/memory_viz); ``--profile-trace`` writes a
torch.profiler Chrome trace of one step with record_function ranges "forward",
"backward" and "optimizer_step" (open it in https://ui.perfetto.dev or chrome://tracing);
both profile the first size, attention and precision given.  A case that runs out of
memory is a row whose status is "OOM"; the run goes on.

Outputs in ``--out`` (default ``perf-out/``): model.md, model.csv, model.json, model.png.
"""

from __future__ import annotations

import argparse
import statistics
import contextlib
import gzip
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from impl.attention import call_graphs
from impl.models import gpt
from perf.lib import measure
from perf.lib.measure import OK, Deadline, Outcome
from perf.lib.workloads import synchronize

MODES = ("inference", "forward", "forward_backward", "step")
PRECISIONS = ("fp32", "bf16")
ATTENTIONS = ("eager", "sdpa", "triton", "gluon", "pytorch")
STANDARD_SIZES = ("small", "medium", "large", "xl", "2.7B")

CUDA_DEFAULTS = dict(sizes=list(STANDARD_SIZES), attention=["sdpa", "triton", "eager"], precision=["fp32", "bf16"],
                     modes=["forward", "forward_backward", "step"], batch=4, context=[512], warmup=5, steps=10)
CPU_DEFAULTS = dict(sizes=["tiny"], attention=["sdpa", "eager", "pytorch"], precision=["fp32", "bf16"],
                    modes=["forward", "forward_backward", "step"], batch=2, context=[64], warmup=1, steps=3)

TABLE_COLUMNS = ("size", "attention", "precision", "mode", "compiled", "graphed", "batch", "context", "warmup", "steps",
                 "median_ms", "mean_ms", "std_ms", "first_ms", "min_ms", "tokens_per_s", "peak_mib", "compile_s", "status")


def set_attention(model: gpt.GPT, backend: str) -> None:
    """Point every attention layer of the model at one backend (weights untouched)."""
    if backend not in ATTENTIONS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {', '.join(ATTENTIONS)}")
    for module in model.modules():
        if isinstance(module, gpt.CausalSelfAttention):
            module.backend = backend


def precision_context(precision: str, device: torch.device, cache_enabled: bool = True):
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache_enabled)
    raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")


def make_step(model: gpt.GPT, mode: str, precision: str, batch: int, context: int,
              optimizer: torch.optim.Optimizer | None = None, seed: int = 0, compiled: bool = False,
              autocast_cache: bool = True, zero_grad: bool = True) -> Callable[[], None]:
    """One benchmark step of the given mode on a fixed random batch (``compiled``: the
    forward through ``torch.compile(model)``, the same parameters; backward and the
    optimizer step stay eager).  ``zero_grad=False`` leaves the gradients' reset to the
    caller (make_graphed_step: outside the captured graph)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "step" and optimizer is None:
        raise ValueError("mode 'step' needs an optimizer")
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    inputs, targets = gpt.random_batch(model.cfg, batch, context, device=device, generator=g)
    if compiled:  # Dynamo's caches start empty for each variant: earlier variants' graphs of the
        torch._dynamo.reset()  # same forward would count against its recompile limit (8) and run eagerly
    forward_model = torch.compile(model, dynamic=False) if compiled else model

    def forward_loss():
        with record_function("forward"), precision_context(precision, device, autocast_cache):
            logits = forward_model(inputs)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def backward(loss):
        with record_function("backward"):
            loss.backward()

    if mode == "inference":
        def step():
            with torch.inference_mode():
                forward_loss()
    elif mode == "forward":
        def step():
            forward_loss()
    elif mode == "forward_backward":
        def step():
            if zero_grad:
                model.zero_grad(set_to_none=True)
            backward(forward_loss())
    else:
        def step():
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            backward(forward_loss())
            with record_function("optimizer_step"):
                optimizer.step()
    return step


def make_optimizer(model: torch.nn.Module, capturable: bool = False) -> torch.optim.Optimizer:
    """AdamW; ``capturable``: its step count on the GPU, so a CUDA graph can replay the step."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, capturable=capturable)


GRAPH_WARMUP = 3  # eager steps on a side stream before capture (the docs' recipe: lazy state, allocator)


def make_graphed_step(model: gpt.GPT, mode: str, precision: str, batch: int, context: int,
                      optimizer: torch.optim.Optimizer | None = None, seed: int = 0,
                      compiled: bool = False) -> Callable[[], None]:
    """The step of ``make_step`` captured once in a CUDA graph (whole-network capture): a
    call replays every kernel of the step with one launch, so the host's cost per kernel is
    gone for every attention backend alike.  Fixed shapes and addresses: the batch, the
    gradients (allocated by the captured backward, from the graph's pool) and the optimizer's
    state stay where capture put them.  Autocast's weight cache is off (the graph must not
    hold casts made outside it).  ``compiled``: the step's forward through torch.compile, which
    compiles in the eager steps before capture.  CUDA only; the optimizer must be capturable."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise ValueError(f"a CUDA-graphed step needs a CUDA device; the model is on {device}")
    if mode == "inference":
        raise ValueError("a CUDA-graphed step records autograd: modes forward, forward_backward, step")
    if mode == "step" and (optimizer is None or not optimizer.defaults.get("capturable")):
        raise ValueError("a CUDA-graphed step needs an optimizer made with capturable=True")
    body = make_step(model, mode, precision, batch, context, optimizer, seed=seed, autocast_cache=False,
                     zero_grad=False, compiled=compiled)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            model.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream(device).wait_stream(side)
    model.zero_grad(set_to_none=True)  # the captured backward allocates the gradients it writes
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph.replay


@dataclass(frozen=True)
class ModelCase:
    size: str
    attention: str
    precision: str
    mode: str
    batch: int
    context: int
    compiled: bool = False
    graphed: bool = False

    def row(self, **values) -> dict:
        return dict(size=self.size, attention=self.attention, precision=self.precision, mode=self.mode,
                    batch=self.batch, context=self.context, compiled=self.compiled, graphed=self.graphed, **values)


def measure_case(model: gpt.GPT, case: ModelCase, *, warmup: int, steps: int) -> dict:
    """One row: step times (mean, std, first, min), tokens/s and peak memory, or why not."""
    device = next(model.parameters()).device
    row = case.row(warmup=warmup, steps=steps, median_ms=None, mean_ms=None, std_ms=None, first_ms=None, min_ms=None,
                   tokens_per_s=None, peak_mib=None, compile_s=None, status=OK, detail="", times_ms=[])
    outcome, optimizer, step = None, None, None
    try:
        set_attention(model, case.attention)
        optimizer = make_optimizer(model, capturable=case.graphed) if case.mode == "step" else None
        if case.graphed:  # capture (after its own eager warm-up) is not timed; replays are
            started = time.perf_counter()
            step = make_graphed_step(model, case.mode, case.precision, case.batch, case.context, optimizer,
                                     compiled=case.compiled)
            if case.compiled:  # compilation, the eager steps it ran in, and the capture
                row["compile_s"] = time.perf_counter() - started
        else:
            step = make_step(model, case.mode, case.precision, case.batch, case.context, optimizer,
                             compiled=case.compiled)
        for i in range(warmup):
            started = time.perf_counter()
            step()
            if i == 0 and case.compiled and not case.graphed:  # tracing and compilation: apart, never timed
                synchronize(device)
                row["compile_s"] = time.perf_counter() - started
        before = call_graphs.stats()
        with measure.PeakMemory(device) as peak:
            times = measure.time_calls(step, device, warmup=0, steps=steps)
        after = call_graphs.stats()
        # What our attention's call graphs did in the timed steps (impl/attention/call_graphs.py):
        # a step whose tensors come back at the same addresses replays, one whose do not records or
        # is issued directly.
        row["call_graphs"] = {k: after[k] - before[k] for k in ("direct", "recorded", "replayed", "declined")}
        mean, std = measure.mean_std(times)
        row.update(median_ms=statistics.median(times) * 1e3, mean_ms=mean * 1e3, std_ms=std * 1e3, first_ms=times[0] * 1e3, min_ms=min(times) * 1e3,
                   tokens_per_s=case.batch * case.context / mean, peak_mib=peak.mib,
                   times_ms=[t * 1e3 for t in times])
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, the run goes on
        outcome = Outcome.of(exc)
        row.update(status=outcome.label, detail=outcome.detail)
    finally:
        optimizer = step = None  # noqa: F841 - drop the optimizer state before freeing
        model.zero_grad(set_to_none=True)
    if outcome is not None:
        measure.free_memory(device)
    return row


def run_benchmarks(sizes: Sequence[str], attentions: Sequence[str], precisions: Sequence[str],
                   modes: Sequence[str], contexts: Sequence[int], *, batch: int, warmup: int, steps: int,
                   compiled: Sequence[bool] = (False,), graphed: Sequence[bool] = (False,),
                   device="cpu", time_budget_s: float | None = None, log=print) -> list[dict]:
    """Every (size, context, precision, attention, mode); one model per size."""
    device = torch.device(device)
    for name, values, allowed in (("attention", attentions, ATTENTIONS), ("precision", precisions, PRECISIONS),
                                  ("mode", modes, MODES)):
        for v in values:
            if v not in allowed:
                raise ValueError(f"unknown {name} {v!r}; expected one of {', '.join(allowed)}")
    for s in sizes:
        if s not in gpt.SIZES:
            raise ValueError(f"unknown model size {s!r}; expected one of {', '.join(gpt.SIZES)}")
    if batch < 1 or not contexts or min(contexts) < 1:
        raise ValueError(f"batch and context lengths must be positive, got batch={batch}, contexts={list(contexts)}")
    deadline = Deadline(time_budget_s)
    rows: list[dict] = []
    for size in sizes:
        cases = [ModelCase(size, a, p, m, batch, c, comp, graph) for c in contexts for p in precisions
                 for a in attentions for comp in compiled for graph in graphed for m in modes]
        if deadline.expired:
            rows += [c.row(status=measure.SKIPPED, detail="time budget") for c in cases]
            continue
        model, build_failure = None, None
        try:
            context_length = max(max(contexts), gpt.SIZES[size].context_length)
            model = gpt.make_gpt(size, device=device, context_length=context_length)
            n_params = gpt.count_parameters(model)
            if log:
                log(f"{size}: {n_params / 1e6:.1f} M parameters, context length up to {max(contexts)}, batch {batch}")
        except Exception as exc:  # noqa: BLE001
            build_failure = Outcome.of(exc)
        if build_failure is not None:
            model = None
            measure.free_memory(device)
            rows += [c.row(status=build_failure.label, detail="building the model: " + build_failure.detail) for c in cases]
            continue
        for case in cases:
            if deadline.expired:
                rows.append(case.row(status=measure.SKIPPED, detail="time budget"))
                continue
            row = measure_case(model, case, warmup=warmup, steps=steps)
            row["params_m"] = round(n_params / 1e6, 1)
            rows.append(row)
            if log:
                timing = (f"{row['mean_ms']:9.2f} ± {row['std_ms']:7.2f} ms (first {row['first_ms']:9.2f})"
                          if row["mean_ms"] is not None else row["status"])
                mem = f"{row['peak_mib']:9.0f} MiB" if row["peak_mib"] is not None else ""
                log(f"  {size:7s} ctx {case.context:5d} {case.precision} {case.attention:7s} {case.mode:17s} {timing} {mem}")
        model = None
        measure.free_memory(device)
    return rows


def relative_to(rows: Sequence[dict], baseline: str = "eager") -> None:
    """Add ``speedup_vs_<baseline>``: the baseline attention's mean time over this row's."""
    key = f"speedup_vs_{baseline}"
    # the eager baseline is the uncompiled, ungraphed one: other rows read against plain eager
    base = {(r["size"], r["precision"], r["mode"], r["batch"], r["context"]): r["mean_ms"]
            for r in rows if r["attention"] == baseline and not r.get("compiled") and not r.get("graphed")
            and r.get("mean_ms")}
    for r in rows:
        b = base.get((r["size"], r["precision"], r["mode"], r["batch"], r["context"]))
        r[key] = (b / r["mean_ms"]) if b and r.get("mean_ms") else None


# --- memory snapshot and profiler trace --------------------------------------------------


def _gzip_in_place(path: Path) -> Path:
    gz = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return gz


def _write_target(path: str | Path) -> tuple[Path, bool]:
    """Where to write first, and whether to gzip it after (a path ending in .gz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        return path.with_suffix(""), True
    return path, False


def _training_step_for(size: str, attention: str, precision: str, mode: str, batch: int, context: int, device):
    model = gpt.make_gpt(size, device=device, context_length=max(context, gpt.SIZES[size].context_length))
    set_attention(model, attention)
    optimizer = make_optimizer(model) if mode == "step" else None
    return model, optimizer, make_step(model, mode, precision, batch, context, optimizer)


def memory_snapshot(path: str | Path, *, size: str, attention: str, precision: str, batch: int, context: int,
                    device, mode: str = "step", warmup: int = 1, max_entries: int = 100_000) -> tuple[Path | None, str]:
    """Record the allocator's history over one step and dump it (a .pickle for pytorch.org/memory_viz).

    Returns (path written or None, a one-line note).  Needs CUDA: the CPU has no caching
    allocator history.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None, "memory snapshot needs a GPU: torch.cuda.memory._record_memory_history records the CUDA allocator"
    raw, compress = _write_target(path)
    model, optimizer, step = _training_step_for(size, attention, precision, mode, batch, context, device)
    for _ in range(warmup):
        step()
    synchronize(device)
    try:
        torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    except TypeError:  # an older torch without the stacks argument
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        step()
        synchronize(device)
        torch.cuda.memory._dump_snapshot(str(raw))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        model = optimizer = step = None  # noqa: F841
        measure.free_memory(device)
    written = _gzip_in_place(raw) if compress else raw
    return written, f"memory snapshot of one {mode} ({size}, {attention}, {precision}, batch {batch} x {context}): {written}"


def profile_trace(path: str | Path, *, size: str, attention: str, precision: str, batch: int, context: int,
                  device, mode: str = "step", warmup: int = 1, steps: int = 1, row_limit: int = 20) -> tuple[Path, str]:
    """A torch.profiler Chrome trace of ``steps`` steps; returns (path, the top-operators table)."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    raw, compress = _write_target(path)
    model, optimizer, step = _training_step_for(size, attention, precision, mode, batch, context, device)
    try:
        for _ in range(warmup):
            step()
        synchronize(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
            for _ in range(steps):
                step()
                synchronize(device)
        prof.export_chrome_trace(str(raw))
        sort_key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
        try:
            table = prof.key_averages().table(sort_by=sort_key, row_limit=row_limit)
        except (KeyError, AttributeError, ValueError):  # torch versions name the device column differently
            table = prof.key_averages().table(sort_by="cuda_time_total" if device.type == "cuda" else "cpu_time_total",
                                              row_limit=row_limit)
    finally:
        model = optimizer = step = None  # noqa: F841
        measure.free_memory(device)
    written = _gzip_in_place(raw) if compress else raw
    return written, table


# --- outputs -----------------------------------------------------------------------------


def markdown_sections(rows: Sequence[dict], heading: str = "Model benchmark") -> list[tuple[str, str]]:
    from perf.lib.tables import markdown_table

    columns = list(TABLE_COLUMNS)
    if any(r.get("speedup_vs_eager") is not None for r in rows):
        columns.insert(columns.index("peak_mib"), "speedup_vs_eager")
    headers = [{"median_ms": "median ms", "mean_ms": "mean ms", "std_ms": "std ms", "first_ms": "first ms", "min_ms": "min ms",
                "tokens_per_s": "tokens/s", "peak_mib": "peak MiB", "speedup_vs_eager": "x eager"}.get(c, c)
               for c in columns]
    sections = [(heading, markdown_table(rows, columns, headers))]
    failures = [r for r in rows if r["status"] not in (OK, measure.OOM, measure.SKIPPED)]
    if failures:
        sections.append((f"{heading}: errors", "\n".join(
            f"- {r['size']} {r['attention']} {r['precision']} {r['mode']}: {r['detail']}" for r in failures)))
    return sections


def write_outputs(rows: Sequence[dict], out_dir: str | Path, meta: dict | None = None, plots: bool = True,
                  stem: str = "model", extra_sections: Sequence[tuple[str, str]] = ()) -> list[Path]:
    from perf.lib import tables

    out_dir = Path(out_dir)
    paths = [
        tables.write_markdown(out_dir / f"{stem}.md", [*markdown_sections(rows), *extra_sections], title="GPT model benchmark"),
        tables.write_csv(out_dir / f"{stem}.csv", rows, [*TABLE_COLUMNS, "speedup_vs_eager", "params_m", "detail"]),
        tables.write_json(out_dir / f"{stem}.json", dict(meta=meta or {}, rows=list(rows))),
    ]
    if plots and rows:
        from perf.lib import plots as plotting

        paths += plotting.plot_model(rows, out_dir, name=f"{stem}.png")
    return paths


# --- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m perf.bench.model", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--sizes", nargs="+", choices=list(gpt.SIZES), help="default: the five standard sizes on CUDA, tiny on the CPU")
    parser.add_argument("--attention", nargs="+", choices=ATTENTIONS)
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS)
    parser.add_argument("--modes", nargs="+", choices=MODES)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--context", nargs="+", type=int, help="context lengths (sequence length of the batch)")
    parser.add_argument("--compile", nargs="+", choices=("off", "on"), default=["off"],
                        help="torch.compile the model's forward: off, on, or both side by side (compilation is the first warm-up step, reported as compile_s)")
    parser.add_argument("--cuda-graph", nargs="+", choices=("off", "on"), default=["off"],
                        help="replay each step from a CUDA graph captured once (CUDA only; with --compile on, the "
                             "compiled step is captured): off, on, or both side by side")
    parser.add_argument("--warmup", type=int, help="untimed steps first; 0 times the first steps too")
    parser.add_argument("--steps", type=int, help="timed steps")
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--out", default="perf-out")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-timing", action="store_true", help="only the snapshot and/or trace")
    parser.add_argument("--memory-snapshot", metavar="FILE", help="dump a CUDA memory snapshot of one step (.pickle[.gz])")
    parser.add_argument("--profile-trace", metavar="FILE", help="write a Chrome trace of one step (.json[.gz])")
    parser.add_argument("--artifact-mode", choices=MODES, default="step", help="what the snapshot and trace record")
    return parser


def main(argv: Sequence[str] | None = None) -> list[dict]:
    from perf.bench.attention import resolve_device, use_interpreter_on_cpu

    opts = build_parser().parse_args(argv)
    device = resolve_device(opts.device)
    use_interpreter_on_cpu(device)
    d = CUDA_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    sizes, attentions = opts.sizes or d["sizes"], opts.attention or d["attention"]
    precisions, modes, contexts = opts.precision or d["precision"], opts.modes or d["modes"], opts.context or d["context"]
    batch = opts.batch or d["batch"]
    warmup = d["warmup"] if opts.warmup is None else opts.warmup
    steps = opts.steps or d["steps"]
    if warmup < 0 or steps < 1:
        raise SystemExit(f"--warmup must be >= 0 and --steps >= 1 (got {warmup}, {steps})")
    meta = dict(measure.device_description(device), sizes=sizes, attention=attentions, precision=precisions,
                modes=modes, batch=batch, context=contexts, warmup=warmup, steps=steps)
    rows, extra = [], []
    if not opts.no_timing:
        if "on" in opts.compile and warmup < 1:
            raise SystemExit("--compile on needs --warmup >= 1: the first step compiles")
        if "on" in opts.cuda_graph and device.type != "cuda":
            raise SystemExit(f"--cuda-graph on needs a CUDA device (this run is on {device})")
        if "on" in opts.cuda_graph and "inference" in modes:
            raise SystemExit("--cuda-graph on graphs training steps: drop the inference mode")
        rows = run_benchmarks(sizes, attentions, precisions, modes, contexts, batch=batch, warmup=warmup,
                              steps=steps, device=device, time_budget_s=opts.time_budget_s,
                              compiled=[c == "on" for c in opts.compile],
                              graphed=[g == "on" for g in opts.cuda_graph])
        relative_to(rows, "eager")
    artifact = dict(size=sizes[0], attention=attentions[0], precision=precisions[0], batch=batch,
                    context=contexts[0], device=device, mode=opts.artifact_mode)
    if opts.memory_snapshot:
        _, note = memory_snapshot(opts.memory_snapshot, **artifact)
        print(note)
        extra.append(("Memory snapshot", note))
    if opts.profile_trace:
        path, table = profile_trace(opts.profile_trace, **artifact)
        print(f"profiler trace: {path}")
        extra.append(("Profiler: top operators", f"Chrome trace: {path}\n\n```\n{table}\n```"))
    if rows or extra:
        paths = write_outputs(rows, opts.out, meta, plots=not opts.no_plots and bool(rows), extra_sections=extra)
        print(Path(paths[0]).read_text())
    return rows


if __name__ == "__main__":
    main()
