"""All-reduce benchmark: time and bus bandwidth of a float32 sum all-reduce by size.

    python -m perf.bench.allreduce --out DIR            # gloo on CPU (2, 4, 6 ranks) + NCCL on all GPUs
    python -m perf.bench.allreduce --tiny --out DIR     # gloo, 2 ranks, 1 and 4 MiB (seconds; CI)

Sizes are powers of two from 1 MiB to 1 GiB of float32 payload; gloo stops at
``--cpu-max-mib`` (default 256: gloo moves about 2 GB/s, so 1 GiB would cost ~10 s a
call per world size).  NCCL runs on every visible GPU (one rank per GPU, NCCL_NVLS_ENABLE=0)
when there are at least two.

Timing, per size: ``--warmup`` untimed calls, then back-to-back calls until at least
``--min-iters`` calls and ``--min-time-ms`` have passed, each rank timing its own loop
(synchronising its device at both ends); the time of one call is the slowest rank's
average (a collective finishes when its last rank does).

    algbw = bytes / t              busbw = 2 (n - 1) / n * bytes / t

busbw (NCCL-tests' convention) is what a ring all-reduce moves per link: comparable
across world sizes, and at most the link bandwidth.

Outputs in ``--out``: allreduce.md, allreduce.csv, allreduce.json, allreduce.png (when
matplotlib is installed).  Ranks run through ``conformance.harness.run_on_ranks``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the shared GPUs

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from conformance.harness import run_on_ranks, shutdown_pools  # noqa: E402
from perf.lib import tables  # noqa: E402
from perf.lib.measure import device_description  # noqa: E402
from perf.lib.workloads import synchronize  # noqa: E402

MIB = 1 << 20
COLUMNS = ("backend", "world_size", "size_mib", "bytes", "iters", "time_ms", "algbw_gbps", "busbw_gbps", "status")


def bus_factor(world_size: int) -> float:
    return 2 * (world_size - 1) / world_size


# --- rank side ---------------------------------------------------------------------------


def allreduce_sweep(ctx, sizes_bytes: list[int], warmup: int, min_iters: int, min_time_ms: float) -> list[dict]:
    """Per size: this rank's average seconds per all-reduce over a back-to-back loop.

    Every rank must issue the same calls, so the loop length is decided once: one timed
    call estimates the cost, and rank 0's count is broadcast to all."""
    out = []
    for nbytes in sizes_bytes:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
        for _ in range(warmup):
            dist.all_reduce(t)
        synchronize(ctx.device)
        start = time.perf_counter()
        dist.all_reduce(t)
        synchronize(ctx.device)
        estimate = max(time.perf_counter() - start, 1e-6)
        iters = torch.tensor([max(min_iters, int(min_time_ms / 1e3 / estimate) + 1)], dtype=torch.int64, device=ctx.device)
        dist.broadcast(iters, src=0)
        iters = int(iters.item())
        dist.barrier()
        synchronize(ctx.device)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        synchronize(ctx.device)
        out.append({"bytes": nbytes, "iters": iters, "seconds": (time.perf_counter() - start) / iters})
        del t
    return out


# --- parent side -------------------------------------------------------------------------


def sweep(backend_device: str, world_size: int, sizes_bytes, opts) -> list[dict]:
    try:
        per_rank = run_on_ranks(
            allreduce_sweep, world_size, list(sizes_bytes), opts.warmup, opts.min_iters, opts.min_time_ms,
            device=backend_device, timeout=opts.timeout,
        )
    except Exception as exc:  # noqa: BLE001 - a failed sweep is a row, not a crash
        status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return [dict(backend="nccl" if backend_device == "cuda" else "gloo", world_size=world_size, size_mib=b / MIB, bytes=b, status=status) for b in sizes_bytes]
    rows = []
    for i, nbytes in enumerate(sizes_bytes):
        seconds = max(r[i]["seconds"] for r in per_rank)
        rows.append(dict(
            backend="nccl" if backend_device == "cuda" else "gloo",
            world_size=world_size,
            size_mib=nbytes / MIB,
            bytes=nbytes,
            iters=min(r[i]["iters"] for r in per_rank),
            time_ms=seconds * 1e3,
            algbw_gbps=nbytes / seconds / 1e9,
            busbw_gbps=bus_factor(world_size) * nbytes / seconds / 1e9,
            status="ok",
        ))
    return rows


def sizes_up_to(max_mib: int, min_mib: int = 1) -> list[int]:
    sizes, mib = [], min_mib
    while mib <= max_mib:
        sizes.append(mib * MIB)
        mib *= 2
    return sizes


def fit_alpha_beta(rows: list[dict]) -> tuple[float, float] | None:
    """Least squares t = alpha + bytes / beta over the ok rows: (alpha seconds, beta bytes/s).

    alpha is clipped at 0; a non-positive slope (timing noise larger than the size
    effect, e.g. on a loaded CPU) falls back to the largest transfer's bandwidth."""
    pts = [(r["bytes"], r["time_ms"] / 1e3) for r in rows if r.get("status") == "ok"]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    if slope <= 0:  # noise swamped the size dependence: bandwidth of the largest transfer
        x_max, y_max = max(pts)
        beta = x_max / y_max
        return max(0.0, sum(y - x / beta for x, y in pts) / n), beta
    return max(my - slope * mx, 0.0), 1.0 / slope


def plot(rows: list[dict], path: Path) -> Path | None:
    try:
        from perf.lib.plots import plt, save_figure
    except ImportError:  # matplotlib is the optional [plots] extra
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = {}
    for r in rows:
        if r.get("status") == "ok":
            series.setdefault(f"{r['backend']} x{r['world_size']}", []).append(r)
    for label, pts in series.items():
        pts.sort(key=lambda r: r["bytes"])
        xs = [r["size_mib"] for r in pts]
        axes[0].plot(xs, [r["time_ms"] for r in pts], marker="o", label=label)
        axes[1].plot(xs, [r["busbw_gbps"] for r in pts], marker="o", label=label)
    for ax, ylabel in zip(axes, ("time per all-reduce (ms)", "bus bandwidth (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("payload (MiB, float32)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    fig.suptitle("all-reduce (sum): time and bus bandwidth = 2(n-1)/n x bytes / t")
    return save_figure(fig, path)


def markdown(rows: list[dict], info: dict, fits: dict) -> list[tuple[str, str]]:
    sections = [("Machine", "\n".join(f"- {k}: {v}" for k, v in info.items()))]
    for backend in ("gloo", "nccl"):
        sub = [r for r in rows if r["backend"] == backend]
        if not sub:
            continue
        sections.append((f"{backend}: time per all-reduce (ms)", tables.pivot_markdown(sub, ["size_mib"], "world_size", "time_ms")))
        sections.append((f"{backend}: bus bandwidth (GB/s)", tables.pivot_markdown(sub, ["size_mib"], "world_size", "busbw_gbps")))
    if fits:
        lines = ["| backend | world size | alpha (us) | beta (GB/s of payload) |", "|---|---|---|---|"]
        for (backend, w), (alpha, beta) in fits.items():
            lines.append(f"| {backend} | {w} | {alpha * 1e6:.1f} | {beta / 1e9:.1f} |")
        sections.append(("Fitted t = alpha + bytes / beta", "\n".join(lines) + "\n"))
    return sections


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="perf-out", help="directory for the tables and the plot")
    p.add_argument("--tiny", action="store_true", help="gloo only, 2 ranks, 1 and 4 MiB: a smoke run for CI")
    p.add_argument("--cpu-worlds", type=int, nargs="*", default=[2, 4, 6], help="gloo world sizes (default 2 4 6)")
    p.add_argument("--cpu-max-mib", type=int, default=256, help="largest gloo payload in MiB (default 256)")
    p.add_argument("--gpu-worlds", type=int, nargs="*", default=None, help="NCCL world sizes (default 2, 4, 8 and all GPUs, as many as there are)")
    p.add_argument("--gpu-max-mib", type=int, default=1024, help="largest NCCL payload in MiB (default 1024)")
    p.add_argument("--no-gpu", action="store_true", help="skip the NCCL sweep")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--min-time-ms", type=float, default=100.0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per sweep before it is reported stuck")
    opts = p.parse_args(argv)
    if opts.tiny:
        opts.cpu_worlds, opts.cpu_max_mib, opts.no_gpu = [2], 4, True
        opts.warmup, opts.min_iters, opts.min_time_ms = 1, 2, 0.0
    return opts


def main(argv=None) -> int:
    opts = parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    info = device_description("cpu")
    info["cpu_count"] = os.cpu_count()
    rows: list[dict] = []
    fits: dict = {}
    start = time.perf_counter()
    try:
        for w in opts.cpu_worlds:
            rows += sweep("cpu", w, sizes_up_to(opts.cpu_max_mib), opts)
            print(f"gloo x{w}: done at {time.perf_counter() - start:.1f} s", flush=True)
        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not opts.no_gpu and n_gpus >= 2:
            info.update({f"gpu_{k}": v for k, v in device_description("cuda:0").items() if k != "device"})
            info["gpus"] = n_gpus
            worlds = opts.gpu_worlds or sorted({w for w in (2, 4, 8, n_gpus) if 2 <= w <= n_gpus})
            for w in worlds:
                rows += sweep("cuda", w, sizes_up_to(opts.gpu_max_mib), opts)
                print(f"nccl x{w}: done at {time.perf_counter() - start:.1f} s", flush=True)
        elif not opts.no_gpu:
            info["nccl"] = f"skipped: {n_gpus} GPU(s) visible, need 2"
    finally:
        shutdown_pools()
    for backend in ("gloo", "nccl"):
        for w in sorted({r["world_size"] for r in rows if r["backend"] == backend}):
            fit = fit_alpha_beta([r for r in rows if r["backend"] == backend and r["world_size"] == w])
            if fit:
                fits[(backend, w)] = fit
    info["wall_s"] = round(time.perf_counter() - start, 1)
    tables.write_csv(out / "allreduce.csv", rows, COLUMNS)
    tables.write_json(out / "allreduce.json", {"info": info, "rows": rows, "fits": [
        {"backend": b, "world_size": w, "alpha_s": a, "beta_bytes_per_s": be} for (b, w), (a, be) in fits.items()]})
    tables.write_markdown(out / "allreduce.md", markdown(rows, info, fits), title="All-reduce: time and bus bandwidth")
    png = plot(rows, out / "allreduce.png")
    print((out / "allreduce.md").read_text())
    print(f"wrote {out}/allreduce.{{md,csv,json}}" + (f" and {png.name}" if png else " (no matplotlib: no plot)"))
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
