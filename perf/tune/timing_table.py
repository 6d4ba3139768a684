"""One timing table at B=1, H=16, N=16384, d=64, bf16, causal: ours (Triton), SDPA flash and
cuDNN (median of do_bench), eager and the PyTorch tiles (a single timed call each after one
warm-up: they take from tens of milliseconds to seconds).

    python3 -m perf.tune.timing_table            (on a GPU)
"""

import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

from impl.attention.reference import attention_reference
from impl.attention.flash_pytorch import FlashAttentionPytorch
from impl.attention.flash_triton import FlashAttentionTriton

B, H, N, D = 1, 16, 16384, 64
dev = torch.device("cuda")
q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v):
    t.requires_grad_()


def fwd(fn):
    return lambda: fn()


def fwd_bwd(fn):
    def run():
        o = fn()
        o.backward(do)
    return run


impls = {
    "ours (Triton)": lambda: FlashAttentionTriton.apply(q, k, v, True),
    "SDPA flash": lambda: _sdpa(SDPBackend.FLASH_ATTENTION),
    "SDPA cuDNN": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION),
    "eager": lambda: attention_reference(q, k, v, True)[0],
    "PyTorch tiles": lambda: FlashAttentionPytorch.apply(q, k, v, True),
}


def _sdpa(backend):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def once(run):
    run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
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
