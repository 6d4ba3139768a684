"""Ring collectives against the backend's own (gloo on the CPU, NCCL on GPUs), side by side.

    python -m perf.bench.ring_collectives --tiny      # CPU, gloo, 2 ranks, small sizes
    python -m perf.bench.ring_collectives             # 2 GPUs, NCCL, 1 MB .. 1 GB

Per size and collective: the median time over ``--repeats`` on rank 0, the algorithm
bandwidth S / t and the bus bandwidth (all-reduce: 2 (W - 1) / W S / t; all-gather and
reduce-scatter: (W - 1) / W S / t; the alternate ring: (W - 1) S / t), beside the time
model's prediction at ``--link-gbps`` (bandwidth term only, see ``impl.collectives.ring``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from impl.collectives import ring_all_gather, ring_all_reduce, ring_all_reduce_alternate, ring_reduce_scatter


def _theirs(name):
    def all_reduce(t):
        out = t.clone()
        dist.all_reduce(out)
        return out

    def all_gather(t):
        out = torch.empty((dist.get_world_size() * t.numel(),), dtype=t.dtype, device=t.device)
        dist.all_gather_into_tensor(out, t)
        return out

    def reduce_scatter(t):
        w = dist.get_world_size()
        out = torch.empty((t.numel() // w,), dtype=t.dtype, device=t.device)
        dist.reduce_scatter_tensor(out, t)
        return out

    return {"all_reduce": all_reduce, "all_gather": all_gather, "reduce_scatter": reduce_scatter}[name]


OURS = {"all_reduce": ring_all_reduce, "all_gather": ring_all_gather, "reduce_scatter": ring_reduce_scatter,
        "all_reduce_alternate": ring_all_reduce_alternate}
BUS = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
       "reduce_scatter": lambda w: (w - 1) / w, "all_reduce_alternate": lambda w: float(w - 1)}


def _time(fn, t, repeats, device):
    for _ in range(2):
        fn(t)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fn(t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rank(rank, world, store_path, args):
    use_cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device(f"cuda:{rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    if rank == 0:
        print(f"device {torch.cuda.get_device_name() if use_cuda else 'cpu'} x{world}; torch {torch.__version__}; "
              f"backend {dist.get_backend()}; link model {args.link_gbps} GB/s")
        print(f"{'collective':22s} {'bytes':>12s} {'impl':>8s} {'ms':>9s} {'busbw GB/s':>11s} {'model ms':>9s}")
    for nbytes in args.sizes:
        numel = max(world, nbytes // 4 // world * world)
        t = torch.randn(numel, device=device)
        for name, ours in OURS.items():
            s = numel * 4
            data = s  # S: the bytes reduced, or gathered (each rank then holds S / W)
            inp = t[: numel // world] if name == "all_gather" else t
            peers = [("ring", ours)] + ([("backend", _theirs(name))] if name in ("all_reduce", "all_gather", "reduce_scatter") else [])
            for who, fn in peers:
                sec = _time(fn, inp, args.repeats, device)
                if rank == 0:
                    bus = BUS[name](world) * data / sec / 1e9
                    model = BUS[name](world) * data / (args.link_gbps * 1e9) * 1e3
                    print(f"{name:22s} {data:12d} {who:>8s} {sec * 1e3:9.3f} {bus:11.2f} {model:9.3f}")
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2**20, 10 * 2**20, 100 * 2**20, 2**30])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--link-gbps", type=float, default=2.0 if not torch.cuda.is_available() else 300.0)
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes, args.repeats, args.world = [4096, 65536], 5, 2
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_rank, args=(args.world, os.path.join(d, "store"), args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
