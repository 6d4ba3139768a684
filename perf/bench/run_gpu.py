"""Every benchmark of the harness in one GPU call of at most ~8 minutes (one H100).

    PYTHONUNBUFFERED=1 python3 -m perf.bench.run_gpu [--out DIR] [--budget-s 450] [--tiny]

Stages, in this order (each cut cleanly by the budget; what ran is written):
 1. ``--warmup 0`` in a fresh process: the small model's bf16 training step with our
    Triton attention, then SDPA, timed from the very first step (CUDA context, cuBLAS
    handles, Triton compilation and first allocations included).
 2. Model benchmark: small and medium, bf16 autocast, attention sdpa / triton / eager,
    forward, forward+backward and AdamW step; batch 4, context 512, 5 warm-up and 10
    timed steps.  Then memory and time by context length (256..4096) for the small
    model's step.
 3. A CUDA memory snapshot and a torch.profiler Chrome trace of one small-model step
    (Triton attention, bf16).
 4. The attention sweep: B=1, H=16, causal; bf16 at seq 1024..32768 and d 64, 128 for
    triton / eager / SDPA flash / cuDNN / memory-efficient; fp32 at seq 1024 and 8192;
    seq 65536 at d 64 (eager runs out of memory there: the table says "OOM").
 5. Plots, tables, and the report.

Files in OUT (at most 8, as the device tool returns): report.md (every table),
results.json (every row and the run's facts), attention_time.png, attention_memory.png,
model.png, memory_snapshot.pickle.gz (gunzip, then drop on https://pytorch.org/memory_viz),
trace.json.gz (https://ui.perfetto.dev opens it as is), extras.tar.gz (CSV tables, the
per-stage Markdown and the full log).  OUT: --out, else $OUT, else perf-out/.

Without a GPU (or with --tiny) every stage runs at a tiny size on the CPU, Triton under
its interpreter, so the script itself is checked anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: the fresh process runs there

import torch  # noqa: E402

GPU_PLAN = dict(
    warmup0=dict(sizes=["small"], attention=["triton", "sdpa"], precision=["bf16"], modes=["step"],
                 batch=4, context=[512], steps=5),
    model=dict(sizes=["small", "medium"], attention=["sdpa", "triton", "eager"], precision=["bf16"],
               modes=["forward", "forward_backward", "step"], batch=4, contexts=[512], warmup=5, steps=10),
    by_context=dict(sizes=["small"], attention=["sdpa", "triton", "eager"], precision=["bf16"], modes=["step"],
                    batch=4, contexts=[256, 512, 1024, 2048, 4096], warmup=3, steps=5),
    artifacts=dict(size="small", attention="triton", precision="bf16", batch=4, context=512),
    sweeps=[  # (seqs, dims, dtypes, impls)
        ([1024, 2048, 4096, 8192, 16384, 32768], [64, 128], ["bf16"],
         ["triton", "eager", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient"]),
        ([1024, 8192], [64, 128], ["fp32"], ["triton", "eager", "sdpa_efficient"]),
        ([65536], [64], ["bf16"], ["triton", "eager", "sdpa_flash", "sdpa_cudnn"]),
    ],
    heads=16,
)

CPU_PLAN = dict(
    warmup0=dict(sizes=["tiny"], attention=["pytorch", "sdpa"], precision=["bf16"], modes=["step"],
                 batch=2, context=[32], steps=2),
    model=dict(sizes=["tiny"], attention=["sdpa", "triton", "eager"], precision=["bf16"],
               modes=["forward", "forward_backward", "step"], batch=2, contexts=[32], warmup=1, steps=2),
    by_context=dict(sizes=["tiny"], attention=["sdpa", "eager"], precision=["bf16"], modes=["step"],
                    batch=2, contexts=[16, 32, 64], warmup=1, steps=2),
    artifacts=dict(size="tiny", attention="sdpa", precision="bf16", batch=2, context=32),
    sweeps=[([16, 32], [16], ["fp32"], ["triton", "eager", "sdpa"])],
    heads=2,
)


class Log:
    """Prints and keeps every line, for the log file in extras.tar.gz."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)


def run_warmup0(plan: dict, device: torch.device, work: Path, log: Log, timeout_s: float) -> list[dict]:
    """perf.bench.model with --warmup 0 in a fresh Python process (nothing compiled or cached yet)."""
    out = work / "warmup0"
    cmd = [sys.executable, "-m", "perf.bench.model", "--device", device.type, "--warmup", "0",
           "--steps", str(plan["steps"]), "--batch", str(plan["batch"]), "--out", str(out), "--no-plots",
           "--sizes", *plan["sizes"], "--attention", *plan["attention"], "--precision", *plan["precision"],
           "--modes", *plan["modes"], "--context", *map(str, plan["context"])]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if device.type == "cpu":
        env["TRITON_INTERPRET"] = "1"
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log(f"warm-up 0 run: stopped after {timeout_s:.0f} s")
        return []
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip() and not line.startswith("|"):
            log("  [warmup0] " + line)
    if proc.returncode != 0 or not (out / "model.json").exists():
        log(f"warm-up 0 run failed (exit {proc.returncode})")
        return []
    return json.loads((out / "model.json").read_text())["rows"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "perf-out")
    parser.add_argument("--budget-s", type=float, default=450.0, help="wall-clock seconds for everything")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized plan even on a GPU")
    opts = parser.parse_args(argv)

    start = time.monotonic()
    deadline = start + opts.budget_s
    left = lambda: deadline - time.monotonic()  # noqa: E731
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from perf.bench.attention import use_interpreter_on_cpu

    use_interpreter_on_cpu(device)  # before anything imports triton
    plan = CPU_PLAN if (opts.tiny or device.type == "cpu") else GPU_PLAN
    if device.type == "cpu":
        torch.set_num_threads(1)  # a dry run on a shared CPU: threads waiting on each other only slow it down
    from perf.bench import attention as bench_attention, model as bench_model
    from perf.lib import measure, plots, tables

    log = Log()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="perf-gpu-"))
    meta = dict(measure.device_description(device), plan="gpu" if plan is GPU_PLAN else "tiny", budget_s=opts.budget_s)
    log(f"benchmarks on {meta.get('gpu', device)} (torch {torch.__version__}, triton {meta.get('triton')}); "
        f"budget {opts.budget_s:.0f} s; plan {meta['plan']}")
    stage_s, sections, files = {}, [], {}

    def stage(name):
        stage_s[name] = round(time.monotonic() - stage_start[0], 1)
        log(f"== {name}: {stage_s[name]} s (left {left():.0f} s)")
        stage_start[0] = time.monotonic()

    stage_start = [time.monotonic()]

    # 1. warm-up 0, fresh process
    log("== 1. --warmup 0 in a fresh process")
    warm0 = run_warmup0(plan["warmup0"], device, work, log, timeout_s=min(150.0, max(30.0, left() * 0.25)))
    if warm0:
        sections += bench_model.markdown_sections(warm0, "Model step with --warmup 0 (fresh process)")
        sections.append(("What --warmup 0 shows", (
            "The first timed step (`first ms`) includes CUDA context creation, cuBLAS/cuDNN handle set-up, "
            "Triton JIT compilation of the attention kernels (triton rows; the first backend of a process pays "
            "the most) and the caching allocator's first cudaMalloc calls, the optimizer state included; "
            "hence the large standard deviation. Compare with the warmed-up rows below.")))
    stage("warmup0")

    # 2. model benchmark, then memory/time by context length
    log("== 2. model benchmark")

    def model_part(part: dict, budget_share: float, heading: str) -> list[dict]:
        """One model-benchmark part of the plan, with its share of the time left; its table joins the report."""
        rows = bench_model.run_benchmarks(part["sizes"], part["attention"], part["precision"], part["modes"],
                                          part["contexts"], batch=part["batch"], warmup=part["warmup"],
                                          steps=part["steps"], device=device,
                                          time_budget_s=max(10.0, left() * budget_share), log=log)
        bench_model.relative_to(rows, "eager")
        sections.extend(bench_model.markdown_sections(rows, heading))
        return rows

    model_rows = model_part(plan["model"], 0.25, "Model benchmark (bf16 autocast)")
    context_rows = model_part(plan["by_context"], 0.2, "Model step by context length")
    stage("model")

    # 3. memory snapshot and profiler trace
    log("== 3. memory snapshot and profiler trace")
    a = dict(plan["artifacts"], device=device)
    try:
        snap, note = bench_model.memory_snapshot(work / "memory_snapshot.pickle.gz", **a)
        if snap:
            files["memory_snapshot.pickle.gz"] = snap
    except Exception as exc:  # noqa: BLE001 - the rest of the run still counts
        note = f"memory snapshot failed: {type(exc).__name__}: {exc}"
    log(note)
    sections.append(("Memory snapshot", note + "\n\nOpen: gunzip, then drop the .pickle on https://pytorch.org/memory_viz"))
    try:
        trace, table = bench_model.profile_trace(work / "trace.json.gz", **a)
        files["trace.json.gz"] = trace
        sections.append(("Profiler (one step; ranges forward / backward / optimizer_step)",
                         f"Chrome trace: trace.json.gz (https://ui.perfetto.dev)\n\n```\n{table}\n```"))
        log(table)
    except Exception as exc:  # noqa: BLE001
        log(f"profiler trace failed: {type(exc).__name__}: {exc}")
        sections.append(("Profiler", f"failed: {type(exc).__name__}: {exc}"))
    measure.free_memory(device)
    stage("artifacts")

    # 4. attention sweep, with what is left (20 s kept for plots and files)
    log(f"== 4. attention sweep (H={plan['heads']})")
    sweep = bench_attention.SweepResult()
    for seqs, dims, dtypes, impls in plan["sweeps"]:
        part = bench_attention.sweep(seqs, dims, dtypes, impls, device=device, heads=plan["heads"],
                                     time_budget_s=max(0.0, left() - 20.0), log=log)
        sweep.rows += part.rows
        sweep.not_run += part.not_run
    impl_order = list(dict.fromkeys(i for *_, impls in plan["sweeps"] for i in impls))
    sections += bench_attention.markdown_sections(sweep, impl_order)
    stage("attention")

    # 5. plots, tables, report
    png = []
    try:
        png += plots.plot_attention(sweep.rows, work) if sweep.rows else []
        png += plots.plot_model(context_rows, work) if context_rows else []
    except Exception as exc:  # noqa: BLE001
        log(f"plotting failed: {type(exc).__name__}: {exc}")
    for p in png:
        files[p.name] = p
    all_model = [dict(r, part="warmup0") for r in warm0] + [dict(r, part="model") for r in model_rows] + \
                [dict(r, part="by_context") for r in context_rows]
    extras = work / "extras"
    tables.write_csv(extras / "attention.csv", sweep.rows, bench_attention.TABLE_COLUMNS)
    tables.write_csv(extras / "model.csv", all_model, ["part", *bench_model.TABLE_COLUMNS, "speedup_vs_eager", "detail"])
    stage_s["total"] = round(time.monotonic() - start, 1)
    meta["stage_seconds"] = stage_s
    facts = "\n".join(f"- {k}: {v}" for k, v in meta.items())
    report = tables.write_markdown(work / "report.md", [("Run", facts), *sections], title="LLM-systems benchmarks")
    results = tables.write_json(work / "results.json", dict(meta=meta, attention=sweep.rows, attention_not_run=sweep.not_run,
                                                            model=all_model))
    (extras / "run.log").write_text("\n".join(log.lines) + "\n")
    with tarfile.open(work / "extras.tar.gz", "w:gz") as tar:
        tar.add(extras, arcname="extras")
        if (work / "warmup0").exists():
            tar.add(work / "warmup0", arcname="extras/warmup0")
    files = {"report.md": report, "results.json": results, **files, "extras.tar.gz": work / "extras.tar.gz"}
    for name, path in files.items():
        shutil.copyfile(path, out / name)
    shutil.rmtree(work, ignore_errors=True)

    print(report_text := (out / "report.md").read_text())
    sizes = ", ".join(f"{n} {(out / n).stat().st_size / 2**20:.2f} MiB" for n in files)
    print(f"\nwrote {len(files)} files to {out}: {sizes}")
    print(f"total {time.monotonic() - start:.0f} s of a {opts.budget_s:.0f} s budget")
    return 0 if report_text else 1


if __name__ == "__main__":
    sys.exit(main())
