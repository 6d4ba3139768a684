"""Pipeline-parallel benchmark: AFAB vs 1F1B on 2 stages, m = 1..16 micro-batches.

    python -m perf.bench.pipeline --tiny            # CPU, gloo, tiny GPT: a smoke run
    python -m perf.bench.pipeline                   # 2 GPUs, NCCL, GPT-style model

Predictions are printed before anything runs: the bubble (p - 1) / (m + p - 1) (the same
for both schedules), and the activations a stage holds at its peak: m micro-batches under
AFAB, min(p - s, m) under 1F1B.

Measured per (schedule, m), per stage: the step time (median of ``--repeats``), the
bubble estimated as 1 - t_alone / t_step (t_alone: the same stage's forwards and
backwards on all m micro-batches in one process, no communication: its busy time), the
peak bytes of stage outputs held for backward (the executor's count), and on GPUs the
peak allocated memory of the step (``torch.cuda.max_memory_allocated``).  The model is
the GPT-style decoder of ``impl.models.gpt`` cut into embeddings + first half of the
blocks, and second half + head.
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
import torch.nn as nn
import torch.nn.functional as F

from impl.models.gpt import GPTConfig, make_gpt, random_batch
from impl.pipeline import bubble_fraction, run_actions, schedule

P = 2


class _Embed(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class _Head(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x):
        return self.head(self.ln_f(x))


def stage_of(gpt, stage: int) -> nn.Sequential:
    half = len(gpt.blocks) // 2
    if stage == 0:
        return nn.Sequential(_Embed(gpt), *gpt.blocks[:half])
    return nn.Sequential(*gpt.blocks[half:], _Head(gpt))


def summed_ce(logits, target):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _alone(stage_module, stage, x, y, m, device):
    """The stage's compute for all m micro-batches, no communication: its busy time."""
    xs, ys = torch.tensor_split(x, m), torch.tensor_split(y, m)
    outs = []
    for i in range(m):
        inp = xs[i] if stage == 0 else torch.randn(xs[i].shape + (stage_module[0].ln1.weight.shape[0],), device=device, requires_grad=True)
        out = stage_module(inp)
        outs.append(summed_ce(out, ys[i]) / y.numel() if stage == P - 1 else out)
    for out in outs:
        out.backward() if out.dim() == 0 else out.backward(torch.ones_like(out) * 1e-3)


def worker(rank, args, store_dir, queue):
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // P))
    store = dist.FileStore(os.path.join(store_dir, "store"), P)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=P)
    cfg = GPTConfig(**json.loads(args.config))
    torch.manual_seed(0)
    gpt = make_gpt(cfg, device=device)
    dtype_ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    stage_module = stage_of(gpt, rank)
    x, y = random_batch(cfg, args.batch, args.seq, device=device, generator=None)
    rows = []
    for name in ("afab", "1f1b"):
        for m in args.microbatches:
            if args.batch % m:
                continue
            plan = schedule(name, P, m)
            times, stats = [], None
            for it in range(args.warmup + args.repeats):
                stage_module.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                dist.barrier()
                _sync(device)
                t0 = time.perf_counter()
                with dtype_ctx:
                    stats = run_actions(stage_module, plan[rank], x, y, summed_ce, m, stage=rank, n_stages=P, normalizer=y.numel())
                _sync(device)
                if it >= args.warmup:
                    times.append(time.perf_counter() - t0)
            peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
            alone = []
            for it in range(args.warmup + args.repeats):
                stage_module.zero_grad(set_to_none=True)
                _sync(device)
                t0 = time.perf_counter()
                with dtype_ctx:
                    _alone(stage_module, rank, x, y, m, device)
                _sync(device)
                if it >= args.warmup:
                    alone.append(time.perf_counter() - t0)
            t_step, t_alone = statistics.median(times), statistics.median(alone)
            rows.append({
                "schedule": name, "m": m, "stage": rank, "step_ms": 1e3 * t_step, "alone_ms": 1e3 * t_alone,
                "bubble_measured": max(0.0, 1 - t_alone / t_step), "bubble_predicted": bubble_fraction(P, m),
                "in_flight": stats.max_in_flight, "in_flight_predicted": m if name == "afab" else min(P - rank, m),
                "stash_MiB": stats.peak_stash_bytes / 2**20, "peak_alloc_MiB": None if peak is None else peak / 2**20,
            })
    queue.put(rows)
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, gloo, a tiny GPT (a smoke run, seconds)")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.tiny:
        args.device, args.batch, args.seq = "cpu", 16, 32
        cfg = GPTConfig(64, 256, 4, 4, vocab_size=256, context_length=64, attention="sdpa")
        args.repeats, args.warmup = min(args.repeats, 3), 1
    else:
        if torch.cuda.device_count() < P:
            raise SystemExit(f"needs {P} GPUs (found {torch.cuda.device_count()}); use --tiny on the CPU")
        args.device, args.batch, args.seq = "cuda", 16, 1024
        cfg = GPTConfig(1600, 6400, 24, 25, vocab_size=50257, context_length=1024, attention="sdpa")
    args.config = json.dumps(cfg.__dict__)
    print(f"model {cfg}; batch {args.batch} x {args.seq} tokens; {P} stages on {args.device}")
    print("predictions (recorded before measuring):")
    for m in args.microbatches:
        print(f"  m={m:2d}: bubble (p-1)/(m+p-1) = {bubble_fraction(P, m):.3f}; activations held at the peak: "
              f"AFAB {m} micro-batches per stage, 1F1B stage 0 {min(P, m)}, stage 1 {min(1, m)}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as store_dir:
        procs = [ctx.Process(target=worker, args=(r, args, store_dir, queue)) for r in range(P)]
        for p in procs:
            p.start()
        rows = [row for _ in procs for row in queue.get(timeout=1800)]
        for p in procs:
            p.join()
    rows.sort(key=lambda r: (r["schedule"], r["m"], r["stage"]))
    print("| schedule | m | stage | step ms | alone ms | bubble measured | bubble predicted | in flight (pred) | stash MiB | peak alloc MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peak = "-" if r["peak_alloc_MiB"] is None else f"{r['peak_alloc_MiB']:.0f}"
        print(f"| {r['schedule']} | {r['m']} | {r['stage']} | {r['step_ms']:.2f} | {r['alone_ms']:.2f} | {r['bubble_measured']:.3f} | "
              f"{r['bubble_predicted']:.3f} | {r['in_flight']} ({r['in_flight_predicted']}) | {r['stash_MiB']:.2f} | {peak} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
