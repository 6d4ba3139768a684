"""Composed-parallelism benchmark on 2 ranks: DP x TP, FSDP x TP at 1 x 2 and 2 x 1, PP x DP.

    python -m perf.bench.composed --tiny            # CPU, gloo, tiny GPT: a smoke run
    python -m perf.bench.composed                   # 2 GPUs, NCCL, GPT-style model (bf16 autocast)

Rows (mesh over 2 ranks; ``impl.mesh`` groups, ``impl.composed`` pieces):
    dp2 x tp1 (ddp)   impl's TP-free model, gradients averaged over dp (one all-reduce each)
    dp1 x tp2 (ddp)   impl's tensor-parallel GPT over the tp group
    fsdp2 x tp1       impl's FSDP (FULL_SHARD) over the dp group
    fsdp1 x tp2       tensor-parallel only (FSDP over a dp group of one is the plain model)
    pp2 x dp1         two pipeline stages (1F1B, m = 4 micro-batches)
    torch DDP dp2     the library peer: torch.nn.parallel.DistributedDataParallel
Predictions are printed before anything runs (``conformance.accounting``): FLOPs per token,
parameter + gradient + AdamW state bytes per rank, saved activations per rank (the dense
model's formula divided by the ranks that split the work: TP splits most of a block's
activations, PP keeps m in flight at most on stage 0), and each row's communication
payload per step.  Measured, per row and rank: the step time (median of ``--repeats``),
tokens/s over the global batch, peak allocated memory on GPUs, and MFU =
flops_per_token x tokens/s / (peak FLOP/s x 2 GPUs) (``--peak-tflops``, default 989: an
H100/H200's dense bf16).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from conformance.accounting import communication as comm_acc
from conformance.accounting.flops import flops_per_token, mfu
from conformance.accounting.memory import gib, gpt_activation_bytes
from impl.models.gpt import GPTConfig, make_gpt, random_batch

W = 2
ROWS = (
    ("dp2 x tp1 (ddp)", {"dp": 2, "tp": 1}, "ddp"),
    ("dp1 x tp2 (ddp)", {"dp": 1, "tp": 2}, "ddp"),
    ("fsdp2 x tp1", {"dp": 2, "tp": 1}, "fsdp"),
    ("fsdp1 x tp2", {"dp": 1, "tp": 2}, "fsdp"),
    ("pp2 x dp1 (1f1b, m=4)", {"pp": 2, "dp": 1}, "ddp"),
    ("torch DDP dp2", {"dp": 2}, "torch_ddp"),
)


def _predict(cfg, batch, seq, dims, kind, m=4):
    n = sum(p.numel() for p in make_gpt(cfg, device="meta").parameters())
    dp, tp, pp = dims.get("dp", 1), dims.get("tp", 1), dims.get("pp", 1)
    local = n / (tp * pp)
    state = local * (4 + 4 + 8) if kind != "fsdp" else local / dp * (4 + 8) + local * 4 / dp
    acts = gpt_activation_bytes(cfg, batch // dp, seq) / tp / pp * (min(m, pp) if pp > 1 else 1)
    tokens = batch // dp * seq
    if kind in ("ddp", "torch_ddp") and dp > 1:
        traffic = comm_acc.ddp_step([int(local)], 4).wire(dp)
    elif kind == "fsdp" and dp > 1:
        traffic = comm_acc.fsdp_step([int(local)], [], dp, "FULL_SHARD").wire(dp)
    else:
        traffic = 0.0
    if tp > 1:
        traffic += cfg.n_layers * comm_acc.tensor_parallel_block(tokens, cfg.d_model, 4).wire(tp)
    if pp > 1:
        traffic += comm_acc.pipeline_stage_messages(0, pp, m, tokens // m * cfg.d_model * 4)[1]
    return {"state_GiB": gib(state), "act_GiB": gib(acts), "wire_MiB": traffic / 2**20}


def _worker(rank, store_dir, args, queue):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = torch.device(f"cuda:{rank}") if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.FileStore(os.path.join(store_dir, "store"), W)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=W)
    from impl.composed.step import Composer, PipelineStage
    from impl.fsdp import FSDP
    from impl.mesh import get_parallel_mesh
    from impl.pipeline import pipeline_train_step
    from impl.tensor_parallel import TensorParallelGPT, vocab_parallel_cross_entropy

    cfg = _config(args)
    g = torch.Generator().manual_seed(0)
    ids, tgt = random_batch(cfg, args.batch, args.seq, generator=g)
    ids, tgt = ids.to(device), tgt.to(device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    results = []
    for label, dims, kind in ROWS:
        mesh = get_parallel_mesh(dict(dims))
        dp, tp, pp = mesh.size("dp"), mesh.size("tp"), mesh.size("pp")
        torch.manual_seed(0)
        model = make_gpt(cfg, device=device)
        tp_group = mesh.group("tp") if tp > 1 else None
        local = TensorParallelGPT(model, tp_group) if tp > 1 else model
        fsdp = None
        if kind == "fsdp" and dp > 1:
            module = fsdp = FSDP(local, group=mesh.group("dp"))
        elif kind == "torch_ddp":
            module = torch.nn.parallel.DistributedDataParallel(local, device_ids=[rank] if device.type == "cuda" else None)
        elif pp > 1:
            module = PipelineStage(local, mesh.rank("pp"), pp)
        else:
            module = local
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
        rows = args.batch // dp
        x, y = ids[mesh.rank("dp") * rows : (mesh.rank("dp") + 1) * rows], tgt[mesh.rank("dp") * rows : (mesh.rank("dp") + 1) * rows]
        count = args.batch * args.seq
        composer = Composer()

        def loss_sum(logits, t):
            if tp > 1:
                return vocab_parallel_cross_entropy(logits, t, tp_group, vocab_size=cfg.vocab_size, reduction="sum")
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), t.reshape(-1), reduction="sum")

        def step():
            opt.zero_grad(set_to_none=True)
            with amp:
                if pp > 1:
                    pipeline_train_step(module, "1f1b", x, y, loss_sum, 4, group=mesh.group("pp"), normalizer=count / dp)
                else:
                    (loss_sum(module(x), y) * dp / count).backward()
            if kind != "torch_ddp":
                composer.synchronise(module, fsdp, mesh)
            opt.step()

        times = []
        for i in range(args.warmup + args.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
                if i == args.warmup:
                    torch.cuda.reset_peak_memory_stats(device)
            dist.barrier()
            t0 = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        results.append({"label": label, "rank": rank, "ms": 1e3 * statistics.median(times), "peak_GiB": peak})
        del module, opt, local, model, fsdp
    queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def _config(args) -> GPTConfig:
    if args.tiny:
        return GPTConfig(64, 256, 2, 4, vocab_size=256, context_length=max(64, args.seq), attention="sdpa")
    return GPTConfig(args.d_model, 4 * args.d_model, args.layers, args.heads, vocab_size=50257, context_length=args.seq, attention="sdpa")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU, gloo, a tiny GPT")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--d-model", type=int, default=1600)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    args = p.parse_args(argv)
    args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if args.device == "cuda" and torch.cuda.device_count() < W:
        sys.exit(f"needs {W} GPUs, found {torch.cuda.device_count()}")
    args.batch = args.batch or (4 if args.tiny else 8)
    args.seq = args.seq or (32 if args.tiny else 1024)
    args.repeats = args.repeats or (3 if args.tiny else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    cfg = _config(args)
    print(f"torch {torch.__version__}; device {args.device}"
          + (f" ({torch.cuda.get_device_name(0)} x {W})" if args.device == "cuda" else f" (gloo, {W} ranks)"))
    print(f"model {cfg}; global batch {args.batch} x {args.seq} tokens")
    fpt = flops_per_token(cfg, args.seq)
    print(f"predictions (recorded before measuring): {fpt / 1e9:.3f} GFLOP/token (conformance.accounting.flops)")
    preds = {}
    for label, dims, kind in ROWS:
        preds[label] = _predict(cfg, args.batch, args.seq, dims, kind)
        pr = preds[label]
        print(f"  {label:24s} state {pr['state_GiB']:.3f} GiB/rank, activations {pr['act_GiB']:.3f} GiB/rank, wire {pr['wire_MiB']:.1f} MiB/rank/step")
    queue = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(d, args, queue), nprocs=W, join=True)
    per_rank = [queue.get() for _ in range(W)]
    tokens = args.batch * args.seq
    print("| composition | step ms (median, slowest rank) | tokens/s | peak GiB r0 / r1 | predicted state + act GiB/rank | predicted wire MiB | MFU |")
    print("|---|---|---|---|---|---|---|")
    for label, _, _ in ROWS:
        rows = sorted((r for res in per_rank for r in res if r["label"] == label), key=lambda r: r["rank"])
        ms = max(r["ms"] for r in rows)
        tps = tokens / (ms / 1e3)
        peak = " / ".join("-" if r["peak_GiB"] is None else f"{r['peak_GiB']:.2f}" for r in rows)
        pr = preds[label]
        m = mfu(fpt, tps, args.peak_tflops * 1e12 * W) if args.device == "cuda" else float("nan")
        print(f"| {label} | {ms:.2f} | {tps:.0f} | {peak} | {pr['state_GiB'] + pr['act_GiB']:.3f} | {pr['wire_MiB']:.1f} | {m:.3f} |")


if __name__ == "__main__":
    main()
