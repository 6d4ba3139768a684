"""The uneven-inputs rule in one process (impl/data/join.py states it).

Step t's gradient is the sum of the local gradients of the ranks that still have a
batch at step t, divided by the initial world size W; SGD steps with it for
max(batches) steps.  Run in float64 (the oracle's reference) and float32 (its eager
yardstick).
"""

from __future__ import annotations

import torch

from conformance.laws.sampler import join_model


def uneven_rule(case, dtype, magnitudes: dict | None = None) -> dict[str, torch.Tensor]:
    """The parameters after the rule's steps.  ``magnitudes``, if given, receives per
    parameter |p_0| + sum over steps of lr * sum over ranks |g| / W: the size of the terms
    each final value sums, the oracle's rounding scale (the result alone can be far smaller
    where updates cancel)."""
    model = join_model.build(case, dtype)
    params = dict(model.named_parameters())
    w = case.world_size
    if magnitudes is not None:
        magnitudes.update({n: p.detach().abs().double() for n, p in params.items()})
    for step in range(max(case.batches, default=0)):
        total = {n: torch.zeros_like(p) for n, p in params.items()}
        size = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
        for rank in range(w):
            if case.batches[rank] <= step:
                continue
            model.zero_grad(set_to_none=True)
            x, y = join_model.batch(case, rank, step, dtype)
            join_model.loss_fn(model(x), y).backward()
            for n, p in params.items():
                total[n] += p.grad
                size[n] += p.grad.abs().double()
        with torch.no_grad():
            for n, p in params.items():
                p -= case.lr * (total[n] / w)
                if magnitudes is not None:
                    magnitudes[n] += case.lr * size[n] / w
    return {n: p.detach().clone() for n, p in params.items()}
