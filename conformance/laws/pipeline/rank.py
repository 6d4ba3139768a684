"""Rank side of the pipeline laws (module-level functions run by the distributed harness).

Every rank builds the case's whole model from its seed (identical everywhere), keeps the
layers of its own stage (``partition``: consecutive, as even as possible), and runs the
target's ``pipeline_train_step`` over them.  It returns the gradients of its stage's
parameters under their global names, and the losses the target returned.

A case with ``members`` runs the pipeline on the process group of those global ranks
(every rank of the world makes the group; ``new_group`` is collective): stage i on the
member of group rank i, the group passed to the target; the other ranks return None.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from conformance.laws.p2p_hang import P2PLog
from conformance.laws.pipeline import model as models
from conformance.target import load_target


def stage_bounds(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    base, extra = divmod(n_layers, n_stages)
    bounds, start = [], 0
    for s in range(n_stages):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _stage_of(ctx, case):
    """(stage, group) of this rank; stage None for a rank outside the case's group."""
    if not case.members:
        return ctx.rank, {}
    group = dist.new_group(list(case.members))
    return (case.members.index(ctx.rank) if ctx.rank in case.members else None), {"group": group}


def rank_pipeline_grads(ctx, target_spec: str, case, schedule_names=("afab", "1f1b")):
    """Per schedule: {"grads": {global name: grad} of this rank's stage, "losses": [...]}."""
    stage_index, group = _stage_of(ctx, case)
    if stage_index is None:
        return None
    target = load_target(target_spec)
    step = target.factory("pipeline_train_step")
    start, stop = stage_bounds(case.n_layers, case.n_stages)[stage_index]
    results = {}
    for name in schedule_names:
        layers, inputs, targets, loss_fn, count = models.build(case, getattr(torch, case.dtype), ctx.device)
        stage = nn.Sequential(*layers[start:stop])
        first, last = stage_index == 0, stage_index == case.n_stages - 1
        losses = []
        chunks = list(zip(torch.tensor_split(inputs, case.steps), torch.tensor_split(targets, case.steps)))
        for x, y in chunks:  # gradient accumulation: every step normalised by the global count
            loss = step(stage, name, x if first else None, y if last else None, loss_fn, case.n_microbatches, normalizer=count,
                        **group)
            losses.append(None if loss is None else torch.as_tensor(loss).detach().double().cpu())
        grads = {f"{start + i}.{n}": (p.grad.detach().clone() if p.grad is not None else None) for i, layer in enumerate(layers[start:stop]) for n, p in layer.named_parameters()}
        results[name] = {"grads": grads, "losses": losses}
    return results


def rank_pipeline_units(ctx, target_spec: str, case, schedule_names=("afab", "1f1b")):
    """Per schedule: this rank's point-to-point calls in one pipeline step, as NCCL would
    run them (``conformance.laws.p2p_hang``: one unit per unbatched call or batch); none
    on a rank outside the case's group."""
    stage_index, group = _stage_of(ctx, case)
    if stage_index is None:
        return {name: [] for name in schedule_names}
    target = load_target(target_spec)
    step = target.factory("pipeline_train_step")
    start, stop = stage_bounds(case.n_layers, case.n_stages)[stage_index]
    first, last = stage_index == 0, stage_index == case.n_stages - 1
    units = {}
    for name in schedule_names:
        layers, inputs, targets, loss_fn, count = models.build(case, getattr(torch, case.dtype), ctx.device)
        stage = nn.Sequential(*layers[start:stop])
        with P2PLog() as probe:
            step(stage, name, inputs if first else None, targets if last else None, loss_fn, case.n_microbatches,
                 normalizer=count, **group)
        units[name] = probe.units
    return units
