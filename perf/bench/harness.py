"""Examples per second through the harness's live pool versus spawning ranks per example.

    python -m perf.bench.harness [--world-size 2] [--pooled 20] [--spawned 3] [--device cpu|cuda]

The case is a small data-parallel step: every rank builds the same tiny MLP from one
seed, runs forward and backward on its own batch, all-reduces and averages the
gradients, takes an SGD step and returns its parameters.  "pooled" runs it through
``run_on_ranks`` on a live pool (pool start-up timed separately); "spawned" starts fresh
processes for every example (spawn, FileStore rendezvous, ``init_process_group``, the
same case, teardown), what a test without the pool pays.  Both must return the same
parameters, bit for bit.  Runs on the CPU (gloo, the default) or on GPUs (NCCL, rank r on
cuda:r).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from conformance.harness import RankContext, run_on_ranks, shutdown_pools


def ddp_step(ctx: RankContext, seed: int, batch: int = 16):
    """One data-parallel SGD step of a 32-64-8 MLP; returns this rank's parameters."""
    torch.manual_seed(seed)  # same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(ctx.device)
    generator = torch.Generator().manual_seed(seed * 1000 + ctx.rank + 1)  # each rank its own batch
    x = torch.randn(batch, 32, generator=generator).to(ctx.device)
    y = torch.randn(batch, 8, generator=generator).to(ctx.device)
    torch.nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return [p.detach().cpu() for p in model.parameters()]


def _spawned_rank(rank, world_size, store_path, conn, seed, device_kind):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        device, backend = torch.device("cpu"), "gloo"
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    ctx = RankContext(rank=rank, world_size=world_size, device=device, backend=backend)
    conn.send(ddp_step(ctx, seed))
    dist.destroy_process_group()


def run_spawned(world_size: int, seed: int, device_kind: str) -> list:
    """One example with fresh processes: spawn, rendezvous, the case, teardown."""
    ctx = mp.get_context("spawn")
    tmpdir = tempfile.mkdtemp(prefix="bench-spawned-")
    procs, conns = [], []
    try:
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_spawned_rank, args=(rank, world_size, os.path.join(tmpdir, "store"), child_end, seed, device_kind), daemon=True)
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        results = [conn.recv() for conn in conns]
        for proc in procs:
            proc.join(timeout=60)
            if proc.exitcode != 0:
                raise RuntimeError(f"spawned rank exited with {proc.exitcode}")
        return results
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(tmpdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--pooled", type=int, default=20, help="examples through the live pool")
    parser.add_argument("--spawned", type=int, default=3, help="examples with processes spawned per example")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    opts = parser.parse_args()
    w, dev = opts.world_size, opts.device
    backend = "nccl" if dev == "cuda" else "gloo"

    start = time.perf_counter()
    run_on_ranks(ddp_step, w, 0, device=dev, timeout=120)  # starts the pool
    startup = time.perf_counter() - start

    start = time.perf_counter()
    pooled = [run_on_ranks(ddp_step, w, seed, device=dev, timeout=60) for seed in range(1, opts.pooled + 1)]
    pooled_s = (time.perf_counter() - start) / opts.pooled

    start = time.perf_counter()
    spawned = [run_spawned(w, seed, dev) for seed in range(1, opts.spawned + 1)]
    spawned_s = (time.perf_counter() - start) / opts.spawned
    shutdown_pools()

    for seed in range(opts.spawned):
        for a, b in zip(pooled[seed], spawned[seed]):
            for pa, pb in zip(a, b):
                assert torch.equal(pa, pb), "pooled and spawned ranks disagree"
        assert all(torch.equal(pa, pb) for pa, pb in zip(pooled[seed][0], pooled[seed][-1])), "replicas differ"

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
          f"torch {torch.__version__}, Python {platform.python_version()}, load average {load:.1f} at the end")
    if dev == "cuda":
        print(f"devices: {w} x {torch.cuda.get_device_name(0)}")
    print(f"case: one DDP step of a 32-64-8 MLP, batch 16 per rank, world size {w}, {backend}")
    print(f"pool start-up (once):   {startup:7.2f} s")
    print(f"pooled,  {opts.pooled:3d} examples:  {pooled_s * 1e3:8.1f} ms/example  = {1 / pooled_s:8.1f} examples/s")
    print(f"spawned, {opts.spawned:3d} examples:  {spawned_s * 1e3:8.1f} ms/example  = {1 / spawned_s:8.2f} examples/s")
    print(f"speed-up: {spawned_s / pooled_s:.0f}x; results identical bit for bit")


if __name__ == "__main__":
    main()
