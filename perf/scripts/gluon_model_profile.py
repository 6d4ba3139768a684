"""Where an eager GPT training step's GPU time goes with each attention kernel: the top
kernels of one step under torch.profiler (small model, bf16).

    PYTHONPATH=. python perf/scripts/gluon_model_profile.py [--context 4096] [--attention triton gluon sdpa]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from perf.bench.model import _training_step_for


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--attention", nargs="+", default=["triton", "gluon", "sdpa"])
    a = p.parse_args()
    for attention in a.attention:
        _, _, step = _training_step_for("small", attention, "bf16", "step", 4, a.context, torch.device("cuda"))
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        print(f"== {attention} context {a.context}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))


if __name__ == "__main__":
    main()
