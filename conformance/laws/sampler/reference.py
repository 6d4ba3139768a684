"""The uneven-inputs rule in one process (impl/data/join.py states it).

Step t's gradient is the sum of the local gradients of the ranks that still have a
batch at step t, divided by the initial world size W; SGD steps with it for
max(batches) steps.  Run in float64 (the oracle's reference) and float32 (its eager
yardstick).
"""

from __future__ import annotations

import torch

from conformance.laws.sampler import join_model


def uneven_rule(case, dtype) -> dict[str, torch.Tensor]:
    model = join_model.build(case, dtype)
    params = dict(model.named_parameters())
    w = case.world_size
    for step in range(max(case.batches, default=0)):
        total = {n: torch.zeros_like(p) for n, p in params.items()}
        for rank in range(w):
            if case.batches[rank] <= step:
                continue
            model.zero_grad(set_to_none=True)
            x, y = join_model.batch(case, rank, step, dtype)
            join_model.loss_fn(model(x), y).backward()
            for n, p in params.items():
                total[n] += p.grad
        with torch.no_grad():
            for n, p in params.items():
                p -= case.lr * (total[n] / w)
    return {n: p.detach().clone() for n, p in params.items()}
