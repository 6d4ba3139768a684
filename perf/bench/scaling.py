"""Weak scaling of data-parallel training: the same work per GPU on 1, 2, 4, ... GPUs.

    python -m perf.bench.scaling --out DIR                       # every GPU count up to the host's
    python -m perf.bench.scaling --out DIR --worlds 1 2 4 --variants torch_ddp_25 bucketed_250
    python -m perf.bench.scaling --tiny --out DIR                # CPU, gloo, tiny GPT (seconds; CI)

Each rank trains the gpt1_5b model on 4 x 256 tokens of its own a step (bf16 autocast,
AdamW, the step of ``perf/bench/ddp.py``, a fresh model per variant and world size).
At one GPU the baseline is ``local``, the step with no wrapper and no communication,
measured first and again last (the faster of the two is used).
For world size W and a variant whose median step is t_W:

    tokens per second   W * batch * seq / t_W
    efficiency          (tokens/s at W) / (W * tokens/s of local at 1)  =  t_local / t_W

so 1.0 is perfect weak scaling and the shortfall is what data parallelism costs.
Outputs in ``--out``: scaling.md, scaling.json, scaling.png (when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from conformance.harness import run_on_ranks, shutdown_pools
from perf.lib import tables
from perf.bench.ddp import Config, measure_variant, summarise
from perf.lib.measure import Deadline, device_description

DEFAULT_VARIANTS = ("torch_ddp_25", "torch_ddp_250", "bucketed_250")
COLUMNS = ("world_size", "variant", "median_ms", "std_ms", "tokens_per_s", "efficiency", "peak_gib", "replicas_identical", "status")


def measure(world: int, variant: str, cfg: Config, device: str, timeout: float) -> dict:
    try:
        per_rank = run_on_ranks(measure_variant, world, variant, cfg, None, device=device, timeout=timeout)
        row = summarise(variant, per_rank)
    except Exception as exc:  # noqa: BLE001 - one failure must not lose the other rows
        row = {"variant": variant, "status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    row["world_size"] = world
    if row["status"] == "ok":
        row["tokens_per_s"] = world * cfg.batch * cfg.seq / (row["median_ms"] / 1e3)
    return row


def add_efficiency(rows: list[dict]) -> float | None:
    """Efficiency of every row against local at one rank; returns local's tokens/s."""
    locals_ = [r for r in rows if r["variant"] in ("local", "local_again") and r["world_size"] == 1 and r["status"] == "ok"]
    if not locals_:
        return None
    base = max(locals_, key=lambda r: r["tokens_per_s"])  # measured first and last: the warmer one
    for r in rows:
        if r["status"] == "ok":
            r["efficiency"] = r["tokens_per_s"] / (r["world_size"] * base["tokens_per_s"])
    return base["tokens_per_s"]


def verdicts(rows: list[dict], ours_prefix: str = "bucketed_", theirs_prefix: str = "torch_ddp_") -> list[dict]:
    """Per world size above 1: our best efficiency against torch DDP's best."""
    out = []
    for w in sorted({r["world_size"] for r in rows if r["world_size"] > 1}):
        ok = [r for r in rows if r["world_size"] == w and r["status"] == "ok" and "efficiency" in r]
        ours = max((r for r in ok if r["variant"].startswith(ours_prefix)), key=lambda r: r["efficiency"], default=None)
        theirs = max((r for r in ok if r["variant"].startswith(theirs_prefix)), key=lambda r: r["efficiency"], default=None)
        if ours and theirs:
            out.append({"world_size": w, "ours": ours["variant"], "ours_efficiency": ours["efficiency"],
                        "torch": theirs["variant"], "torch_efficiency": theirs["efficiency"],
                        "ours_at_least_torch": ours["efficiency"] >= theirs["efficiency"]})
    return out


def plot(rows: list[dict], path: Path) -> Path | None:
    try:
        from perf.lib.plots import plt, save_figure
    except ImportError:  # matplotlib is the optional [plots] extra
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        pts = sorted((r["world_size"], r["efficiency"]) for r in rows if r["variant"] == variant and "efficiency" in r)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=variant)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("GPUs (ranks)")
    ax.set_ylabel("weak-scaling efficiency vs local at 1")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def write(out: Path, payload: dict) -> None:
    tables.write_json(out / "scaling.json", payload)
    sections = [
        ("Machine and configuration", "\n".join(f"- {k}: {v}" for k, v in {**payload["info"], **payload["config"]}.items())),
        ("Step time, throughput and efficiency (median over timed steps; a step is its slowest rank)",
         tables.markdown_table(payload["rows"], COLUMNS)),
        ("Ours at its best against torch DDP at its best, per world size",
         tables.markdown_table(payload["verdicts"], ("world_size", "ours", "ours_efficiency", "torch", "torch_efficiency", "ours_at_least_torch"))),
    ]
    tables.write_markdown(out / "scaling.md", sections, title="Weak scaling of data-parallel training")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="perf-out")
    p.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny GPT, float32, worlds 1 2")
    p.add_argument("--worlds", type=int, nargs="*", default=None, help="world sizes (default: 1, 2, 4, ... up to the GPU count)")
    p.add_argument("--variants", nargs="*", default=list(DEFAULT_VARIANTS), help="perf.bench.ddp variants measured at every world size")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per measurement before it is reported stuck")
    p.add_argument("--time-budget-s", type=float, default=420.0, help="measurements not started by then are skipped")
    return p.parse_args(argv)


def main(argv=None) -> int:
    opts = parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    if opts.tiny:
        device, base, top = "cpu", Config(size="tiny", batch=2, seq=32, precision="fp32", warmup=1, iters=2), 2
    else:
        device, base = "cuda", Config(iters=20)
        top = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if top < 1:
            print("perf.bench.scaling: needs a GPU (use --tiny on the CPU)", file=sys.stderr)
            return 2
    cfg = Config(**{**asdict(base), **{k: v for k, v in dict(warmup=opts.warmup, iters=opts.iters).items() if v is not None}})
    worlds = opts.worlds or [w for w in (1, 2, 4, 8, 16) if w <= top]
    info = device_description("cuda:0" if device == "cuda" else "cpu")
    info.update(backend="nccl" if device == "cuda" else "gloo", gpus_on_host=top if device == "cuda" else None)
    payload = {"info": info, "config": asdict(cfg), "rows": [], "verdicts": []}
    deadline, start = Deadline(opts.time_budget_s), time.perf_counter()
    plan = [(1, "local")] + [(w, v) for w in worlds for v in opts.variants] + [(1, "local_again")]
    try:
        for world, variant in plan:
            if deadline.expired:
                payload["rows"].append({"world_size": world, "variant": variant, "status": "skipped: time budget spent"})
                continue
            t0 = time.perf_counter()
            row = measure(world, variant, cfg, device, opts.timeout)
            payload["rows"].append(row)
            print(f"W={world} {variant:16s} {row.get('median_ms', float('nan')):9.2f} ms ({time.perf_counter() - t0:.1f} s) {row['status']}", flush=True)
            add_efficiency(payload["rows"])
            payload["verdicts"] = verdicts(payload["rows"])
            write(out, payload)
    finally:
        shutdown_pools()
    payload["info"]["wall_s"] = round(time.perf_counter() - start, 1)
    write(out, payload)
    png = plot(payload["rows"], out / "scaling.png")
    print((out / "scaling.md").read_text())
    print(f"wrote {out}/scaling.{{md,json}}" + (f" and {png.name}" if png else ""))
    return 1 if any(r["status"].startswith("error") for r in payload["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
