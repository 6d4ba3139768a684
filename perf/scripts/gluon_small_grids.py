"""Device time of the Gluon kernels at CS336's sweep shapes (batch 1, one head), where a
128-row tile gives a few dozen programs on 132 SMs: kernel microseconds per call by kernel
(torch.profiler, CUDA activity), beside SDPA flash's and cuDNN's kernels.  Kernel sums leave
the host out, which decides a do_bench time at the shortest lengths.

    PYTHONPATH=. python perf/scripts/gluon_small_grids.py [--seq 1024 2048 4096 8192] [--no-peers] [--out FILE]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention import flash_gluon as fg
from perf.lib.measure import kernel_us_per_call
from perf.lib.workloads import cuda_attention_inputs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--no-peers", action="store_true", help="the Gluon kernels alone (A/B of module variants)")
    a = p.parse_args()
    rows = []
    for d in (64, 128):
        for causal in (True, False):
            for n in a.seq:
                q, k, v, do = cuda_attention_inputs(1, a.heads, n, d)
                qd, kd, vd = (t.detach() for t in (q, k, v))
                o, lse = fg.flash_forward(qd, kd, vd, causal)
                row = dict(d=d, causal=causal, n=n)
                row["gluon_fwd"] = kernel_us_per_call(lambda: fg.flash_forward(qd, kd, vd, causal))
                row["gluon_bwd"] = kernel_us_per_call(lambda: fg.flash_backward(qd, kd, vd, o, lse, do, causal))
                peers = () if a.no_peers else (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))
                for name, backend in peers:
                    with sdpa_kernel(backend):
                        row[f"{name}_fwd"] = kernel_us_per_call(lambda: F.scaled_dot_product_attention(qd, kd, vd,
                                                                                                is_causal=causal))
                        of = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        row[f"{name}_bwd"] = kernel_us_per_call(lambda: torch.autograd.grad(of, (q, k, v), do,
                                                                                    retain_graph=True))
                sums = {key: round(sum(val.values()), 1) for key, val in row.items() if isinstance(val, dict)}
                print(f"d{d} causal={causal} N{n}: " + "  ".join(f"{key} {us}" for key, us in sums.items()), flush=True)
                rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
