"""One timing table at B=1, H=16, N=16384, d=64, bf16, causal: ours (Triton), SDPA flash and
cuDNN (median of do_bench), eager and the PyTorch tiles (a single timed call each after one
warm-up: they take from tens of milliseconds to seconds).

    python3 -m perf.tune.timing_table            (on a GPU)
"""

import time

import torch
import triton

from impl.attention.flash_pytorch import FlashAttentionPytorch
from impl.attention.flash_triton import FlashAttentionTriton
from perf.lib.workloads import eager_attention, make_inputs, sdpa_attention, synchronize

B, H, N, D = 1, 16, 16384, 64
dev = torch.device("cuda")
q, k, v, do = make_inputs((B, H, N, D), torch.bfloat16, dev)


def fwd(fn):
    return lambda: fn()


def fwd_bwd(fn):
    def run():
        o = fn()
        o.backward(do)
    return run


impls = {
    "ours (Triton)": lambda: FlashAttentionTriton.apply(q, k, v, True),
    "SDPA flash": lambda: sdpa_attention(q, k, v, True, backend="flash"),
    "SDPA cuDNN": lambda: sdpa_attention(q, k, v, True, backend="cudnn"),
    "eager": lambda: eager_attention(q, k, v, True),
    "PyTorch tiles": lambda: FlashAttentionPytorch.apply(q, k, v, True),
}


def once(run):
    run()
    synchronize(dev)
    t0 = time.perf_counter()
    run()
    synchronize(dev)
    return (time.perf_counter() - t0) * 1e3


print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}")
print(f"B={B} H={H} N={N} d={D} bf16 causal")
print("| implementation | forward ms | forward+backward ms | timing |")
print("|---|---|---|---|")
for name, fn in impls.items():
    slow = name in ("eager", "PyTorch tiles")
    try:
        if slow:
            f_ms, fb_ms, how = once(fwd(fn)), once(fwd_bwd(fn)), "one call after a warm-up"
        else:
            f_ms = triton.testing.do_bench(fwd(fn), return_mode="median")
            fb_ms = triton.testing.do_bench(fwd_bwd(fn), return_mode="median")
            how = "do_bench median"
        print(f"| {name} | {f_ms:.3f} | {fb_ms:.3f} | {how} |", flush=True)
    except torch.OutOfMemoryError:
        print(f"| {name} | OOM | OOM | |", flush=True)
    for t in (q, k, v):
        t.grad = None
    torch.cuda.empty_cache()
