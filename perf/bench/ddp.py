"""Data-parallel step time: local vs naive, flat, individual, bucketed and torch DDP.

    python -m perf.bench.ddp --out DIR            # 2 GPUs (NCCL): gpt1_5b, 4 x 256 tokens a rank, bf16 autocast, AdamW
    python -m perf.bench.ddp --tiny --out DIR     # CPU (gloo, 2 ranks): tiny GPT, float32 (seconds; CI)

Variants, each on a fresh model (hooks left by one wrapper must not slow the next):

    local               no wrapper, no communication: the step every ratio is taken to
    naive               impl NaiveDDP: one blocking all-reduce per parameter after backward
    flat                impl FlatDDP: one all-reduce of all gradients, flattened, after backward
    individual          impl OverlappedIndividualDDP: async all-reduce per parameter from its hook
    bucketed_<MB>       impl BucketedDDP(bucket_size_mb=MB), MB in 1 5 10 25 50 100 250 and none (one bucket)
    bucketed_<MB>_side  the same with side_stream=True: gradients copied into the bucket on a
                        CUDA side stream (by request, not in the default list)
    bucketed_<MB>_cur   side_stream=False spelled out (the default: gradients copied into the
                        bucket on the backward's own stream)
    torch_ddp_<MB>      torch DistributedDataParallel(bucket_cap_mb=MB), MB in 10 25 50 100 250
    torch_ddp_25_gav    the same at 25 MB with gradient_as_bucket_view=True
    local_again         local once more, last: drift of the machine over the run

The step: zero_grad(set_to_none=True), on_train_batch_start, forward under bf16 autocast
(parameters, gradients and AdamW state float32), cross entropy, backward,
finish_gradient_synchronization, AdamW.step (foreach; lr 1e-4, weight decay 0.1).
For our wrappers the table also gives the host time per step spent launching
collectives (``launch_host_ms``) and in finish (``finish_host_ms``); ``--profile V ...``
writes one profiled step of each named variant (rank 0) to profile_<V>.txt.
``--warmup`` untimed steps, then ``--iters`` timed ones, each between device
synchronisations (perf.lib.measure.time_calls); the table gives the median (the ratio uses
it), mean, standard deviation and minimum, the peak memory, and whether the replicas'
parameters are bit-identical after the timed steps (a wrong wrapper is not a fast one).

Overhead model (``model`` section of the outputs)
    From the local run: the gradient-ready time of every parameter in backward (CUDA
    events recorded in post-accumulate-grad hooks) and the backward's end T.  From a
    probe of NCCL all-reduces at this world size: t(bytes) = alpha + bytes / beta
    (least squares).  For a bucket layout (impl.ddp.plan_buckets on the reverse
    registration order), the communication stream runs the buckets in launch order:

        start_i = max(ready_i, end_{i-1}),   end_i = start_i + alpha + bytes_i / beta
        exposed = max(0, end_last - T)

    and the predicted step is  t_local + exposed + n_buckets x h + c.  h is the host time
    of one bucket launch, measured (median of launch_host_ms / buckets): the step of this
    model is bound by the host (thousands of small kernels), so every launch (hook,
    copy, collective call) lengthens it.  c (the SMs NCCL takes from compute, the rest)
    is fitted as the median residual of the measured bucketed steps.  The predicted
    optimal bucket size minimises exposed (and, with h, exposed + n_buckets x h) over a
    fine grid of sizes from 1 to 1000 MiB.

Outputs in ``--out``: ddp.md, ddp.csv, ddp.json (rewritten after every variant, so a run
cut short keeps what it measured), ddp.png (when matplotlib is installed).  Ranks run
through ``conformance.harness.run_on_ranks``; NCCL_NVLS_ENABLE=0 is forced.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the shared GPUs

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from conformance.harness import run_on_ranks, shutdown_pools  # noqa: E402
from perf.lib import tables  # noqa: E402
from perf.bench.allreduce import allreduce_sweep, fit_alpha_beta, sizes_up_to  # noqa: E402
from impl.models.gpt import count_parameters, make_gpt, random_batch  # noqa: E402
from perf.lib.measure import Deadline, device_description, free_memory, time_calls  # noqa: E402
from perf.lib.workloads import synchronize  # noqa: E402

MIB = 1 << 20
OURS_BUCKETS_MB = (1, 5, 10, 25, 50, 100, 250, None)
TORCH_BUCKETS_MB = (10, 25, 50, 100, 250)
STEP_GOAL = 1.05  # ours at its best bucket size <= 1.05 x local


def default_variants() -> list[str]:
    return (
        ["local", "naive", "flat", "individual"]
        + [f"bucketed_{'none' if mb is None else mb}" for mb in OURS_BUCKETS_MB]
        + [f"torch_ddp_{mb}" for mb in TORCH_BUCKETS_MB]
        + ["torch_ddp_25_gav", "local_again"]
    )


@dataclass(frozen=True)
class Config:
    size: str = "gpt1_5b"
    batch: int = 4
    seq: int = 256
    precision: str = "bf16"  # bf16 autocast, or fp32
    warmup: int = 3
    iters: int = 10
    lr: float = 1e-4
    weight_decay: float = 0.1
    seed: int = 0


VARIANT_SUFFIXES = ("_gav", "_cur", "_side")  # torch DDP gradient_as_bucket_view; ours on the current / a side stream


def bucket_mb(variant: str) -> float | None:
    for suffix in VARIANT_SUFFIXES:
        variant = variant.removesuffix(suffix)
    tail = variant.rsplit("_", 1)[-1]
    return None if tail == "none" else float(tail)


# --- rank side ---------------------------------------------------------------------------


def build_variant(variant: str, model, device):
    """(module to call, on_train_batch_start, finish, cleanup) for one variant."""
    from impl.ddp import BucketedDDP, FlatDDP, NaiveDDP, OverlappedIndividualDDP

    noop = lambda: None  # noqa: E731
    if variant.startswith("local"):
        return model, noop, noop, noop
    if variant.startswith("torch_ddp"):
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=bucket_mb(variant),
            gradient_as_bucket_view=variant.endswith("_gav"),
        )
        return ddp, noop, noop, noop
    if variant == "naive":
        wrapper = NaiveDDP(model)
    elif variant == "flat":
        wrapper = FlatDDP(model)
    elif variant == "individual":
        wrapper = OverlappedIndividualDDP(model)
    elif variant.startswith("bucketed_"):
        wrapper = BucketedDDP(model, bucket_size_mb=bucket_mb(variant), side_stream=variant.endswith("_side"))
    else:
        raise ValueError(f"unknown variant {variant!r}")
    cleanup = getattr(wrapper, "remove_hooks", noop)
    return wrapper, wrapper.on_train_batch_start, wrapper.finish_gradient_synchronization, cleanup


def _autocast(cfg: Config, device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")


def _batches(cfg: Config, model, rank: int, device, n: int = 2):
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    return [tuple(t.to(device) for t in random_batch(model.cfg, cfg.batch, cfg.seq, generator=g)) for _ in range(n)]


def _loss(module, batch, cfg, device):
    x, y = batch
    with _autocast(cfg, device):
        logits = module(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def _replicas_identical(model) -> bool:
    """Do all ranks hold the same parameters?  (A checksum per parameter, gathered.)"""
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, sums)
    return all(torch.equal(g, gathered[0]) for g in gathered)


class HostClock:
    """Wall time the host spends inside a function (the wrappers' launch and finish)."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        return timed


def profile_step(step, device, path: Path | None, rows: int = 30) -> None:
    """One step under torch.profiler: the top operators by device and by host time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        synchronize(device)
    if path is None:
        return
    by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    averages = prof.key_averages()
    path.write_text(
        f"# one profiled step ({by})\n" + averages.table(sort_by=by, row_limit=rows)
        + "\n# by self host time\n" + averages.table(sort_by="self_cpu_time_total", row_limit=rows)
    )


def measure_variant(ctx, variant: str, cfg: Config, profile_dir: str | None = None) -> dict:
    # What a failed variant before this one left behind (presumably its model, held by a
    # traceback's frames until the cycle collector runs) must not make this one run out of
    # memory: on two H100s every variant after the first out-of-memory one failed too.
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    torch.manual_seed(cfg.seed)
    model = make_gpt(cfg.size, device=ctx.device)
    module, start, finish, cleanup = build_variant(variant, model, ctx.device)
    launch_clock, finish_clock = HostClock(), HostClock()
    if hasattr(module, "_launch"):  # ours: time the host side of every collective launch
        module._launch = launch_clock.wrap(module._launch)
    finish = finish_clock.wrap(finish)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    batches = _batches(cfg, model, ctx.rank, ctx.device)
    counter = iter(range(10**9))

    def step():
        optimizer.zero_grad(set_to_none=True)
        start()
        _loss(module, batches[next(counter) % len(batches)], cfg, ctx.device).backward()
        finish()
        optimizer.step()

    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    times = time_calls(step, ctx.device, cfg.warmup, cfg.iters)
    peak = torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else None
    steps_run = cfg.warmup + cfg.iters
    host = {"launch_host_ms": launch_clock.seconds * 1e3 / steps_run, "launches": launch_clock.calls / steps_run,
            "finish_host_ms": finish_clock.seconds * 1e3 / steps_run}
    if profile_dir is not None:  # every rank steps (the collectives must match); rank 0 writes
        profile_step(step, ctx.device, Path(profile_dir) / f"profile_{variant}.txt" if ctx.rank == 0 else None)
    identical = None if variant.startswith("local") else _replicas_identical(model)
    n_buckets = len(module.buckets) if hasattr(module, "buckets") else None
    cleanup()
    del module, model, optimizer, batches
    free_memory(ctx.device)
    return {"times_ms": [t * 1e3 for t in times], "peak_bytes": peak, "replicas_identical": identical, "buckets": n_buckets, **host}


def gradient_timeline(ctx, cfg: Config) -> dict:
    """One local step with the moment each parameter's gradient became final (ms after
    backward started), plus forward, backward and optimizer times."""
    torch.manual_seed(cfg.seed)
    model = make_gpt(cfg.size, device=ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    batches = _batches(cfg, model, ctx.rank, ctx.device)
    for i in range(max(1, cfg.warmup)):
        optimizer.zero_grad(set_to_none=True)
        _loss(model, batches[i % 2], cfg, ctx.device).backward()
        optimizer.step()
    cuda = ctx.device.type == "cuda"

    def mark():
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def since(a, b) -> float:
        return a.elapsed_time(b) if cuda else (b - a) * 1e3

    names = {id(p): n for n, p in model.named_parameters()}
    ready: list = []
    handles = [p.register_post_accumulate_grad_hook(lambda p: ready.append((names[id(p)], mark()))) for p in model.parameters()]
    optimizer.zero_grad(set_to_none=True)
    synchronize(ctx.device)
    t0 = mark()
    loss = _loss(model, batches[0], cfg, ctx.device)
    t1 = mark()
    loss.backward()
    t2 = mark()
    optimizer.step()
    t3 = mark()
    synchronize(ctx.device)
    for h in handles:
        h.remove()
    order = [(n, p.numel() * p.element_size()) for n, p in model.named_parameters()]
    result = {
        "forward_ms": since(t0, t1),
        "backward_ms": since(t1, t2),
        "optimizer_ms": since(t2, t3),
        "ready": [(n, since(t1, e)) for n, e in ready],
        "registration": order,
        "parameters": count_parameters(model),
    }
    del model, optimizer, batches, loss
    free_memory(ctx.device)
    return result


# --- the overhead model (parent side) ----------------------------------------------------


def bucket_timeline(timeline: dict, cap_bytes: float | None) -> list[tuple[int, float]]:
    """(bytes, ready seconds after backward start) per bucket, in launch order."""
    from impl.ddp import plan_buckets

    ready = dict((n, ms / 1e3) for n, ms in timeline["ready"])
    order = [(n, b) for n, b in timeline["registration"] if n in ready][::-1]  # reverse registration
    layout = plan_buckets([b for _, b in order], [0] * len(order), cap_bytes)
    return [(sum(order[i][1] for i in idx), max(ready[order[i][0]] for i in idx)) for idx in layout]


def exposed_seconds(buckets: list[tuple[int, float]], alpha: float, beta: float, backward_s: float) -> float:
    """Communication left after backward ends, buckets run one after another."""
    end = 0.0
    for nbytes, ready in buckets:
        end = max(ready, end) + alpha + nbytes / beta
    return max(0.0, end - backward_s)


def predict(variant: str, timeline: dict, alpha: float, beta: float) -> float | None:
    """Exposed communication (s) of a variant under the model; None where it says nothing."""
    backward_s = timeline["backward_ms"] / 1e3
    sizes = [b for n, b in timeline["registration"] if n in dict(timeline["ready"])]
    if variant == "naive":
        return sum(alpha + b / beta for b in sizes)
    if variant == "flat":
        return alpha + sum(sizes) / beta
    if variant == "individual":
        return exposed_seconds(bucket_timeline(timeline, 0), alpha, beta, backward_s)
    if variant.startswith(("bucketed_", "torch_ddp_")):
        mb = bucket_mb(variant)
        return exposed_seconds(bucket_timeline(timeline, None if mb is None else mb * MIB), alpha, beta, backward_s)
    return None


def optimal_bucket_mb(timeline: dict, alpha: float, beta: float, launch_s: float = 0.0) -> tuple[float, float]:
    """(bucket MiB, cost s) minimising exposed communication + buckets x launch_s over 1..1000 MiB.

    ``launch_s`` is the host time one bucket's launch takes (copy, hook, collective call):
    when the step is bound by the host, every launch lengthens it by that much."""
    backward_s = timeline["backward_ms"] / 1e3

    def cost(mb: float) -> float:
        buckets = bucket_timeline(timeline, mb * MIB)
        return exposed_seconds(buckets, alpha, beta, backward_s) + len(buckets) * launch_s

    grid = [10 ** (k / 20) for k in range(0, 61)]  # 1 .. 1000 MiB, 20 points a decade
    best = min(grid, key=lambda mb: (cost(mb), mb))
    return best, cost(best)


# --- parent side -------------------------------------------------------------------------


def summarise(variant: str, per_rank: list[dict]) -> dict:
    # a step is as slow as its slowest rank: take the per-step maximum over ranks
    steps = [max(ts) for ts in zip(*(r["times_ms"] for r in per_rank))]
    peaks = [r["peak_bytes"] for r in per_rank if r["peak_bytes"] is not None]
    return {
        "variant": variant,
        "bucket_mb": bucket_mb(variant) if variant.startswith(("bucketed_", "torch_ddp_")) else None,
        "median_ms": statistics.median(steps),
        "mean_ms": statistics.fmean(steps),
        "std_ms": statistics.stdev(steps) if len(steps) > 1 else 0.0,
        "min_ms": min(steps),
        "peak_gib": max(peaks) / 2**30 if peaks else None,
        "buckets": per_rank[0]["buckets"],
        "replicas_identical": per_rank[0]["replicas_identical"],
        "launch_host_ms": max(r["launch_host_ms"] for r in per_rank) if per_rank[0]["launches"] else None,
        "finish_host_ms": max(r["finish_host_ms"] for r in per_rank),
        "status": "ok",
    }


def run_variants(opts, cfg: Config, device: str, world: int, out: Path, info: dict) -> dict:
    deadline = Deadline(opts.time_budget_s)
    payload = {"info": info, "config": asdict(cfg), "rows": [], "model": None}
    probe_sizes = sizes_up_to(opts.probe_max_mib)
    try:
        t0 = time.perf_counter()
        timeline = run_on_ranks(gradient_timeline, world, cfg, device=device, timeout=opts.timeout)[0]
        probe = run_on_ranks(allreduce_sweep, world, probe_sizes, 2, 3, 20.0, device=device, timeout=opts.timeout)
        rows = [{"bytes": b, "time_ms": max(r[i]["seconds"] for r in probe) * 1e3, "status": "ok"} for i, b in enumerate(probe_sizes)]
        alpha, beta = fit_alpha_beta(rows) or (0.0, float("inf"))
        payload["model"] = {"timeline": timeline, "probe": rows, "alpha_s": alpha, "beta_bytes_per_s": beta}
        print(f"timeline and all-reduce probe: {time.perf_counter() - t0:.1f} s; backward {timeline['backward_ms']:.1f} ms, "
              f"alpha {alpha * 1e6:.1f} us, beta {beta / 1e9:.1f} GB/s", flush=True)
    except Exception as exc:  # noqa: BLE001 - the variants can still be measured
        payload["model"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    for variant in opts.variants:
        if deadline.expired:
            payload["rows"].append({"variant": variant, "status": "skipped: time budget spent"})
            continue
        t0 = time.perf_counter()
        try:
            profile_dir = str(out) if variant in opts.profile else None
            per_rank = run_on_ranks(measure_variant, world, variant, cfg, profile_dir, device=device, timeout=opts.timeout)
            row = summarise(variant, per_rank)
        except Exception as exc:  # noqa: BLE001 - one broken variant must not lose the others
            row = {"variant": variant, "status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        payload["rows"].append(row)
        print(f"{variant:18s} {row.get('median_ms', float('nan')):9.2f} ms  ({time.perf_counter() - t0:.1f} s)  {row['status']}", flush=True)
        finish_payload(payload)
        write_outputs(out, payload)
    return payload


def finish_payload(payload: dict) -> None:
    """Ratios to local, the model's predictions, the predicted optimum, the goals."""
    rows = payload["rows"]
    local = [r["median_ms"] for r in rows if r["variant"] in ("local", "local_again") and r["status"] == "ok"]
    local_ms = statistics.fmean(local) if local else None
    model = payload.get("model") or {}
    timeline = model.get("timeline")
    alpha, beta = model.get("alpha_s"), model.get("beta_bytes_per_s")
    for r in rows:
        if r["status"] != "ok":
            continue
        r["vs_local"] = r["median_ms"] / local_ms if local_ms else None
        exposed = predict(r["variant"], timeline, alpha, beta) if timeline and beta else None
        r["model_exposed_ms"] = None if exposed is None else exposed * 1e3
    # h: host time per bucket launch, measured (launch_host_ms over the buckets) where the run has it
    per_launch = [r["launch_host_ms"] / r["buckets"] for r in rows
                  if r["status"] == "ok" and r["variant"].startswith("bucketed_") and r.get("launch_host_ms") and r.get("buckets")]
    h_ms = statistics.median(per_launch) if per_launch else 0.0

    def launches_ms(r) -> float:
        return h_ms * (r.get("buckets") or 0) if r["variant"].startswith("bucketed_") else 0.0

    fitted = [r["median_ms"] - local_ms - r["model_exposed_ms"] - launches_ms(r) for r in rows
              if r["status"] == "ok" and r["variant"].startswith("bucketed_") and r.get("model_exposed_ms") is not None and local_ms]
    c_ms = statistics.median(fitted) if fitted else None
    for r in rows:
        if r["status"] == "ok" and r.get("model_exposed_ms") is not None and c_ms is not None:
            extra = c_ms + launches_ms(r) if r["variant"].startswith(("bucketed_", "individual")) else 0.0
            r["model_ms"] = local_ms + r["model_exposed_ms"] + extra
    summary = {"local_ms": local_ms, "c_ms": c_ms, "launch_host_ms_per_bucket": h_ms}
    if timeline and beta:
        best_mb, best_exposed = optimal_bucket_mb(timeline, alpha, beta)
        summary.update(predicted_best_bucket_mb=best_mb, predicted_best_exposed_ms=best_exposed * 1e3)
        if h_ms:
            best_mb, best_cost = optimal_bucket_mb(timeline, alpha, beta, h_ms / 1e3)
            summary.update(predicted_best_bucket_mb_with_launch_cost=best_mb, predicted_best_cost_ms=best_cost * 1e3)
    ours = [r for r in rows if r["status"] == "ok" and r["variant"].startswith("bucketed_")]
    theirs = [r for r in rows if r["status"] == "ok" and r["variant"].startswith("torch_ddp_")]
    if ours:
        best = min(ours, key=lambda r: r["median_ms"])
        summary.update(ours_best=best["variant"], ours_best_ms=best["median_ms"], ours_best_vs_local=best.get("vs_local"))
        if best.get("vs_local") is not None:
            summary["goal_ours_within_1_05_of_local"] = best["vs_local"] <= STEP_GOAL
    if theirs:
        best_t = min(theirs, key=lambda r: r["median_ms"])
        summary.update(torch_best=best_t["variant"], torch_best_ms=best_t["median_ms"], torch_best_vs_local=best_t.get("vs_local"))
        if ours:
            summary["goal_ours_faster_than_torch_best"] = summary["ours_best_ms"] < best_t["median_ms"]
    payload["summary"] = summary


TABLE = ("variant", "median_ms", "vs_local", "mean_ms", "std_ms", "min_ms", "peak_gib", "buckets", "replicas_identical",
         "launch_host_ms", "finish_host_ms", "model_exposed_ms", "model_ms", "status")


def markdown(payload: dict) -> list[tuple[str, str]]:
    info, cfg, summary = payload["info"], payload["config"], payload.get("summary", {})
    sections = [
        ("Machine and configuration", "\n".join(f"- {k}: {v}" for k, v in {**info, **cfg}.items())),
        ("Step time per variant (median over timed steps; a step is its slowest rank)", tables.markdown_table(payload["rows"], TABLE)),
    ]
    model = payload.get("model") or {}
    if "timeline" in model:
        tl = model["timeline"]
        lines = [
            f"- local step parts (one instrumented step): forward {tl['forward_ms']:.2f} ms, backward {tl['backward_ms']:.2f} ms, "
            f"optimizer {tl['optimizer_ms']:.2f} ms; {tl['parameters'] / 1e6:.1f} M parameters",
            f"- all-reduce at this world size: alpha = {model['alpha_s'] * 1e6:.1f} us, beta = {model['beta_bytes_per_s'] / 1e9:.1f} GB/s (payload bytes)",
            f"- h (host time of one bucket launch, measured) = {summary.get('launch_host_ms_per_bucket', 0.0):.3f} ms",
            f"- c (median residual of the bucketed steps: compute slowed by NCCL, the rest) = {summary.get('c_ms')}",
            f"- predicted optimal bucket size, communication alone: {summary.get('predicted_best_bucket_mb', float('nan')):.1f} MiB "
            f"(exposed communication {summary.get('predicted_best_exposed_ms', float('nan')):.2f} ms)",
        ]
        if summary.get("predicted_best_bucket_mb_with_launch_cost") is not None:
            lines.append(f"- predicted optimal bucket size with the launch cost h: {summary['predicted_best_bucket_mb_with_launch_cost']:.1f} MiB "
                         f"(exposed + launches {summary['predicted_best_cost_ms']:.2f} ms)")
        sections.append(("Overhead model: t = t_local + exposed(buckets) + n_buckets x h + c", "\n".join(lines)))
    elif "error" in model:
        sections.append(("Overhead model", f"not fitted: {model['error']}"))
    goals = [f"- {k}: {v}" for k, v in summary.items()]
    sections.append(("Summary and goals (ours at its best <= 1.05 x local; faster than torch DDP at its best)", "\n".join(goals)))
    return sections


def plot(payload: dict, path: Path) -> Path | None:
    try:
        from perf.lib.plots import plt, save_figure
    except ImportError:  # matplotlib is the optional [plots] extra
        return None
    rows = [r for r in payload["rows"] if r["status"] == "ok"]
    summary = payload.get("summary", {})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for prefix, label, marker in (("bucketed_", "impl BucketedDDP", "o"), ("torch_ddp_", "torch DDP", "s")):
        pts = [(r["bucket_mb"] or 1000.0, r["median_ms"]) for r in rows if r["variant"].startswith(prefix) and not r["variant"].endswith("_gav")]
        if pts:
            pts.sort()
            ax.plot(*zip(*pts), marker=marker, label=label)
    model_pts = sorted((r["bucket_mb"] or 1000.0, r["model_ms"]) for r in rows if r["variant"].startswith("bucketed_") and r.get("model_ms"))
    if model_pts:
        ax.plot(*zip(*model_pts), linestyle="--", color="gray", label="model (bucketed)")
    if summary.get("local_ms"):
        ax.axhline(summary["local_ms"], color="k", linewidth=1, label="local")
        ax.axhline(summary["local_ms"] * STEP_GOAL, color="k", linewidth=1, linestyle=":", label="1.05 x local")
    for name in ("naive", "flat", "individual"):
        match = [r for r in rows if r["variant"] == name]
        if match:
            ax.axhline(match[0]["median_ms"], linewidth=0.8, linestyle="-.", color="C3" if name == "naive" else "C4" if name == "flat" else "C5", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("bucket size (MiB; 'none' plotted at 1000)")
    ax.set_ylabel("step time (ms, median)")
    ax.set_title(f"{payload['config']['size']}: data-parallel step vs bucket size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def write_outputs(out: Path, payload: dict) -> None:
    tables.write_json(out / "ddp.json", payload)
    tables.write_csv(out / "ddp.csv", payload["rows"], TABLE)
    tables.write_markdown(out / "ddp.md", markdown(payload), title="Data-parallel step time")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="perf-out")
    p.add_argument("--tiny", action="store_true", help="CPU, gloo, 2 ranks, tiny GPT, float32: a smoke run for CI")
    p.add_argument("--variants", nargs="*", default=None, help="subset of the variants (default: all)")
    p.add_argument("--size", default=None, help="impl.models.gpt size (default gpt1_5b; tiny with --tiny)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--probe-max-mib", type=int, default=None, help="largest all-reduce of the alpha/beta probe")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per variant before it is reported stuck")
    p.add_argument("--time-budget-s", type=float, default=300.0, help="variants not started by then are skipped")
    p.add_argument("--profile", nargs="*", default=[], help="variants to profile for one extra step (rank 0): profile_<variant>.txt")
    opts = p.parse_args(argv)
    opts.variants = opts.variants or default_variants()
    return opts


def main(argv=None) -> int:
    opts = parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    if opts.tiny:
        device = "cpu"
        base = Config(size="tiny", batch=2, seq=32, precision="fp32", warmup=1, iters=2)
        opts.probe_max_mib = opts.probe_max_mib or 4
    else:
        device = "cuda"
        if not torch.cuda.is_available() or torch.cuda.device_count() < opts.world_size:
            print(f"perf.bench.ddp: needs {opts.world_size} GPUs (use --tiny on the CPU)", file=sys.stderr)
            return 2
        base = Config()
        opts.probe_max_mib = opts.probe_max_mib or 256
    cfg = Config(**{**asdict(base), **{k: v for k, v in dict(size=opts.size, batch=opts.batch, seq=opts.seq, warmup=opts.warmup, iters=opts.iters).items() if v is not None}})
    info = device_description("cuda:0" if device == "cuda" else "cpu")
    info.update(world_size=opts.world_size, backend="nccl" if device == "cuda" else "gloo")
    start = time.perf_counter()
    try:
        payload = run_variants(opts, cfg, device, opts.world_size, out, info)
    finally:
        shutdown_pools()
    payload["info"]["wall_s"] = round(time.perf_counter() - start, 1)
    finish_payload(payload)
    write_outputs(out, payload)
    png = plot(payload, out / "ddp.png")
    print((out / "ddp.md").read_text())
    print(f"wrote {out}/ddp.{{md,csv,json}}" + (f" and {png.name}" if png else " (no matplotlib: no plot)"))
    return 1 if any(r["status"].startswith("error") for r in payload["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
