"""The Gluon flavour's short forward: its Gluon kernel against the Triton flavour's kernel that
plans over few keys now take (flash_gluon.TRITON_FORWARD_KEYS), and SDPA flash, in device time
with the GPU held behind the host (measure.device_ms_held_behind), rounds interleaved in a
shuffled order, medians.  Which grids the route should cover.

    PYTHONPATH=. python perf/scripts/gluon_triton_forward.py [--rounds 9] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import impl.attention.flash_gluon as fg
from perf.lib import measure

GRIDS = [(1, 1), (1, 16), (4, 16), (8, 16)]


def plan(q, k, v, causal, triton: bool):
    """A forward plan of the Triton kernel or the Gluon one, whatever the grid (the module's
    routing restored after)."""
    was = fg._triton_forward
    fg._triton_forward = lambda *args: triton
    try:
        return fg._ForwardPlan(q, k, v, causal, None, 0)
    finally:
        fg._triton_forward = was


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--seq", type=int, nargs="+", default=[128, 256])
    p.add_argument("--dims", type=int, nargs="+", default=[64])
    p.add_argument("--out", default="perf-out")
    a = p.parse_args()
    shuffle = random.Random(0)
    lines = ["| B H | N | d | mask | Triton route | gluon us | triton us | flash us | triton / gluon | route / flash |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for b, h in GRIDS:
        for n in a.seq:
            for d in a.dims:
                for causal in (True, False):
                    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    gluon, tri = plan(q, k, v, causal, False), plan(q, k, v, causal, True)
                    on = fg._triton_forward(b * h, n, n, d, q.device, 0)
                    ref = gluon(q, k, v)[0]
                    assert (tri(q, k, v)[0].float() - ref.float()).abs().max().item() < 0.05

                    def flash():
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    calls = {"gluon": lambda: gluon(q, k, v), "triton": lambda: tri(q, k, v), "flash": flash}
                    host = {name: measure.host_us_per_call(fn, q.device) for name, fn in calls.items()}
                    times = {name: [] for name in calls}
                    for _ in range(a.rounds):
                        names = list(calls)
                        shuffle.shuffle(names)
                        for name in names:
                            times[name].append(1e3 * measure.device_ms_held_behind(calls[name], q.device,
                                                                                   host_us=host[name]))
                    med = {name: statistics.median(t) for name, t in times.items()}
                    route = med["triton"] if on else med["gluon"]
                    lines.append(f"| B{b} H{h} | {n} | {d} | {'causal' if causal else 'full'} | {'on' if on else 'off'} | "
                                 f"{med['gluon']:.2f} | {med['triton']:.2f} | {med['flash']:.2f} | "
                                 f"{med['triton'] / med['gluon']:.3f} | {route / med['flash']:.3f} |")
                    print(lines[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gluon_triton_forward.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
