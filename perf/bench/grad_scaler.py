"""Gradient-scaler benchmark: the cost of agreeing the non-finite flag across ranks.

    python -m perf.bench.grad_scaler --tiny         # CPU, gloo, 2 ranks, tiny GPT: a smoke run
    python -m perf.bench.grad_scaler                # 2 GPUs, NCCL, GPT "small", bf16 autocast

Per rank, one training step of impl's GPT under impl's bucketed DDP (``get_ddp``), three
ways side by side in one run on the same model and batches: no scaler, torch's
``torch.amp.GradScaler`` (per-process decision), and ``impl``'s scaler (one extra
all-reduce of one element, waited, per unscale_).  Medians of ``--repeats`` steps after
``--warmup``; also the agreement all-reduce alone.  Prints device, torch and backend.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import impl
from impl.models.gpt import make_gpt, random_batch


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _worker(rank, world, store_path, args, out_path):
    cuda = not args.tiny and torch.cuda.is_available()
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = impl.get_ddp(make_gpt("tiny" if args.tiny else "small", device=device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(rank)
    idx, tgt = (t.to(device) for t in random_batch(model.module.cfg, args.batch, args.seq, generator=g))
    dtype = torch.bfloat16  # autocast dtype on both (fp16 would need the scale; bf16 shows the overhead)
    scalers = {
        "no scaler": None,
        "torch GradScaler": torch.amp.GradScaler(device.type, init_scale=2.0**10),
        "impl scaler (agreed flag)": impl.get_distributed_grad_scaler(init_scale=2.0**10),
    }
    results = {}
    for name, scaler in scalers.items():
        times = []
        for i in range(args.warmup + args.repeats):
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
            (scaler.scale(loss) if scaler else loss).backward()
            model.finish_gradient_synchronization()
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            _sync(device)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        results[name] = statistics.median(times) * 1e3
    flag = torch.zeros(1, device=device)
    times = []
    for i in range(args.warmup + args.repeats):
        _sync(device)
        t0 = time.perf_counter()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        float(flag.item())
        times.append(time.perf_counter() - t0)
    results["one-element all-reduce alone"] = statistics.median(times[args.warmup:]) * 1e3
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"device": str(torch.cuda.get_device_name(device) if cuda else "cpu"),
                       "backend": dist.get_backend(), "results_ms": results}, f)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny GPT")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args(argv)
    args.batch = args.batch or (2 if args.tiny else 4)
    args.seq = args.seq or (16 if args.tiny else 256)
    args.warmup = 2 if args.warmup is None else args.warmup
    args.repeats = args.repeats or (5 if args.tiny else 20)
    print(f"torch {torch.__version__}, world size {args.world_size}, batch {args.batch} x {args.seq}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(_worker, args=(args.world_size, os.path.join(tmp, "store"), args, out), nprocs=args.world_size, join=True)
        with open(out) as f:
            res = json.load(f)
    print(f"device {res['device']}, backend {res['backend']}; medians (ms) of one training step:")
    base = res["results_ms"]["no scaler"]
    for name, ms in res["results_ms"].items():
        print(f"  {name:32s} {ms:9.3f} ms  ({ms / base:5.2f}x no scaler)")


if __name__ == "__main__":
    main()
