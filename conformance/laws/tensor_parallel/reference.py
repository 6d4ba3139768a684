"""Single-process references: the dense module run in float64 (the reference) and in the
tested dtype (the eager result the oracle scales its bound by), from the same inputs.

The eager run is on the ranks' device (the oracle's yardstick is the straightforward
computation on the same device: a GPU's fp32 kernels round differently from the CPU's);
the float64 reference stays on the CPU.  Every result comes back on the CPU.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from conformance.harness import resolve_device
from conformance.oracle import farthest, nudged

from . import model as build


def _device(dtype) -> str:
    return "cpu" if dtype == torch.float64 else resolve_device()


def _cpu(t):
    return None if t is None else t.detach().cpu()


def dense_run(module, x, dy, dtype):
    """Forward and backward of a copy of ``module`` in ``dtype``: (y, dx, {name: grad})."""
    dev = _device(dtype)
    m = copy.deepcopy(module).to(device=dev, dtype=dtype)
    x = x.detach().to(device=dev, dtype=dtype).requires_grad_(x.is_floating_point())
    y = m(x)
    (y * dy.to(device=dev, dtype=y.dtype)).sum().backward()
    return _cpu(y), (_cpu(x.grad) if x.is_floating_point() else None), {n: _cpu(p.grad) for n, p in m.named_parameters()}


def dense_embedding_run(module, ids, dy, dtype):
    dev = _device(dtype)
    m = copy.deepcopy(module).to(device=dev, dtype=dtype)
    y = m(ids.to(dev))
    (y * dy.to(device=dev, dtype=dtype)).sum().backward()
    return _cpu(y), None, {n: _cpu(p.grad) for n, p in m.named_parameters()}


def cross_entropy(logits, targets, dy, case, dtype):
    """F.cross_entropy on the full logits in ``dtype``: (loss, d loss / d logits)."""
    dev = _device(dtype)
    x = logits.detach().to(device=dev, dtype=dtype).requires_grad_(True)
    targets = targets.to(dev)
    flat = F.cross_entropy(x.reshape(-1, x.shape[-1]), targets.reshape(-1), ignore_index=case.ignore_index, reduction=case.reduction)
    loss = flat.reshape(targets.shape) if case.reduction == "none" else flat
    (loss * dy.to(device=dev, dtype=dtype)).sum().backward() if case.reduction == "none" else loss.backward()
    return _cpu(loss), _cpu(x.grad)


def per_token_magnitudes(module, x, dy):
    """Sum over tokens (all but the last dim of the output) of |gradient of that token's
    term y_t . dy_t|, in float64: the size of the terms each gradient element adds up
    (the oracle's magnitude), for the input and every parameter."""
    m = copy.deepcopy(module).to(F64)
    x = x.detach().to(F64)
    dy = dy.to(F64)
    total = {}
    tokens = dy.reshape(-1, dy.shape[-1]).shape[0]
    for t in range(tokens):
        m.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        y = m(xi).reshape(-1, dy.shape[-1])
        (y[t] * dy.reshape(-1, dy.shape[-1])[t]).sum().backward()
        grads = {n: p.grad.abs() for n, p in m.named_parameters() if p.grad is not None}
        grads["input"] = xi.grad.abs()
        for k, v in grads.items():
            total[k] = v if k not in total else total[k] + v
    return total


def _gpt_loss(m, ids, tgt, ignore_index, token=None):
    logits = m(ids)
    per = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=ignore_index, reduction="none")
    count = (tgt != ignore_index).sum()
    return (per.sum() if token is None else per[token]) / count


def gpt_step(case, params: dict, ids, tgt, dtype):
    """The dense GPT at ``params`` in ``dtype``: (loss, {name: grad})."""
    m = build.gpt(case)
    m.load_state_dict({k: v.to(torch.float32) for k, v in params.items()}, strict=False)
    dev = _device(dtype)
    m = m.to(device=dev, dtype=dtype)
    loss = _gpt_loss(m, ids.to(dev), tgt.to(dev), case.ignore_index)
    loss.backward()
    return _cpu(loss), {n: _cpu(p.grad) for n, p in m.named_parameters()}


# The eager float32 run is one sample of how far float32 rounding takes these results from
# float64, and on a model this small it can be a lucky one: where a narrow RMSNorm's backward
# cancels, the eager gradient of a norm weight came out within 0.2 ulp (an H200, d_model 4)
# or 1 ulp (the CPU, d_model 2) while a correct sequence-parallel model, adding in another
# order, was 9 or 12 ulps off, past 4 x the eager error + 4 ulps of the terms.
# So SPREAD_SAMPLES more eager runs start from the parameters each moved by one float32 ulp,
# up or down (seeded): what rounding of that size does to each result is the conditioning the
# bound must scale with, and per result the run farthest from float64 is the eager one judged by.
SPREAD_SAMPLES = 3


def gpt_step_eager(case, params: dict, ids, tgt, loss64, grads64, step: int = 0):
    """The eager float32 loss and gradients the oracle scales by: of the run at ``params`` and
    SPREAD_SAMPLES runs at nudged ones, per result the farthest from float64."""
    runs = [gpt_step(case, params, ids, tgt, torch.float32)]
    runs += [gpt_step(case, nudged(params, case.seed * 1009 + step * 31 + k), ids, tgt, torch.float32)
             for k in range(SPREAD_SAMPLES)]
    return farthest(loss64, [r[0] for r in runs]), farthest(grads64, [r[1] for r in runs])


def gpt_training_eager(case, final64):
    """The float32 training the oracle scales by: from the initial weights and from
    SPREAD_SAMPLES nudged copies of them, per parameter the farthest from float64."""
    start = dict(build.gpt(case).named_parameters())
    runs = [gpt_training(case, torch.float32)]
    runs += [gpt_training(case, torch.float32, nudged(start, case.seed * 1013 + k)) for k in range(SPREAD_SAMPLES)]
    return farthest(final64, runs)


def gpt_magnitudes(case, params: dict, ids, tgt):
    """Per-token |gradient| summed over the tokens that count, in float64."""
    m = build.gpt(case)
    m.load_state_dict({k: v.to(torch.float32) for k, v in params.items()}, strict=False)
    m = m.to(F64)
    total = {}
    for t in torch.nonzero(tgt.reshape(-1) != case.ignore_index).flatten().tolist():
        m.zero_grad(set_to_none=True)
        _gpt_loss(m, ids, tgt, case.ignore_index, token=t).backward()
        for n, p in m.named_parameters():
            g = p.grad.abs() if p.grad is not None else torch.zeros_like(p)
            total[n] = g if n not in total else total[n] + g
    return total


def gpt_training(case, dtype, start: dict | None = None):
    """The dense GPT trained for the case's steps from its initial weights (or ``start``):
    final parameters."""
    dev = _device(dtype)
    m = build.gpt(case)
    if start is not None:
        m.load_state_dict(start, strict=False)
    m = m.to(device=dev, dtype=dtype)
    opt = build.optimizer(case.optimizer, m.parameters())
    for ids, tgt in build.gpt_batches(case):
        opt.zero_grad()
        _gpt_loss(m, ids.to(dev), tgt.to(dev), case.ignore_index).backward()
        opt.step()
    return {n: p.detach().cpu().clone() for n, p in m.named_parameters()}


F64 = torch.float64
