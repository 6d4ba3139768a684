"""One process, the same data, the same reduction order as the ranks: the reference.

Per step, each rank's gradients are computed on that rank's slice of the batch (its
micro-batches accumulated in ``.grad`` as autograd does), summed in rank order and divided
by W, exactly what an all-reduce (sum) then a division does on W <= 2 ranks, in any
order.  Mixed precision: the Linear and Embedding weights are cast to the compute dtype
for forward and backward (their gradients come back cast to fp32), everything else stays
fp32: the casts CS336's own FSDP test applies to its single-process model.  The float64
twin runs the same steps in float64 with no casts.

The fp32 reference runs on the ranks' device (``device``): it is also the oracle's eager
yardstick, which must be the straightforward computation on the same device (a GPU's
AdamW and matmuls round differently from the CPU's).  The float64 twin stays on the CPU.
Snapshots come back on the CPU.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from . import model as models
from .strategies import FSDPCase, make_optimizer


def trajectory(case: FSDPCase, dtype=torch.float32, casts: bool = True, blocks: models.Blocks = models.SUITE_BLOCKS,
               device="cpu") -> list[dict[str, torch.Tensor]]:
    """Parameters by name (every alias) before the first step and after every step."""
    model = models.build(case, device, dtype, blocks)
    matrices = models.matrix_names(model, blocks)
    optimizer = make_optimizer(case, model.parameters())
    cast = case.compute_dtype if (casts and dtype == torch.float32) else None
    named = dict(model.named_parameters())  # unique names; functional_call ties the aliases

    def forward(ids):
        if cast is None:
            return model(ids)
        params = {n: (p.to(cast) if n in matrices else p) for n, p in named.items()}
        return functional_call(model, params, (ids,))

    def snapshot():
        return {n: p.detach().cpu().clone() for n, p in model.named_parameters(remove_duplicate=False)}

    out = [snapshot()]
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(case.steps):
        total = None
        for rank in range(case.world_size):
            for p in params:
                p.grad = None
            for micro in range(case.micro):
                ids, labels = models.batch(case, step, micro, device)
                sl = models.rank_slice(case, rank)
                (models.loss_of(forward(ids[sl]), labels[sl]) / case.micro).backward()
            grads = [None if p.grad is None else p.grad.clone() for p in params]
            if total is None:
                total = grads
            else:
                total = [a if b is None else (b.clone() if a is None else a + b) for a, b in zip(total, grads)]
        for p, g in zip(params, total):
            p.grad = None if g is None else g / case.world_size
        optimizer.step()
        out.append(snapshot())
    return out
