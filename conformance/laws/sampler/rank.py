"""Rank side of the uneven-inputs law (module-level functions run by the distributed harness).

Every rank wraps the same model with impl's ``get_ddp`` (the 2026 DDP), enters the
target's ``ddp_join`` and runs ITS OWN number of SGD steps; it returns its final
parameters.
"""

from __future__ import annotations

import torch

from conformance.laws.sampler import join_model
from conformance.target import load_target


def rank_uneven_training(ctx, subject: str, case):
    import impl

    join = load_target(subject).factory("ddp_join")
    module = join_model.build(case).to(ctx.device)
    model = impl.get_ddp(module)
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    with join(model):
        for step in range(case.batches[ctx.rank]):
            x, y = (t.to(ctx.device) for t in join_model.batch(case, ctx.rank, step))
            opt.zero_grad(set_to_none=True)
            join_model.loss_fn(model(x), y).backward()
            model.finish_gradient_synchronization()
            opt.step()
    return {name: p.detach().clone() for name, p in module.named_parameters()}
