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


def _run(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def dense(case, dtype=torch.float64):
    layers, inputs, targets, loss_fn, count = models.build(case, dtype)
    loss = loss_fn(_run(layers, inputs), targets) / count
    loss.backward()
    return models.named_grads(layers), loss.detach().double()


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


def microbatched(case, dtype=torch.float32):
    """The plain loop a pipeline computes, in one process: for each accumulation step and
    each of its ``tensor_split`` micro-batches, backward of (summed loss) / count."""
    layers, inputs, targets, loss_fn, count = models.build(case, dtype)
    total = 0.0
    for xs, ys in zip(torch.tensor_split(inputs, case.steps), torch.tensor_split(targets, case.steps)):
        step_sum = None
        for x, y in zip(torch.tensor_split(xs, case.n_microbatches), torch.tensor_split(ys, case.n_microbatches)):
            loss = loss_fn(_run(layers, x), y)
            (loss / count).backward()
            step_sum = loss.detach() if step_sum is None else step_sum + loss.detach()
        total = total + (step_sum / count).double()
    return models.named_grads(layers), total


def eager(case, ref64):
    """The oracle's eager reference per parameter: of the two straightforward float32
    computations (the dense model on the whole batch, the plain micro-batch loop), the one
    further from float64.  Both add the same terms; which rounds worse varies by case."""
    dense32, loss32 = dense(case, torch.float32)
    looped, looped_loss = microbatched(case, torch.float32)
    worse = {}
    for name, ref in ref64.items():
        errors = [(d - ref).abs().max() for d in (dense32[name].double(), looped[name].double())]
        worse[name] = dense32[name] if errors[0] >= errors[1] else looped[name]
    loss64 = dense(case, torch.float64)[1]
    worse_loss = loss32 if (loss32 - loss64).abs() >= (looped_loss - loss64).abs() else looped_loss
    return worse, worse_loss
