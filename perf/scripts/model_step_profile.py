"""Where a GPT training step with our attention spends its time against the same step with
SDPA: kernels launched per step (count and GPU time by name) and host time per step.

    PYTHONPATH=. python perf/scripts/model_step_profile.py [--size small] [--batch 4] [--context 512]
        [--backends sdpa triton] [--out DIR]

One warm step, then ``--steps`` profiled steps per backend (torch.profiler, CPU and CUDA);
writes DIR/model_step_profile.json and .md (the top kernels of each backend, and the kernels
the second backend launches that the first, the baseline, does not).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from impl.models.gpt import SIZES, make_gpt, random_batch


def step_fn(model, opt, batch):
    ids, labels = batch

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def profile_backend(backend: str, size: str, batch: int, context: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = make_gpt(size, device=torch.device("cuda"), attention=backend, context_length=max(context, SIZES[size].context_length))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = tuple(random_batch(model.cfg, batch, context, device=torch.device("cuda")))
    step = step_fn(model, opt, data)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    host = (time.perf_counter() - t0) / steps  # issue time per step, GPU behind
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels, gpu_us = Counter(), defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += 1
            gpu_us[e.name] += e.device_time
    # Host time by operator (CPU total, per step): where the issue time goes
    cpu = sorted(((e.key, e.count / steps, e.cpu_time_total / steps, e.self_cpu_time_total / steps)
                  for e in prof.key_averages()), key=lambda r: -r[2])[:40]
    return dict(host_ms_per_step=host * 1e3, wall_ms_per_step=wall * 1e3,
                kernels_per_step=sum(kernels.values()) / steps,
                kernels={k: dict(count=c / steps, gpu_us=gpu_us[k] / steps) for k, c in kernels.items()},
                cpu_ops=[dict(name=n, count=c, cpu_us=t, self_cpu_us=st) for n, c, t, st in cpu])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="small")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, nargs="+", default=[512])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--backends", nargs=2, default=["sdpa", "triton"], help="the baseline, then the one compared")
    p.add_argument("--out", default="perf-out")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report, lines = {}, []
    for ctx in a.context:
        base, other = a.backends
        res = {b: profile_backend(b, a.size, a.batch, ctx, a.steps) for b in (base, other)}
        report[ctx] = res
        lines += [f"## {a.size}, batch {a.batch}, context {ctx}", ""]
        for b, r in res.items():
            lines.append(f"- {b}: wall {r['wall_ms_per_step']:.2f} ms/step, host issue {r['host_ms_per_step']:.2f} ms/step, "
                         f"{r['kernels_per_step']:.0f} kernels/step")
        names = set(res[base]["kernels"]) | set(res[other]["kernels"])
        diff = []
        for n in names:
            s, t = res[base]["kernels"].get(n, {}), res[other]["kernels"].get(n, {})
            dc = t.get("count", 0) - s.get("count", 0)
            du = t.get("gpu_us", 0) - s.get("gpu_us", 0)
            if dc or abs(du) > 20:
                diff.append((du, dc, n))
        lines += ["", f"| kernel | count/step ({other} - {base}) | GPU us/step ({other} - {base}) |", "|---|---:|---:|"]
        for du, dc, n in sorted(diff, key=lambda x: -abs(x[0]))[:25]:
            lines.append(f"| {n[:90]} | {dc:+.0f} | {du:+.0f} |")
        for b, r in res.items():
            lines += ["", f"Host time by operator, {b} (per step, CPU total including children):", "",
                      "| operator | calls | CPU us | self CPU us |", "|---|---:|---:|---:|"]
            lines += [f"| {o['name'][:80]} | {o['count']:.0f} | {o['cpu_us']:.0f} | {o['self_cpu_us']:.0f} |"
                      for o in r["cpu_ops"][:25]]
        lines.append("")
    (out / "model_step_profile.json").write_text(json.dumps(report, indent=1))
    (out / "model_step_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
