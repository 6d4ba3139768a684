"""Module-level functions run on every rank of the harness's pool."""

from __future__ import annotations

import contextlib
import os

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
    groups["replicas"] = list(mesh.ranks(("dp", "cp")))
    model = ref.model(case).to(ctx.device)
    ids, tgt = ref.batch(case)
    log = []
    with observe_collectives(log):
        res = t.call("composed_train_step", model, mesh, ids.to(ctx.device), tgt.to(ctx.device), lr=case.lr,
                     data_parallel=case.data_parallel, n_microbatches=case.n_microbatches, ignore_index=case.ignore_index)
    return {"loss": res.loss, "grads": res.grads, "params": res.params, "groups": groups, "collectives": log}


def checked_step_on_rank(ctx, spec, case_fields: dict):
    """The parity law checked inside one rank (for launches without the pool, e.g.
    ``torchrun`` across hosts): run the composed step, compare this rank's gathered loss,
    gradients and parameters with one process on the whole batch (the oracle), and
    return a summary.  ``case_fields``: ``ComposedCase`` fields as JSON (sizes as pairs)."""
    from conformance.oracle import assert_close

    from .strategies import ComposedCase

    fields = dict(case_fields)
    fields["sizes"] = tuple(tuple(p) for p in fields["sizes"])
    if "order" in fields:
        fields["order"] = tuple(fields["order"])
    case = ComposedCase(**fields)
    if case.world != ctx.world_size:
        raise ValueError(f"the mesh {case.dims} needs {case.world} ranks, this launch has {ctx.world_size}")
    res = step_on_rank(ctx, spec, case)
    loss64, g64, p64 = ref.dense_step(case, ref.F64)
    loss32, g32, p32 = ref.dense_step(case, ref.F32)
    mags = ref.magnitudes(case)
    assert_close(f"rank {ctx.rank}: loss", res["loss"].reshape(()).cpu(), loss64.reshape(()), loss32.reshape(()))
    for name in g64:
        assert_close(f"rank {ctx.rank}: gradient of {name}", res["grads"][name].cpu(), g64[name], g32[name], magnitude=mags[name])
        assert_close(f"rank {ctx.rank}: parameter {name}", res["params"][name].cpu(), p64[name], p32[name],
                     magnitude=p64[name].abs() + case.lr * mags[name])
    reductions = sorted({(n, r) for n, r, _ in res["collectives"] if n == "all_reduce"})
    return {"host": os.environ.get("GROUP_RANK", "?"), "loss": float(res["loss"]), "dense_loss_f64": float(loss64),
            "groups": res["groups"], "parameters_checked": len(g64), "all_reduce_groups": [list(r) for _, r in reductions]}
