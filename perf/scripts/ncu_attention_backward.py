"""One attention forward + backward at B4 H16 N4096 d 128, full, bf16, for Nsight Compute:
ours (Gluon) or cuDNN's through SDPA.  Five passes warm up; the sixth runs between
cudaProfilerStart and Stop, so ``ncu --profile-from-start off`` profiles exactly one pass.

    ncu --profile-from-start off --clock-control none --set full -o OUT/gluon \\
        python perf/scripts/ncu_attention_backward.py gluon
    ncu --profile-from-start off --clock-control none --set full -o OUT/cudnn \\
        python perf/scripts/ncu_attention_backward.py cudnn
    ncu --import OUT/gluon.ncu-rep --page details --csv > OUT/gluon_details.csv

(``--clock-control none``: the machine's clocks as they run, as the timing tables ran.)"""
import sys

import torch

which = sys.argv[1]
B, H, N, D = 4, 16, 4096, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
           for _ in range(3))
do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
if which == "gluon":
    from impl.attention.flash_gluon import FlashAttentionGluon

    fn = lambda: FlashAttentionGluon.apply(q, k, v, False)  # noqa: E731
elif which == "cudnn":
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
else:
    raise SystemExit(f"unknown target {which!r}: gluon or cudnn")


def one_pass():
    fn().backward(do)
    q.grad = k.grad = v.grad = None


for _ in range(5):
    one_pass()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
one_pass()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done", which)
