"""Benchmark: optimizer-state sharding on a ~1.5B-parameter GPT, data parallel on 2 GPUs.

    python -m perf.bench.sharded_optimizer --out DIR            # 2 GPUs, NCCL, gpt1_5b
    python -m perf.bench.sharded_optimizer --tiny --out DIR     # CPU, gloo, tiny GPT (seconds)

One run measures, per optimizer variant, on a fresh model each (hooks or relocated
parameters left by one variant must not touch the next):

    adamw                      torch.optim.AdamW on every rank (replicated state)
    zero                       torch's ZeroRedundancyOptimizer(AdamW)
    ours_allgather             impl ShardedOptimizer(AdamW), sync="allgather" (default), 128 MB buckets
    ours_broadcast             impl ShardedOptimizer(AdamW), sync="broadcast", 128 MB buckets
    ours_allgather_one_round   sync="allgather", one bucket (no overlap of update and sync)

The training step: zero_grad, forward under bf16 autocast (fp32 on the CPU), cross
entropy, backward through torch DDP (gradient all-reduce, 100 MB buckets, gradients as
bucket views), optimizer.step().  AdamW with its default (foreach) implementation, lr
1e-4, weight decay 0.1, everywhere.

Per variant and rank: step time (median of the timed steps, each between CUDA syncs)
and the optimizer.step() part of it, peak memory allocated over the warm-up and timed
steps, and the memory breakdown: parameters, gradients, optimizer state (measured, with
its formula), activations (bytes of the distinct tensors autograd saves in one forward,
and on CUDA the growth of allocated memory over that forward).  Results:
``DIR/sharded_optimizer.json`` (everything) and ``DIR/sharded_optimizer.md`` (tables);
the JSON is rewritten after every variant, so a run cut short keeps what it measured.

Goals checked in the tables: ours' peak <= ZeroRedundancyOptimizer's, and ours' step time
<= 1.05 x plain AdamW's.

NCCL_NVLS_ENABLE=0 is forced (NVLink multicast stays off on the shared GPUs).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from impl.models.gpt import count_parameters, make_gpt, random_batch  # noqa: E402
from conformance.accounting import (  # noqa: E402
    adam_state_bytes,
    gib,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
    saved_activation_bytes,
)
from perf.lib.workloads import synchronize  # noqa: E402

VARIANTS = ("adamw", "zero", "ours_allgather", "ours_broadcast", "ours_allgather_one_round")
ADAMW = dict(lr=1e-4, weight_decay=0.1)
STEP_TIME_GOAL = 1.05  # ours <= 1.05 x AdamW


# --- building one variant ------------------------------------------------------------------


def build_optimizer(variant: str, params):
    from impl.zero.optimizer import ShardedOptimizer

    if variant == "adamw":
        return torch.optim.AdamW(params, **ADAMW)
    if variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **ADAMW)
    if variant == "ours_allgather":
        return ShardedOptimizer(params, torch.optim.AdamW, sync="allgather", **ADAMW)
    if variant == "ours_broadcast":
        return ShardedOptimizer(params, torch.optim.AdamW, sync="broadcast", **ADAMW)
    if variant == "ours_allgather_one_round":
        return ShardedOptimizer(params, torch.optim.AdamW, sync="allgather", bucket_mb=None, **ADAMW)
    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


def owned_elements(optimizer, params) -> tuple[int, int] | None:
    """(elements, parameters) whose state this rank keeps, where the optimizer says."""
    if hasattr(optimizer, "owned_indices"):  # ours
        owned = [params[i] for i in optimizer.owned_indices()]
    elif hasattr(optimizer, "optim"):  # ZeroRedundancyOptimizer
        owned = [p for g in optimizer.optim.param_groups for p in g["params"]]
    else:
        owned = params
    return sum(p.numel() for p in owned), len(owned)


# --- one training step ---------------------------------------------------------------------


def forward_loss(model, batch, device):
    x, y = batch
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(x)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def timed_step(model, optimizer, batch, device) -> tuple[float, float]:
    """Seconds of the whole step and of optimizer.step() alone (CUDA-synchronised)."""
    synchronize(device)
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    forward_loss(model, batch, device).backward()
    synchronize(device)
    t1 = time.perf_counter()
    optimizer.step()
    synchronize(device)
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1


def measure_variant(variant, args, rank, world_size, device) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = make_gpt(args.size, device=device)
    cfg = model.cfg
    params = list(model.parameters())
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=100, gradient_as_bucket_view=True)
    optimizer = build_optimizer(variant, list(ddp.parameters()))
    g = torch.Generator(device=device).manual_seed(1000 + rank)  # each rank its own data
    batches = [tuple(t for t in random_batch(cfg, args.batch, args.seq, device=device, generator=g)) for _ in range(2)]

    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times, step_times = [], []
    for i in range(args.warmup + args.steps):
        whole, opt_only = timed_step(ddp, optimizer, batches[i % 2], device)
        if i >= args.warmup:
            times.append(whole)
            step_times.append(opt_only)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None

    # Activations: one more forward (no backward), with the gradients still allocated.
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    with saved_activation_bytes(exclude=params) as saved:
        loss = forward_loss(ddp, batches[0], device)
    grown = (torch.cuda.memory_allocated(device) - before) if device.type == "cuda" else None
    del loss

    n_elems, n_params = count_parameters(model), len(params)
    owned_elems, owned_params = owned_elements(optimizer, params)
    result = {
        "variant": variant,
        "rank": rank,
        "status": "ok",
        "step_ms": statistics.median(times) * 1e3,
        "step_ms_all": [t * 1e3 for t in times],
        "optimizer_step_ms": statistics.median(step_times) * 1e3,
        "peak_bytes": peak,
        "parameter_bytes": parameter_bytes(params),
        "parameter_bytes_formula": 4 * n_elems,
        "gradient_bytes": gradient_bytes(params),
        "gradient_bytes_formula": 4 * n_elems,
        "optimizer_state_bytes": optimizer_state_bytes(optimizer),
        "optimizer_state_bytes_formula": adam_state_bytes(owned_elems, owned_params),
        "optimizer_state_bytes_ideal": 2 * 4 * n_elems / (1 if variant == "adamw" else world_size),
        "owned_elements": owned_elems,
        "activation_saved_bytes": saved["bytes"],
        "activation_allocated_bytes": grown,
        "parameters": n_elems,
    }
    del ddp, model, optimizer, params, batches
    return result


# --- ranks ------------------------------------------------------------------------------------


def rank_main(rank, world_size, store_path, args, queue):
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=args.collective_timeout))
    try:
        for variant in args.variants:
            try:
                result = measure_variant(variant, args, rank, world_size, device)
            except Exception as exc:  # noqa: BLE001 - recorded, and the next variant runs
                oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)
                result = {"variant": variant, "rank": rank, "status": "OOM" if oom else f"error: {type(exc).__name__}: {str(exc)[:300]}", "traceback": traceback.format_exc()[-3000:]}
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            queue.put(result)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def run(args) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    results: list[dict] = []
    info = describe(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # On the GPU each variant gets fresh rank processes: memory one variant leaves behind (a
    # model kept alive by a hook, an allocator cache) can never inflate the next one's peak.
    # The CPU smoke mode measures no peak, so its ranks run every variant in one start-up.
    groups = [list(args.variants)] if args.device == "cpu" else [[v] for v in args.variants]
    deadline = time.monotonic() + args.deadline
    for group in groups:
        one = argparse.Namespace(**{**vars(args), "variants": group})
        got = []
        with tempfile.TemporaryDirectory() as tmp:
            procs = [ctx.Process(target=rank_main, args=(r, args.world_size, os.path.join(tmp, "store"), one, queue)) for r in range(args.world_size)]
            for p in procs:
                p.start()
            while len(got) < args.world_size * len(group) and time.monotonic() < deadline:
                try:
                    got.append(queue.get(timeout=5))
                except Exception:  # queue.Empty
                    if not any(p.is_alive() for p in procs):
                        break
            results.extend(got)
            write_results(out, info, results)
            for p in procs:
                p.join(timeout=60 if len(got) == args.world_size * len(group) else 1)
                if p.is_alive():
                    p.kill()
        if time.monotonic() >= deadline:
            break
    expected = len(args.variants) * args.world_size
    if len(results) < expected:
        info["incomplete"] = f"{len(results)} of {expected} rank results (deadline {args.deadline:.0f} s or a rank died)"
    summary = write_results(out, info, results)
    return summary


def describe(args) -> dict:
    info = {"argv": sys.argv[1:], "world_size": args.world_size, "device": args.device, "size": args.size, "batch": args.batch, "seq": args.seq, "warmup": args.warmup, "steps": args.steps, "torch": torch.__version__, "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


# --- tables -------------------------------------------------------------------------------------


def summarise(results: list[dict], world_size: int) -> list[dict]:
    """One row per variant: times are the slowest rank's, memory the largest rank's."""
    rows = []
    for variant in VARIANTS:
        mine = [r for r in results if r["variant"] == variant]
        if not mine:
            continue
        failed = [r for r in mine if r["status"] != "ok"]
        if failed or len(mine) < world_size:
            rows.append({"variant": variant, "status": failed[0]["status"] if failed else "missing ranks"})
            continue

        def worst(key):
            values = [r[key] for r in mine if r[key] is not None]
            return max(values) if values else None

        rows.append({
            "variant": variant, "status": "ok",
            "step_ms": worst("step_ms"), "optimizer_step_ms": worst("optimizer_step_ms"),
            "peak_bytes": worst("peak_bytes"), "optimizer_state_bytes": worst("optimizer_state_bytes"),
            "optimizer_state_bytes_per_rank": [r["optimizer_state_bytes"] for r in sorted(mine, key=lambda r: r["rank"])],
        })
    by = {r["variant"]: r for r in rows if r["status"] == "ok"}
    for row in rows:
        if row["status"] != "ok":
            continue
        if "adamw" in by:
            row["step_vs_adamw"] = row["step_ms"] / by["adamw"]["step_ms"]
        if "zero" in by and row["peak_bytes"] is not None:
            row["peak_vs_zero"] = row["peak_bytes"] / by["zero"]["peak_bytes"]
        if row["variant"].startswith("ours"):
            row["goal_step_time"] = row.get("step_vs_adamw") is not None and row["step_vs_adamw"] <= STEP_TIME_GOAL
            row["goal_peak"] = None if row.get("peak_vs_zero") is None else row["peak_vs_zero"] <= 1.0
    return rows


def _fmt(value, unit=""):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if unit == "GiB":
        return f"{gib(value):.2f}"
    if unit == "MiB":
        return f"{value / 2**20:.2f}"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _table_row(cells, width: int) -> str:
    """A Markdown table row of ``width`` cells; a short one (a failed variant) ends in empty cells."""
    return "| " + " | ".join([str(c) for c in cells] + [""] * (width - len(cells))) + " |"


def markdown(info: dict, rows: list[dict], results: list[dict]) -> str:
    unit = "GiB" if info["device"] == "cuda" else "MiB"
    lines = [
        "# Optimizer-state sharding benchmark",
        "",
        f"{info.get('gpu', 'CPU')} x {info['world_size']}, torch {info['torch']}, model {info['size']}, batch {info['batch']} x {info['seq']} tokens per rank, "
        f"{info['warmup']} warm-up + {info['steps']} timed steps, NCCL_NVLS_ENABLE={info['nccl_nvls_enable']}.",
        "Times: median over timed steps, slowest rank. Memory: largest rank.",
        *([f"**Incomplete run**: {info['incomplete']}."] if info.get("incomplete") else []),
        "",
        f"| variant | step ms | optimizer.step ms | peak {unit} | optimizer state {unit} (max rank) | step / AdamW | peak / ZeRO | step goal (<= {STEP_TIME_GOAL}x AdamW) | peak goal (<= ZeRO) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(_table_row([r["variant"], r["status"]] if r["status"] != "ok" else [
            r["variant"], _fmt(r["step_ms"]), _fmt(r["optimizer_step_ms"]), _fmt(r["peak_bytes"], unit),
            _fmt(r["optimizer_state_bytes"], unit), _fmt(r.get("step_vs_adamw")), _fmt(r.get("peak_vs_zero")),
            _fmt(r.get("goal_step_time")) if "goal_step_time" in r else "",
            _fmt(r.get("goal_peak")) if "goal_peak" in r else "",
        ], 9))
    lines += [
        "",
        f"## Memory breakdown per rank ({unit}; measured / formula)",
        "",
        "Formulas: parameters and gradients 4 B x elements; AdamW state 2 x 4 B x owned elements + 4 B per owned parameter (step); "
        "ideal state 2 x 4 B x elements / W. Activations: distinct tensors saved for backward in one forward (bf16 autocast on CUDA, "
        "so autocast's bf16 weight copies count), and the growth of allocated memory over that forward.",
        "",
        "| variant | rank | parameters | gradients | optimizer state | state formula | state ideal | activations saved | activations allocated | peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (VARIANTS.index(r["variant"]), r["rank"])):
        lines.append(_table_row([r["variant"], r["rank"], r["status"]] if r["status"] != "ok" else [
            r["variant"], r["rank"],
            f"{_fmt(r['parameter_bytes'], unit)} / {_fmt(r['parameter_bytes_formula'], unit)}",
            f"{_fmt(r['gradient_bytes'], unit)} / {_fmt(r['gradient_bytes_formula'], unit)}",
            *(_fmt(r[key], unit) for key in ("optimizer_state_bytes", "optimizer_state_bytes_formula",
                                             "optimizer_state_bytes_ideal", "activation_saved_bytes",
                                             "activation_allocated_bytes", "peak_bytes")),
        ], 10))
    return "\n".join(lines) + "\n"


def write_results(out: Path, info: dict, results: list[dict]) -> dict:
    rows = summarise(results, info["world_size"])
    payload = {"info": info, "summary": rows, "per_rank": results}
    (out / "sharded_optimizer.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (out / "sharded_optimizer.md").write_text(markdown(info, rows, results))
    return payload


# --- command line ----------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for sharded_optimizer.json and .md")
    p.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny GPT: a seconds-long smoke run")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--size", default=None, help="impl.models.gpt size (default gpt1_5b; tiny with --tiny)")
    p.add_argument("--batch", type=int, default=None, help="sequences per rank (default 4; 2 with --tiny)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 256; 16 with --tiny)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3; 1 with --tiny)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 2 with --tiny)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--collective-timeout", type=float, default=120.0, help="seconds before a stuck collective fails")
    p.add_argument("--deadline", type=float, default=420.0, help="seconds after which the ranks are stopped and what was measured is written")
    args = p.parse_args(argv)
    tiny = args.tiny
    args.device = "cpu" if tiny else "cuda"
    for name, big, small in (("size", "gpt1_5b", "tiny"), ("batch", 4, 2), ("seq", 256, 16), ("warmup", 3, 1), ("steps", 10, 2)):
        if getattr(args, name) is None:
            setattr(args, name, small if tiny else big)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            p.error("no CUDA device: run with --tiny for the CPU smoke mode")
        if torch.cuda.device_count() < args.world_size:
            p.error(f"needs {args.world_size} GPUs, found {torch.cuda.device_count()}")
    if args.world_size < 1:
        p.error("--world-size must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    payload = run(args)
    elapsed = time.perf_counter() - start
    print((Path(args.out) / "sharded_optimizer.md").read_text())
    print(f"wrote {args.out}/sharded_optimizer.json and .md in {elapsed:.0f} s")
    failed = [r for r in payload["summary"] if r["status"] != "ok"]
    missing = set(args.variants) - {r["variant"] for r in payload["summary"]}
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
