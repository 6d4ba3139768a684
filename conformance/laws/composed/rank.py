"""Module-level functions run on every rank of the harness's pool."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from conformance.target import load_target

from . import reference as ref

MESH_DIMS = ("pp", "dp", "cp", "tp")
OBSERVED = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single", "all_gather_into_tensor", "all_gather_single", "broadcast", "all_gather", "reduce_scatter")


@contextlib.contextmanager
def observe_collectives(log: list):
    """Record (collective, sorted global ranks of its group, numel) of every call of the
    collectives in OBSERVED through ``torch.distributed``'s module attributes."""
    saved = {}

    def wrap(name, fn):
        def recorded(*args, **kwargs):
            group = kwargs.get("group")
            ranks = tuple(range(dist.get_world_size())) if group is None or group is dist.group.WORLD else tuple(sorted(dist.get_process_group_ranks(group)))
            t = args[0] if args else kwargs.get("tensor")
            numel = t.numel() if isinstance(t, torch.Tensor) else 0
            log.append((name, ranks, numel))
            return fn(*args, **kwargs)
        return recorded

    for name in OBSERVED:
        fn = getattr(dist, name, None)
        if fn is not None:
            saved[name] = fn
            setattr(dist, name, wrap(name, fn))
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def mesh_on_rank(ctx, spec, sizes, order):
    t = load_target(spec)
    mesh = t.call("get_parallel_mesh", dict(sizes), tuple(order))
    return {d: {"ranks": list(mesh.ranks(d)), "rank": int(mesh.rank(d)), "size": int(mesh.size(d)),
                "group_ranks": sorted(dist.get_process_group_ranks(mesh.group(d))) if mesh.size(d) > 1 else [ctx.rank]}
            for d in order}


def step_on_rank(ctx, spec, case):
    t = load_target(spec)
    mesh = t.call("get_parallel_mesh", case.dims, case.order)
    groups = {d: list(mesh.ranks(d)) for d in case.order}
    model = ref.model(case).to(ctx.device)
    ids, tgt = ref.batch(case)
    log = []
    with observe_collectives(log):
        res = t.call("composed_train_step", model, mesh, ids.to(ctx.device), tgt.to(ctx.device), lr=case.lr,
                     data_parallel=case.data_parallel, n_microbatches=case.n_microbatches, ignore_index=case.ignore_index)
    return {"loss": res.loss, "grads": res.grads, "params": res.params, "groups": groups, "collectives": log}
