"""References of the gradient-scaler laws: the scale's state machine and the big-batch gradient."""

from __future__ import annotations

import torch

from conformance.laws.grad_scaler import model as models


def scale_sequence(init_scale: float, growth_interval: int, overflow: list[bool], growth=2.0, backoff=0.5) -> list[float]:
    """The scale after each update (torch.amp.GradScaler's rule)."""
    scale, tracker, out = init_scale, 0, []
    for bad in overflow:
        if bad:
            scale, tracker = scale * backoff, 0
        else:
            tracker += 1
            if tracker == growth_interval:
                scale, tracker = scale * growth, 0
        out.append(scale)
    return out


def big_batch_grads(case, step: int, dtype) -> dict[str, torch.Tensor]:
    """One process, the parameters at the start (step 0 only), every rank's micro-batches
    of ``step`` at once: the gradient of the global mean loss."""
    model = models.build(case, dtype)
    total = 0
    for rank in range(case.world_size):
        for micro in range(case.micro_batches):
            x, y = models.batch(case, rank, step, micro, dtype)
            total = total + ((model(x) - y) ** 2).sum()
    (total / (case.rows * case.micro_batches * case.world_size)).backward()
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
