"""What one bucket launch costs, ours against torch DDP, on one process.

    python perf/scripts/ddp_bucket_launch.py --out DIR                 # CUDA (NCCL) when there is a GPU
    python perf/scripts/ddp_bucket_launch.py --out DIR --device cpu    # gloo

One rank (world size 1) is enough to see the cost of a launch: the collective is still
called, queued and waited on, only the wire is missing.  The model is a GPT whose step is
bound by the host (few tokens, many parameter tensors), so every microsecond a launch
costs the host shows up in the step.

Two measurements, on a fresh model per variant, variants interleaved over ``--rounds``:

Sweep
    The step (zero_grad(set_to_none=True), forward, cross entropy, backward, finish) for
    local, ours and torch DDP at bucket caps from one bucket to one bucket per parameter.
    Each wrapper's step is fitted as  t = t_local + a + n_buckets x h  (least squares):
    h is the cost of one bucket launch, a what the wrapper costs per step beyond its
    launches (hooks per parameter, finish).  Both the host time to the end of backward +
    finish (``host_ms``) and the wall time with the device synchronised (``step_ms``).

Profile
    One step each of ours and torch DDP at one bucket per parameter under torch.profiler:
    the operators by self host time, per call (profile_<variant>.txt), so the difference
    per launch can be named.

Outputs: bucket_launch.json, bucket_launch.md, profile_*.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from impl.models.gpt import make_gpt, random_batch  # noqa: E402
from perf.lib.measure import device_description  # noqa: E402
from perf.lib.workloads import synchronize  # noqa: E402

CAPS_MB = (None, 50, 10, 2, 0.5, 0.1, 0.0)  # 0.0: one bucket per parameter


def init_one_rank(device: torch.device) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, **kwargs)


def parse_size(size: str):
    """A named GPT size, or d_model,d_ff,n_layers,n_heads[,vocab] for a custom one."""
    if "," not in size:
        return size
    from impl.models.gpt import GPTConfig

    numbers = [int(v) for v in size.split(",")]
    return GPTConfig(*numbers[:4], **({"vocab_size": numbers[4]} if len(numbers) > 4 else {}))


def build(variant: str, cap_mb, size: str, device):
    """(module, finish, n_buckets, model) on a fresh model."""
    from impl.ddp import BucketedDDP
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = make_gpt(parse_size(size), device=device)
    if variant == "local":
        return model, (lambda: None), 0, model
    one_each = 1e-9  # MiB: a cap below every parameter gives one bucket each (0 is refused)
    if variant in ("ours", "ours_cur"):  # _cur: no side stream
        wrapper = BucketedDDP(model, bucket_size_mb=cap_mb or one_each if cap_mb is not None else None,
                              side_stream=variant == "ours")
        return wrapper, wrapper.finish_gradient_synchronization, len(wrapper.buckets), model
    if variant == "torch":
        ddp = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=(cap_mb or one_each) if cap_mb is not None else 1e6,
        )
        return ddp, (lambda: None), None, model
    raise ValueError(variant)


def torch_bucket_count(ddp) -> int | None:
    """Buckets torch DDP used (after its first step: the layout is rebuilt then)."""
    data = ddp._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes" if data.get("has_rebuilt_buckets") else "bucket_sizes")
    if isinstance(sizes, int):
        return 1
    if isinstance(sizes, str):
        return len([s for s in sizes.split(",") if s.strip()])
    return None


def step_fn(module, finish, model, batch, device):
    x, y = batch

    def step():
        model.zero_grad(set_to_none=True)
        on_start = getattr(module, "on_train_batch_start", None)
        if on_start is not None:
            on_start()
        logits = module(x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        finish()

    return step


def time_steps(step, device, n: int) -> tuple[list[float], list[float]]:
    """(host ms, step ms) of n steps, each between synchronisations."""
    host, wall = [], []
    for _ in range(n):
        synchronize(device)
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        synchronize(device)
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return host, wall


class LaunchClock:
    """Wall time the host spends in a wrapper's ``_launch`` (instance attribute, so the
    class and every other variant stay untouched)."""

    def __init__(self, wrapper):
        self.seconds, self.calls = 0.0, 0
        inner = wrapper._launch

        def timed(unit):
            t0 = time.perf_counter()
            try:
                return inner(unit)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        wrapper._launch = timed

    @property
    def us_per_launch(self) -> float | None:
        return self.seconds / self.calls * 1e6 if self.calls else None


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x; (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def profile_table(step, device, path: Path, rows: int = 25) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        synchronize(device)
    path.write_text("# one profiled step, operators by self host time\n"
                    + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def peak_memory(variant: str, cap_mb, size: str, device, batch: int, seq: int) -> dict:
    """Peak allocated GiB of one training step (bf16 autocast, AdamW), after a warm-up step:
    to the end of backward + finish, and over the whole step."""
    module, finish, _, model = build(variant, cap_mb, size, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x, y = (t.to(device) for t in random_batch(model.cfg, batch, seq, generator=torch.Generator().manual_seed(1)))
    gib = 1 << 30
    out = {}
    for i in range(2):
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.reset_peak_memory_stats(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = module(x)
        F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
        finish()
        torch.cuda.synchronize(device)
        out["backward_gib"] = torch.cuda.max_memory_allocated(device) / gib
        optimizer.step()
        torch.cuda.synchronize(device)
        out["step_gib"] = torch.cuda.max_memory_allocated(device) / gib
    cleanup = getattr(module, "remove_hooks", None)
    if cleanup:
        cleanup()
    del module, model, optimizer
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="small")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--wrappers", nargs="*", default=["ours", "torch"], choices=["ours", "ours_cur", "torch"])
    parser.add_argument("--memory", default=None, help="GPT size for a peak-memory table (CUDA): local, ours, ours_cur, torch")
    parser.add_argument("--memory-caps", type=float, nargs="*", default=[25.0, 250.0])
    parser.add_argument("--caps", type=float, nargs="*", default=None, help="bucket caps in MiB (0: one per parameter)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    args.out.mkdir(parents=True, exist_ok=True)
    init_one_rank(device)
    caps = CAPS_MB if args.caps is None else tuple(args.caps)
    if args.memory:
        rows = [{"variant": "local", "cap_mb": None, **peak_memory("local", None, args.memory, device, 4, 256)}]
        for cap in args.memory_caps:
            for w in ("ours", "ours_cur", "torch"):
                rows.append({"variant": w, "cap_mb": cap, **peak_memory(w, cap, args.memory, device, 4, 256)})
        lines = [f"# Peak memory of one step, GPT {args.memory}, batch 4 x 256, bf16 autocast, AdamW, world size 1", "",
                 "| variant | cap MiB | to end of backward GiB | whole step GiB |", "|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['cap_mb'] or ''} | {r['backward_gib']:.2f} | {r['step_gib']:.2f} |" for r in rows]
        (args.out / "peak_memory.md").write_text("\n".join(lines) + "\n")
        (args.out / "peak_memory.json").write_text(json.dumps(rows, indent=1))
        print("\n".join(lines))
        dist.destroy_process_group()
        return 0

    variants = [("local", None)] + [(w, c) for w in args.wrappers for c in caps]
    built = {}
    for v in variants:
        module, finish, n_buckets, model = build(v[0], v[1], args.size, device)
        g = torch.Generator().manual_seed(1)
        batch = tuple(t.to(device) for t in random_batch(model.cfg, args.batch, args.seq, generator=g))
        step = step_fn(module, finish, model, batch, device)
        for _ in range(args.warmup):
            step()
        if v[0] == "torch":
            n_buckets = torch_bucket_count(module)
        clock = None
        if hasattr(module, "_launch"):  # ours: the host time inside each bucket launch
            clock = LaunchClock(module)
        built[v] = {"step": step, "buckets": n_buckets, "module": module, "host": [], "wall": [], "clock": clock}
    synchronize(device)

    for r in range(args.rounds):  # interleaved: drift of the machine falls on every variant alike
        for v in variants:
            host, wall = time_steps(built[v]["step"], device, args.steps)
            built[v]["host"].append(statistics.median(host))
            built[v]["wall"].append(statistics.median(wall))

    rows = []
    for v in variants:
        b = built[v]
        rows.append({"variant": v[0], "cap_mb": v[1], "buckets": b["buckets"],
                     "launch_host_us": b["clock"].us_per_launch if b["clock"] else None,
                     "host_ms": statistics.median(b["host"]), "step_ms": statistics.median(b["wall"]),
                     "host_rounds": b["host"], "step_rounds": b["wall"]})
    local = rows[0]
    fits = {}
    for w in args.wrappers:
        pts = [r for r in rows if r["variant"] == w and r["buckets"]]
        for key in ("host_ms", "step_ms"):
            a, h = fit_line([r["buckets"] for r in pts], [r[key] - local[key] for r in pts])
            fits[f"{w}_{key}"] = {"per_step_ms": a, "per_bucket_us": h * 1e3}

    n_params = sum(1 for p in built[variants[0]]["module"].parameters() if p.requires_grad)
    for w in args.wrappers:  # profiles at one bucket per parameter (or the smallest cap)
        v = (w, min(caps, key=lambda c: float("inf") if c is None else c))
        profile_table(built[v]["step"], device, args.out / f"profile_{w}.txt")

    meta = {"device": device_description(device), "torch": torch.__version__,
            "command": "python perf/scripts/ddp_bucket_launch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "size": args.size, "batch": args.batch, "seq": args.seq, "parameter_tensors": n_params,
            "rounds": args.rounds, "steps": args.steps}
    (args.out / "bucket_launch.json").write_text(json.dumps({"meta": meta, "rows": rows, "fits": fits}, indent=1))
    lines = [f"# One bucket launch, ours vs torch DDP ({meta['device']}, torch {meta['torch']})", "",
             f"`{meta['command']}`; GPT {args.size}, {n_params} parameter tensors, batch {args.batch} x {args.seq}, "
             f"world size 1; medians of {args.rounds} interleaved rounds of {args.steps} steps.", "",
             "| variant | cap MiB | buckets | host ms | step ms | host us per launch |", "|---|---|---|---|---|---|"]
    for r in rows:
        cap = "" if r["variant"] == "local" else ("one" if r["cap_mb"] is None else f"{r['cap_mb']:g}")
        lines.append(f"| {r['variant']} | {cap} | {r['buckets'] if r['buckets'] is not None else '?'} "
                     f"| {r['host_ms']:.2f} | {r['step_ms']:.2f} | "
                     f"{'' if r['launch_host_us'] is None else format(r['launch_host_us'], '.1f')} |")
    lines += ["", "Fit t - t_local = a + n_buckets x h:", "", "| wrapper | measure | a (ms / step) | h (us / bucket) |",
              "|---|---|---|---|"]
    for k, f in fits.items():
        w, m = k.rsplit("_", 2)[0], "_".join(k.rsplit("_", 2)[1:])
        lines.append(f"| {w} | {m} | {f['per_step_ms']:.3f} | {f['per_bucket_us']:.1f} |")
    (args.out / "bucket_launch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
