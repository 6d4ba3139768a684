"""Single-process reference of a pipeline case: the dense model on the whole batch.

``dense(case, dtype)`` -> (named gradients, loss): one forward and backward of the whole
model on the whole batch, loss = (summed loss) / count, computed in ``dtype``.
``per_sample_magnitude(case)`` -> named tensors: sum over samples of |gradient of that
sample's term| in float64, the size of the terms each gradient element adds up (the
oracle's magnitude: a gradient that cancels to nearly zero is judged against them).
"""

from __future__ import annotations

import torch

from conformance.laws.pipeline import model as models
from conformance.oracle import farthest


def _run(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def _cpu(grads: dict) -> dict:
    return {k: v.cpu() for k, v in grads.items()}


def dense(case, dtype=torch.float64, device="cpu"):
    layers, inputs, targets, loss_fn, count = models.build(case, dtype, device)
    loss = loss_fn(_run(layers, inputs), targets) / count
    loss.backward()
    return _cpu(models.named_grads(layers)), loss.detach().double().cpu()


def per_sample_magnitude(case):
    layers, inputs, targets, loss_fn, count = models.build(case, torch.float64)
    total = None
    for i in range(inputs.shape[0]):
        for p in layers.parameters():
            p.grad = None
        (loss_fn(_run(layers, inputs[i : i + 1]), targets[i : i + 1]) / count).backward()
        grads = {k: v.abs() for k, v in models.named_grads(layers).items()}
        total = grads if total is None else {k: total[k] + grads[k] for k in total}
    return total


def microbatched(case, dtype=torch.float32, device="cpu"):
    """The plain loop a pipeline computes, in one process: for each accumulation step and
    each of its ``tensor_split`` micro-batches, backward of (summed loss) / count."""
    layers, inputs, targets, loss_fn, count = models.build(case, dtype, device)
    total = 0.0
    for xs, ys in zip(torch.tensor_split(inputs, case.steps), torch.tensor_split(targets, case.steps)):
        step_sum = None
        for x, y in zip(torch.tensor_split(xs, case.n_microbatches), torch.tensor_split(ys, case.n_microbatches)):
            loss = loss_fn(_run(layers, x), y)
            (loss / count).backward()
            step_sum = loss.detach() if step_sum is None else step_sum + loss.detach()
        total = total + (step_sum / count).double()
    return _cpu(models.named_grads(layers)), total.cpu()


def eager(case, ref64, device="cpu", dtype=torch.float32):
    """The oracle's eager reference per parameter: of the straightforward computations in
    ``dtype`` (the dense model on the whole batch, the plain micro-batch loop), the one
    further from float64.  All add the same terms; which rounds worse varies by case.  They
    run on the CPU and, where the ranks ran on a GPU, there too: the GPU's float32 kernels
    add in their own order, and through a LayerNorm over two features (a width the GPT
    cases draw) that order moves a gradient by several times the CPU's error (seen on an
    H100: 4.7x the CPU eager's largest error on one element, a correct pipeline)."""
    devices = ["cpu"] + (["cuda"] if str(device).startswith("cuda") else [])
    runs = [run(case, dtype, dev) for dev in devices for run in (dense, microbatched)]
    loss64 = dense(case, torch.float64)[1]
    return farthest(ref64, [grads for grads, _ in runs]), farthest(loss64, [loss for _, loss in runs])
