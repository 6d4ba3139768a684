"""Module-level functions run on every rank of a pool (``conformance.harness.run_on_ranks``).

Each loads the target from its spec, rebuilds the dense module and inputs of the case
from its seed (the same on every rank), builds the tensor-parallel module through the
target's factory with the default group, runs forward and backward, and returns what the
parent compares: outputs as this rank holds them, input gradients, and the dense view of
the parameter gradients from ``tensor_parallel_gather_full_grads``.

``subgroup_on_rank`` runs the same functions on a process group of some of the ranks
(``SubgroupCase.members``): there ``ctx`` is a ``Place`` whose rank and size are the
group's, and the factories get the group.  The other ranks take no part.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from conformance.target import load_target

from . import model as build
from .collectives import observe


@dataclass(frozen=True)
class Place:
    """Where a rank function runs inside a subgroup: the group rank and size, the device and
    the group (the harness's own context has no ``group``: the default group)."""

    rank: int
    world_size: int
    device: object
    group: object = None


def _group(ctx):
    return getattr(ctx, "group", None)


def _shard(n: int, rank: int, world: int) -> slice:
    size = -(-n // world)
    start = min(rank * size, n)
    return slice(start, min(start + size, n))


def _grads(target, module):
    return _plain(target.call("tensor_parallel_gather_full_grads", module))


def _plain(obj):
    """Plain tensors, read as a user reads them.  A tensor subclass (torch's DTensor layers
    leave an AsyncCollectiveTensor in an input's .grad: an all-gather still in flight, waited
    for by the first operation on it) is copied through an operation, which waits; sent to
    the parent as it is, its storage could be read before the all-gather has filled it."""
    if isinstance(obj, torch.Tensor):
        return obj if type(obj) is torch.Tensor else obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


def column_on_rank(ctx, spec, case):
    t = load_target(spec)
    lin = build.linear(case).to(ctx.device)
    x, dy = (a.to(ctx.device) for a in build.linear_inputs(case))
    tp = t.call("get_column_parallel_linear", lin, _group(ctx), gather_output=case.flag)
    x.requires_grad_(True)
    y = tp(x)
    local_dy = dy if case.flag else dy[..., _shard(case.out_features, ctx.rank, ctx.world_size)]
    if y.shape[-1] != local_dy.shape[-1]:
        s = _shard(case.out_features, ctx.rank, ctx.world_size)
        raise AssertionError(f"rank {ctx.rank} of {ctx.world_size} returned {y.shape[-1]} output features; "
                             + ("gather_output asks for all " if case.flag else f"its shard [{s.start}, {s.stop}) of the chunk layout has ")
                             + f"{local_dy.shape[-1]}")
    (y * local_dy).sum().backward()
    return _plain({"y": y, "dx": x.grad, "grads": _grads(t, tp)})


def row_on_rank(ctx, spec, case):
    t = load_target(spec)
    lin = build.linear(case).to(ctx.device)
    x, dy = (a.to(ctx.device) for a in build.linear_inputs(case))
    tp = t.call("get_row_parallel_linear", lin, _group(ctx), input_is_parallel=case.flag)
    if case.flag:
        x = x[..., _shard(case.in_features, ctx.rank, ctx.world_size)].contiguous()
    x.requires_grad_(True)
    y = tp(x)
    (y * dy).sum().backward()
    return _plain({"y": y, "dx": x.grad, "grads": _grads(t, tp)})


def embedding_on_rank(ctx, spec, case):
    t = load_target(spec)
    emb = build.embedding(case).to(ctx.device)
    ids, dy = (a.to(ctx.device) for a in build.embedding_inputs(case))
    tp = t.call("get_vocab_parallel_embedding", emb, _group(ctx))
    y = tp(ids)
    (y * dy).sum().backward()
    return _plain({"y": y, "grads": _grads(t, tp)})


def cross_entropy_on_rank(ctx, spec, case):
    t = load_target(spec)
    logits, targets, dy = (a.to(ctx.device) for a in build.cross_entropy_inputs(case))
    local = logits[..., _shard(case.vocab_size, ctx.rank, ctx.world_size)].contiguous().requires_grad_(True)
    loss = t.call("vocab_parallel_cross_entropy", local, targets, _group(ctx), vocab_size=case.vocab_size,
                  ignore_index=case.ignore_index, reduction=case.reduction)
    (loss * dy).sum().backward() if case.reduction == "none" else loss.backward()
    return _plain({"loss": loss, "grad": local.grad})


def _block_kwargs(case):
    return {"sequence_parallel": True} if case.sequence_parallel else {}


def block_on_rank(ctx, spec, case):
    t = load_target(spec)
    blk = build.block(case).to(ctx.device)
    x, dy = (a.to(ctx.device) for a in build.block_inputs(case))
    tp = t.call("get_tensor_parallel_block", blk, _group(ctx), **_block_kwargs(case))
    if case.sequence_parallel:
        s = _shard(case.seq, ctx.rank, ctx.world_size)
        x, dy = x[:, s].contiguous(), dy[:, s].contiguous()
    x.requires_grad_(True)
    y = tp(x)
    (y * dy).sum().backward()
    return _plain({"y": y, "dx": x.grad, "grads": _grads(t, tp)})


def gpt_on_rank(ctx, spec, case):
    t = load_target(spec)
    dense = build.gpt(case).to(ctx.device)
    tp = t.call("get_tensor_parallel_gpt", dense, _group(ctx), **_block_kwargs(case))
    opt = build.optimizer(case.optimizer, tp.parameters())
    ce = t.factory("vocab_parallel_cross_entropy")
    losses, grads, before = [], [], []
    for ids, tgt in build.gpt_batches(case):
        opt.zero_grad()
        before.append(t.call("tensor_parallel_gather_full_params", tp))
        loss = ce(tp(ids.to(ctx.device)), tgt.to(ctx.device), _group(ctx), vocab_size=case.vocab_size, ignore_index=case.ignore_index)
        loss.backward()
        grads.append(_grads(t, tp))
        losses.append(loss.detach().reshape(()))
        opt.step()
    return _plain({"losses": torch.stack(losses), "grads": grads, "before": before,
                   "params": t.call("tensor_parallel_gather_full_params", tp)})


def mlp_collectives_on_rank(ctx, spec, case):
    """Collectives of the MLP made of the target's column- then row-parallel linear, and of
    the target's block: forward and backward counted apart."""
    t = load_target(spec)
    blk = build.block(case).to(ctx.device)
    x, dy = (a.to(ctx.device) for a in build.block_inputs(case))
    # each factory gets its own copy: a factory may shard the module it is given in place
    up = t.call("get_column_parallel_linear", copy.deepcopy(blk.mlp.up), None)
    down = t.call("get_row_parallel_linear", copy.deepcopy(blk.mlp.down), None)
    tp_block = t.call("get_tensor_parallel_block", copy.deepcopy(blk), None)
    out = {}
    for name, fn in (("mlp", lambda v: down(F.gelu(up(v)))), ("block", tp_block)):
        xi = x.clone().requires_grad_(True)
        with observe() as fwd:
            y = fn(xi)
        loss = (y * dy).sum()
        with observe() as bwd:
            loss.backward()
        out[name] = {"forward": fwd.as_dict(), "backward": bwd.as_dict()}
    return out


def sp_collectives_on_rank(ctx, spec, case):
    """Collectives of the target's sequence-parallel block, forward and backward."""
    t = load_target(spec)
    blk = build.block(case).to(ctx.device)
    x, dy = (a.to(ctx.device) for a in build.block_inputs(case))
    tp = t.call("get_tensor_parallel_block", blk, None, sequence_parallel=True)
    s = _shard(case.seq, ctx.rank, ctx.world_size)
    xi = x[:, s].contiguous().requires_grad_(True)
    with observe() as fwd:
        y = tp(xi)
    loss = (y * dy[:, s]).sum()
    with observe() as bwd:
        loss.backward()
    return {"forward": fwd.as_dict(), "backward": bwd.as_dict()}


ON_RANK = {"column": column_on_rank, "row": row_on_rank, "embedding": embedding_on_rank,
           "cross_entropy": cross_entropy_on_rank, "block": block_on_rank, "gpt": gpt_on_rank}


def subgroup_on_rank(ctx, spec, case):
    """The inner case on the process group of ``case.members`` (every rank of the world makes
    it: ``new_group`` is collective), at the member's group rank; None on the other ranks."""
    group = dist.new_group(list(case.members))
    if ctx.rank not in case.members:
        return None
    place = Place(case.members.index(ctx.rank), len(case.members), ctx.device, group)
    return ON_RANK[case.kind](place, spec, case.inner)
