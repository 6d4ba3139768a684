"""Tensor-parallel step time and memory per rank: one device vs impl's TP vs torch's TP.

    python -m perf.bench.tensor_parallel --tiny                 # CPU, gloo, 2 ranks, tiny model
    python -m perf.bench.tensor_parallel --sizes xl 2.7B --world-size 2 --dtype bf16   # GPUs

For each GPT size (``impl.models.gpt.SIZES``): forward + backward + SGD step on a random
batch, median over ``--steps`` timed steps after ``--warmup``, and the peak memory each
rank allocated (CUDA only).  Variants:

    dense   the whole model on rank 0's device alone (reported "does not fit" on OOM)
    impl    impl.tensor_parallel.TensorParallelGPT + vocab_parallel_cross_entropy
    torch   parallelize_module with ColwiseParallel / RowwiseParallel + loss_parallel
            (through conformance.adapters.torch_tensor_parallel's plan)

The ranks are spawned here (FileStore rendezvous; NCCL on GPUs, gloo on the CPU).  The
dense model is built on the CPU and sharded before anything moves to the device, so a
model that does not fit on one device still runs tensor-parallel.  Prints a markdown
table; ``--out FILE`` also writes the rows as JSON.
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


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(step, device, warmup, steps):
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _peak(device):
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def _reset(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _build(size, dtype, seq):
    from impl.models.gpt import make_gpt

    torch.manual_seed(0)
    return make_gpt(size, context_length=max(seq, 8)).to(dtype)


def _measure(variant, args, device, rank, world):
    from impl.models.gpt import SIZES, random_batch

    cfg = SIZES[args.size]
    dtype = getattr(torch, {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}[args.dtype])
    g = torch.Generator().manual_seed(1)
    ids, tgt = (t.to(device) for t in random_batch(cfg, args.batch, args.seq, generator=g))
    _reset(device)
    model = _build(args.size, dtype, args.seq)
    if variant == "dense":
        model = model.to(device)

        def loss_fn():
            logits = model(ids)
            return F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
    elif variant == "impl":
        from impl.tensor_parallel import TensorParallelGPT, vocab_parallel_cross_entropy

        model = TensorParallelGPT(model).to(device)

        def loss_fn():
            return vocab_parallel_cross_entropy(model(ids), tgt, vocab_size=cfg.vocab_size)
    else:
        from conformance.adapters import torch_tensor_parallel as adapter

        model = adapter.get_tensor_parallel_gpt(model.to(device))

        def loss_fn():
            return adapter.vocab_parallel_cross_entropy(model(ids), tgt, vocab_size=cfg.vocab_size)

    # foreach=False: torch's TP model mixes DTensor and plain parameters, which the
    # multi-tensor SGD (the default on CUDA) refuses; every variant steps the same way
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=False)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        opt.step()

    ms = _time_steps(step, device, args.warmup, args.steps)
    return {"variant": variant, "size": args.size, "world": 1 if variant == "dense" else world, "rank": rank,
            "step_ms": ms, "peak_gib": _peak(device)}


def _rank_main(rank, world, store_path, args_dict, out_path):
    args = argparse.Namespace(**args_dict)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world)
    rows = []
    for size in args.sizes:
        args.size = size
        for variant in args.variants:
            if variant == "dense" and rank != 0:
                dist.barrier()
                continue
            try:
                rows.append(_measure(variant, args, device, rank, world))
            except torch.OutOfMemoryError:
                rows.append({"variant": variant, "size": size, "world": 1 if variant == "dense" else world, "rank": rank,
                             "step_ms": None, "peak_gib": None, "note": "does not fit"})
            _reset(device)
            dist.barrier()
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny model: a smoke run")
    p.add_argument("--sizes", nargs="+", default=["xl", "2.7B"])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--variants", nargs="+", default=["dense", "impl", "torch"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.tiny:
        args.sizes, args.batch, args.seq, args.dtype, args.warmup, args.steps = ["tiny"], 2, 32, "fp32", 1, 3
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "rows")
        mp.spawn(_rank_main, args=(args.world_size, os.path.join(tmp, "store"), vars(args), out_path), nprocs=args.world_size)
        rows = [r for k in range(args.world_size) for r in json.load(open(f"{out_path}.{k}"))]
    print("| size | variant | ranks | rank | step (ms) | peak memory (GiB) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ms = "does not fit" if r["step_ms"] is None else f"{r['step_ms']:.1f}"
        mem = "" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        print(f"| {r['size']} | {r['variant']} | {r['world']} | {r['rank']} | {ms} | {mem} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
