"""Activation-checkpointing benchmark: the GPT-style model's blocks under none, every, the
best single level (sqrt) and nested, beside torch's ``checkpoint_sequential`` at the same
single level, with the cost model's prediction printed first.

    python -m perf.bench.checkpointing --tiny      # CPU: tiny GPT, MemTracker peak
    python -m perf.bench.checkpointing             # one GPU: xl, batch 4 x 2048, bf16

Per strategy: the step time (forward + backward, median of ``--repeats`` after warm-up),
the peak memory of the step above what was allocated before it (GPU:
``torch.cuda.max_memory_allocated``; CPU: the Activation peak of torch's ``MemTracker``),
and the block forwards (forward pre-hooks).  Prediction (``impl.checkpointing.predict``):
b = bytes one block saves, estimated as 34 s B d bytes for a bf16 transformer layer with
fused attention (Korthikanti et al. 2022, without the s^2 attention term), a = 2 s B d
bytes for a block input; the table shows peak_saved_bytes + a and block_forwards.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

from impl.checkpointing import checkpointed_blocks, predict, sqrt_segment_size
from impl.models.gpt import make_gpt, random_batch


class _TorchSequential(nn.Module):
    def __init__(self, blocks, segments):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.segments = segments

    def forward(self, x):
        return checkpoint_sequential(self.blocks, self.segments, x, use_reentrant=False)


def _with_stack(model, stack):
    def forward(idx):
        x = model.tok(idx) + model.pos(torch.arange(idx.shape[1], device=idx.device))
        return model.head(model.ln_f(stack(x)))

    return forward


def _measure(model, stack, batch, device, repeats, warmup):
    inputs, targets = batch
    run = _with_stack(model, stack)
    counter = [0]
    hooks = [b.register_forward_pre_hook(lambda *a: counter.__setitem__(0, counter[0] + 1)) for b in model.blocks]

    def step():
        logits = run(inputs)
        F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
        model.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    counter[0] = 0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        from conformance.laws.checkpointing.probe import ActivationPeak

        tracker = ActivationPeak()
        tracker.track_external(model, inputs, targets)
        with tracker:
            step()
        peak = tracker.activation_peak
    forwards = counter[0]
    for h in hooks:
        h.remove()
    return statistics.median(times), peak, forwards


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on the tiny model")
    parser.add_argument("--size", default="xl")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    if args.tiny:
        args.size, args.batch, args.seq, args.repeats, args.warmup = "tiny", 2, 32, 3, 1
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = make_gpt(args.size, device=device, dtype=dtype, context_length=max(args.seq, 64))
    cfg = model.cfg
    n = cfg.n_layers
    esize = torch.empty((), dtype=dtype).element_size()
    a = esize * args.seq * args.batch * cfg.d_model
    b = 17 * a  # 34 s B d bytes at 2 bytes an element
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; torch {torch.__version__}; "
          f"model {args.size} ({n} blocks, d={cfg.d_model}); batch {args.batch} x {args.seq}; {dtype}")
    print(f"prediction: a = {a / 2**20:.1f} MiB per block input, b = {b / 2**20:.1f} MiB saved per block")
    k = sqrt_segment_size(n)
    rows = [("none", "none", None), ("every", "every", None), (f"sqrt (k={k})", "sqrt", None),
            ("nested", "nested", None), (f"torch checkpoint_sequential ({math.ceil(n / k)} segments)", "torch", None)]
    print(f"{'strategy':44s} {'pred peak MiB':>14s} {'pred fwd':>9s}")
    for label, strategy, seg in rows:
        p = predict(n, "sqrt" if strategy == "torch" else strategy, seg, b, a)
        print(f"{label:44s} {(p.peak_saved_bytes + a) / 2**20:14.1f} {p.block_forwards:9d}")
    batch = random_batch(cfg, args.batch, args.seq, device=device)
    print(f"\n{'strategy':44s} {'step ms':>9s} {'peak MiB':>10s} {'forwards':>9s}")
    for label, strategy, seg in rows:
        blocks = list(model.blocks)
        stack = _TorchSequential(blocks, math.ceil(n / k)) if strategy == "torch" else checkpointed_blocks(blocks, strategy, seg)
        try:
            t, peak, fwd = _measure(model, stack, batch, device, args.repeats, args.warmup)
            print(f"{label:44s} {t * 1e3:9.1f} {peak / 2**20:10.1f} {fwd:9d}")
        except torch.OutOfMemoryError:
            print(f"{label:44s} out of memory")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
