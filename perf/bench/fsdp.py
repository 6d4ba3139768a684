"""FSDP step time, tokens/s and peak memory per rank: ours (FULL_SHARD, SHARD_GRAD_OP) and
torch's ``fully_shard``, on the GPT-style model, bf16 compute / fp32 reduction, AdamW.

    python -m perf.bench.fsdp --tiny                  # CPU, gloo, 2 ranks, tiny model (a smoke run)
    python -m perf.bench.fsdp --size gpt1_5b --world-size 2 --batch 4 --seq 256   # 2 GPUs

One process per rank (spawned here), a fresh model per variant.  Next to the measured peak
it prints the ZeRO paper's per-rank model-state bytes, (2 + 2 + K) * P with K = 12 for
mixed-precision Adam, divided as stage 3 divides it: (2 + 2 + K) * P / W.  Our FSDP keeps
fp32 master shards and fp32 gradients shards: (4 + 4 + 8) * P / W for AdamW, plus the
gathered bf16 units in flight and the activations.
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

from impl.models.gpt import Block, count_parameters, make_gpt, random_batch

VARIANTS = ("fsdp_full_shard", "fsdp_shard_grad_op", "torch_fully_shard", "torch_fully_shard_no_reshard")


def _wrap(variant: str, model, dtype):
    if variant.startswith("fsdp_"):
        from impl.fsdp import FSDP

        strategy = "FULL_SHARD" if variant == "fsdp_full_shard" else "SHARD_GRAD_OP"
        return FSDP(model, strategy=strategy, compute_dtype=dtype, unit_classes=(Block,))
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    reshard = variant == "torch_fully_shard"
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        fully_shard(block, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp_policy, reshard_after_forward=reshard)
    return model


def _rank(rank, world, store, args, results):
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dtype = torch.bfloat16 if cuda else None
    out = {}
    for variant in args.variants:
        torch.manual_seed(0)
        model = make_gpt(args.size, device=device)
        n_params = count_parameters(model)
        wrapped = _wrap(variant, model, dtype)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
        cfg = model.cfg if hasattr(model, "cfg") else None
        g = torch.Generator(device=device).manual_seed(rank)
        times = []
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        for step in range(args.warmup + args.steps):
            x, y = random_batch(cfg, args.batch, args.seq, device=device, generator=g)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            # bf16 autocast around every variant, as in the DDP benchmark: impl's FSDP casts
            # only the sharded matrices, the replicated norm gains stay fp32 and upcast
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = wrapped(x)
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            if hasattr(wrapped, "finish_gradient_synchronization"):
                wrapped.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
        out[variant] = {
            "ms": ms,
            "tokens_per_s": world * args.batch * args.seq / (ms / 1e3),
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan"),
            "params": n_params,
        }
        del wrapped, model, opt
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0:
        results.update(out)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny model: a smoke run")
    parser.add_argument("--size", default="gpt1_5b")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.size, args.batch, args.seq, args.steps, args.warmup = "tiny", 2, 16, 3, 1
    store = tempfile.mktemp(prefix="fsdp_bench_")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(args.world_size, store, args, results), nprocs=args.world_size, join=True)
        results = dict(results)
    W = args.world_size
    print(f"torch {torch.__version__}, {'CPU gloo' if args.tiny else torch.cuda.get_device_name(0)}, W={W}, size {args.size}, batch {args.batch} x {args.seq} per rank")
    print(f"{'variant':32s} {'step ms':>9s} {'tokens/s':>10s} {'peak GiB':>9s} {'ZeRO-3 model states GiB':>24s}")
    for name, r in results.items():
        zero3 = (2 + 2 + 12) * r["params"] / W / 2**30
        print(f"{name:32s} {r['ms']:9.1f} {r['tokens_per_s']:10.0f} {r['peak_gib']:9.2f} {zero3:24.2f}")


if __name__ == "__main__":
    main()
