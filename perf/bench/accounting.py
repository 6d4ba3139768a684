"""Accounting against measurement on the device: MFU of a training step, and model-state
memory against the ZeRO formula.

    python -m perf.bench.accounting [--sizes small medium large xl] [--batch 4] [--context 512]
        [--precision bf16] [--steps 10] [--out DIR] [--device auto|cpu|cuda]

Peak FLOP/s is measured in the same run (the median of a large bf16 matmul, or fp32 for
fp32 steps) and the nominal peak of the device is printed beside it; MFU is reported
against both.  Model FLOPs per token are ``conformance.accounting.flops.flops_per_token``
(6 N_mm + 12 L T C, the whole attention square); the step is perf.bench.model's (AdamW,
torch SDPA, autocast for bf16), a fresh model per size, warm-up excluded, mean of the
timed steps.

Memory: after one step, the bytes the allocator holds for parameters, gradients and
AdamW state (fp32 master weights: ``param_bytes=4, grad_bytes=4, optimizer_bytes=8``)
against ``zero_model_state_bytes(Psi, 1, 0, ...)`` plus AdamW's step counters; and the
step's peak, which adds activations and temporaries.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import torch

from conformance.accounting import flops as model_flops
from conformance.accounting import zero_model_state_bytes
from impl.models import gpt
from perf.bench.model import ModelCase, make_optimizer, measure_case
from perf.lib import measure
from perf.lib.workloads import synchronize

NOMINAL_DENSE_TFLOPS = {"H100": {"bf16": 989.4, "fp32": 494.7}, "H200": {"bf16": 989.4, "fp32": 494.7}}  # SXM, dense (TF32 for fp32)


def measured_peak_tflops(device, precision: str, n: int = 8192) -> float:
    """The median TFLOP/s of one n x n x n matmul in the step's precision: the achievable peak."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = measure.median_ms(lambda: a @ b, device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def nominal_tflops(device, precision: str) -> float | None:
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in NOMINAL_DENSE_TFLOPS.items():
        if key in name:
            return peaks[precision]
    return None


def model_state_bytes_after_step(size: str, device, batch: int, context: int) -> dict:
    """Allocator bytes of the model states after one fp32 AdamW step, against the formula."""
    measure.free_memory(device)
    model = gpt.make_gpt(size, device=device)
    opt = make_optimizer(model)
    x, y = gpt.random_batch(model.cfg, batch, context, device=device)
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    opt.step()
    x = y = None
    synchronize(device)
    held = torch.cuda.memory_allocated(device) if torch.device(device).type == "cuda" else None
    psi = gpt.count_parameters(model)
    n_tensors = len(list(model.parameters()))
    formula = zero_model_state_bytes(psi, 1, 0, param_bytes=4, grad_bytes=4, optimizer_bytes=8)["total"] + 4 * n_tensors
    model = opt = None
    measure.free_memory(device)
    return dict(size=size, params_m=psi / 1e6, formula_mib=formula / 2**20, held_mib=None if held is None else held / 2**20,
                ratio=None if held is None else held / formula)


def run(sizes: Sequence[str], *, batch: int, context: int, precision: str, steps: int, device) -> dict:
    peak = measured_peak_tflops(device, precision) if torch.device(device).type == "cuda" else None
    nominal = nominal_tflops(device, precision)
    rows = []
    for size in sizes:
        model = gpt.make_gpt(size, device=device, context_length=max(context, gpt.SIZES[size].context_length))
        row = measure_case(model, ModelCase(size, "sdpa", precision, "step", batch, context), warmup=3, steps=steps)
        fpt = model_flops.flops_per_token(model.cfg, context)
        model = None
        measure.free_memory(device)
        tps = row.get("tokens_per_s")
        rows.append(dict(size=size, params_m=row.get("params_m") or None, mean_ms=row.get("mean_ms"), tokens_per_s=tps,
                         gflop_per_token=fpt / 1e9, achieved_tflops=None if not tps else fpt * tps / 1e12,
                         mfu_measured_peak=None if not (tps and peak) else model_flops.mfu(fpt, tps, peak * 1e12),
                         mfu_nominal_peak=None if not (tps and nominal) else model_flops.mfu(fpt, tps, nominal * 1e12),
                         status=row["status"], detail=row.get("detail", "")))
        print(rows[-1], flush=True)
    memory = [model_state_bytes_after_step(s, device, batch=1, context=min(context, 128)) for s in sizes]
    for m in memory:
        print(m, flush=True)
    return dict(device=measure.device_description(device), precision=precision, batch=batch, context=context,
                peak_tflops_measured=peak, peak_tflops_nominal=nominal, mfu=rows, model_states=memory)


def markdown(result: dict) -> str:
    d = result["device"]
    lines = [f"# Accounting on {d.get('gpu') or d.get('cpu')}", "",
             f"torch {d.get('torch')}, Triton {d.get('triton')}, CUDA {d.get('cuda', '-')}.", "",
             f"Peak {result['precision']} matmul measured: {result['peak_tflops_measured']} TFLOP/s; nominal dense: "
             f"{result['peak_tflops_nominal']} TFLOP/s. Batch {result['batch']} x context {result['context']}.", "",
             "| size | step ms | tokens/s | GFLOP/token | achieved TFLOP/s | MFU (measured peak) | MFU (nominal peak) | status |",
             "|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=3: "" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in result["mfu"]:
        lines.append(f"| {r['size']} | {f(r['mean_ms'], 1)} | {f(r['tokens_per_s'], 0)} | {f(r['gflop_per_token'], 2)} | "
                     f"{f(r['achieved_tflops'], 1)} | {f(r['mfu_measured_peak'])} | {f(r['mfu_nominal_peak'])} | {r['status']} |")
    lines += ["", "| size | parameters (M) | formula MiB (16 B/param + step counters) | held after a step MiB | held / formula |",
              "|---|---|---|---|---|"]
    for m in result["model_states"]:
        lines.append(f"| {m['size']} | {m['params_m']:.1f} | {m['formula_mib']:.1f} | {f(m['held_mib'], 1)} | {f(m['ratio'], 4)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict:
    from perf.bench.attention import resolve_device

    p = argparse.ArgumentParser(prog="python -m perf.bench.accounting", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--sizes", nargs="+", choices=list(gpt.SIZES))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", default="perf-out")
    opts = p.parse_args(argv)
    device = resolve_device(opts.device)
    sizes = opts.sizes or (["small", "medium", "large", "xl"] if device.type == "cuda" else ["tiny"])
    result = run(sizes, batch=opts.batch, context=opts.context, precision=opts.precision, steps=opts.steps, device=device)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "accounting.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "accounting.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
