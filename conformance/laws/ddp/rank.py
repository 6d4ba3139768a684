"""Rank-side case functions, run inside the harness's rank processes."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from conformance.laws.ddp.flavours import FlavourAPI, flavour_api
from conformance.target import load_target
from conformance.verdicts import NotOffered

from .spy import LOG, install_collective_spy
from .model import ModelSpec, build_model, rank_seed
from .cases import TrainingCase, autocast_for, local_rows, make_optimizer, row_loss_sum, step_data


def _observe_gradients(model: nn.Module) -> None:
    """Log each gradient as it becomes final; registered BEFORE the wrapper's own hooks,
    so for one parameter our event precedes anything the wrapper launches from it."""
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda _p, _name=name: LOG.record("grad", _name))


def _snapshot(model: nn.Module) -> dict:
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
    }


def _grads(model: nn.Module) -> dict:
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def train_on_rank(ctx, target_spec: str, flavour: str, case: TrainingCase) -> dict:
    """Wrap, then run the case's steps with the flavour's call sequence:

        on_train_batch_start -> [no_sync: forward, backward]* -> forward -> backward
        -> on_after_backward -> (read gradients) -> optimizer.step
    """
    install_collective_spy()
    try:
        return _train_steps(ctx, flavour_api(load_target(target_spec), flavour), case)
    except NotOffered:  # a factory or hook raised NotImplementedError: the harness reports the verdict
        LOG.stop()
        raise


def _train_steps(ctx, api: FlavourAPI, case: TrainingCase) -> dict:
    flavour = api.name
    torch.manual_seed(case.seed)
    model = build_model(case.model, rank_seed(case.seed, ctx.rank)).to(ctx.device)
    _observe_gradients(model)
    wrapped = api.wrap(model, case.bucket_size_mb)
    needs_no_sync = any(len(p.micro_splits) > 1 for p in case.steps)
    if needs_no_sync and not callable(getattr(wrapped, "no_sync", None)):
        raise NotOffered(f"the {flavour} wrapper ({type(wrapped).__name__}) has no no_sync()")
    after_wrap = _snapshot(model)
    optimizer = make_optimizer(case.optimizer, model.parameters(), case.lr)
    grads, events, before = [], [], []
    for s, plan in enumerate(case.steps):
        x, y, rows = (t.to(ctx.device) for t in step_data(case, s))
        scale = case.world_size / plan.rows
        optimizer.zero_grad(set_to_none=True)
        before.append({n: p.detach().clone() for n, p in model.named_parameters()})
        LOG.start()
        api.start_batch(wrapped, optimizer)
        last = len(plan.micro_splits) - 1
        for m in range(len(plan.micro_splits)):
            mine = local_rows(plan, m, ctx.rank)
            with (wrapped.no_sync() if m < last else contextlib.nullcontext()):
                with autocast_for(case.precision, ctx.device):
                    out = wrapped(x[mine], rows[mine])
                loss = scale * row_loss_sum(out, y[mine])
                LOG.record("backward-start", m, m == last)
                loss.backward()
                LOG.record("backward-end", m, m == last)
        api.after_backward(wrapped, optimizer)
        LOG.record("synchronised")
        events.append(LOG.stop())
        grads.append(_grads(model))
        optimizer.step()
    return {"after_wrap": after_wrap, "before": before, "grads": grads, "final": _snapshot(model), "events": events}


def probe_on_rank(ctx, target_spec: str, flavour: str) -> dict:
    """Is the flavour offered, and does its wrapper have no_sync() and .buckets?"""
    api = flavour_api(load_target(target_spec), flavour)
    wrapped = api.wrap(build_model(ModelSpec(2, (3,), 2), 0).to(ctx.device), 1e-6)
    return {"no_sync": callable(getattr(wrapped, "no_sync", None)), "buckets": getattr(wrapped, "buckets", None) is not None}


def layout_on_rank(ctx, target_spec: str, flavour: str, spec: ModelSpec, bucket_size_mb, seed: int) -> dict:
    """Wrap a model and report the wrapper's ``.buckets`` next to the module's parameters."""
    api = flavour_api(load_target(target_spec), flavour)
    model = build_model(spec, seed).to(ctx.device)
    wrapped = api.wrap(model, bucket_size_mb)
    buckets = getattr(wrapped, "buckets", None)
    if buckets is None:
        raise NotOffered(f"the {flavour} wrapper ({type(wrapped).__name__}) does not expose .buckets")
    params = [(n, p.requires_grad, p.numel() * p.element_size()) for n, p in model.named_parameters()]
    try:
        layout = readable_layout(buckets, model)
    except TypeError as exc:  # CS336 defines no bucket introspection: another shape is not a wrong one
        raise NotOffered(f"bucket layout: the {flavour} wrapper's .buckets {exc}") from None
    return {"buckets": layout, "params": params}


def readable_layout(buckets, model) -> list[list]:
    """``.buckets`` as lists of parameter names or indices; a parameter object becomes its name.

    TypeError when the buckets cannot be read that way (a bucket that is not iterable, an
    entry that is neither a name, an index nor one of the module's parameters).
    """
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    layout = []
    for bucket in buckets:
        try:
            entries = list(bucket)
        except TypeError:
            raise TypeError(f"holds {type(bucket).__name__} objects, not lists of parameter names or parameters") from None
        for i, e in enumerate(entries):
            if isinstance(e, torch.Tensor):
                if id(e) not in names:
                    raise TypeError(f"holds a tensor of shape {tuple(e.shape)} that is not one of the module's parameters")
                entries[i] = names[id(e)]
            elif not isinstance(e, (str, int)):
                raise TypeError(f"holds {type(e).__name__} entries, not parameter names, indices or parameters")
        layout.append(entries)
    return layout
