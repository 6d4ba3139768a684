"""Rank side of the gradient-scaler laws (module-level functions run by the distributed harness).

``rank_scaled_training`` trains the case's model for ``case.steps`` steps through impl's
wrapper with the target's scaler and records, per step, what the laws judge: the scale,
the gradients as synchronised (scaled), after ``unscale_`` and after ``step``, what
``step`` returned, parameters, optimizer state and the learning rate of a StepLR
scheduler (driven ``if scaler.step(opt): scheduler.step()``) before and after, whether a
second ``unscale_`` raised, ``first_nonfinite_gradient``'s answer, and the clipping
results.  ``rank_parity`` runs the same steps with and without scaling.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from conformance.laws.grad_scaler import model as models
from conformance.target import load_target

DELAY_S = 0.05
VALUES = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def _clone_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _clone_grads(model):
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def _clone_state(opts):
    out = {}
    for o, opt in enumerate(opts):
        for i, (p, state) in enumerate(opt.state.items()):
            for k, v in state.items():
                out[f"{o}.{i}.{k}"] = v.detach().clone() if isinstance(v, torch.Tensor) else torch.tensor(float(v))
    return out


def _sharded(name: str) -> bool:
    return name.startswith("flat_shards.")


def _law_norm(model, device) -> float:
    """The global gradient 2-norm, computed by the law: shards summed over ranks, the rest once."""
    shard_sq = torch.zeros(1, dtype=torch.float64, device=device)
    rest_sq = 0.0
    for n, p in model.named_parameters():
        if p.grad is None:
            continue
        if _sharded(n):
            shard_sq += p.grad.double().pow(2).sum()
        else:
            rest_sq += float(p.grad.double().pow(2).sum())
    dist.all_reduce(shard_sq)
    return (float(shard_sq) + rest_sq) ** 0.5


def rank_scaled_training(ctx, subject: str, case, scaled: bool = True):
    target = load_target(subject)
    module = models.build(case).to(ctx.device)
    model = models.wrap(case, module)
    opts = models.optimizers(case, model.parameters())
    opt = opts[0]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = None
    if scaled:
        scaler = target.factory("get_distributed_grad_scaler")(
            init_scale=2.0**case.scale_exp, growth_factor=case.growth_factor, backoff_factor=case.backoff_factor,
            growth_interval=case.growth_interval)
    names = [n for n, _ in model.named_parameters()]
    owner = {n: next(k for k, o in enumerate(opts) for g in o.param_groups for q in g["params"] if q is p)
             for n, p in model.named_parameters()}
    records = []
    for step in range(case.steps):
        rec = {"params_before": _clone_params(model), "opt_before": _clone_state(opts), "lr_before": opt.param_groups[0]["lr"]}
        rec["scale"] = scaler.get_scale() if scaler else 1.0
        for o in opts:
            o.zero_grad(set_to_none=True)
        mine = [i for i in case.inject if i[0] == step and i[1] == ctx.rank]
        for micro in range(case.micro_batches):
            x, y = (t.to(ctx.device) for t in models.batch(case, ctx.rank, step, micro))
            for _, _, where, kind, index in mine:
                if where == "input" and index % case.micro_batches == micro:
                    x[0, index % case.width] = VALUES[kind]
            last = micro == case.micro_batches - 1
            with (contextlib.nullcontext() if last else model.no_sync()):
                loss = models.loss_fn(model(x), y, case)
                (scaler.scale(loss) if scaler else loss).backward()
        model.finish_gradient_synchronization()
        params = dict(model.named_parameters())
        rec["injected"] = []  # the parameter names given a non-finite gradient here, "input" for an input
        with torch.no_grad():
            for _, _, where, kind, index in mine:
                if where == "grad":
                    with_grad = [n for n in names if params[n].grad is not None and params[n].grad.numel()]
                    name = with_grad[index % len(with_grad)]
                    flat = params[name].grad.view(-1)
                    flat[(index * 7) % flat.numel()] = VALUES[kind]
                    rec["injected"].append(name)
                else:
                    rec["injected"].append("input")
        rec["names"], rec["owner"] = names, owner
        if case.find_first:
            rec["first_nonfinite"] = target.call("first_nonfinite_gradient", model)
        rec["scaled_grads"] = _clone_grads(model)
        if mine and case.delay_injected_ranks:
            time.sleep(DELAY_S)  # the others reach the agreement first: a flag read early is their own
        if scaler is not None and case.explicit_unscale:
            for o in opts:  # each optimizer once: a second optimizer's unscale_ is not a second unscale_
                scaler.unscale_(o)
            rec["unscaled_grads"] = _clone_grads(model)
            if case.second_unscale:
                try:
                    scaler.unscale_(opt)
                    rec["second_unscale"] = "returned"
                except RuntimeError:
                    rec["second_unscale"] = "RuntimeError"
            if case.clip_fraction:
                norm = _law_norm(model, ctx.device)
                max_norm = case.clip_fraction * norm
                rest = [p for n, p in model.named_parameters() if not _sharded(n)]
                shards = [p for n, p in model.named_parameters() if _sharded(n)]
                returned = scaler.clip_grad_norm_(rest, max_norm, sharded_parameters=shards)
                rec["clip"] = {"law_norm": norm, "max_norm": max_norm, "returned": float(returned),
                               "after": _clone_grads(model)}
        if scaler is not None:
            each = tuple(scaler.step(o) for o in opts)
        else:
            for o in opts:
                o.step()
            each = (True,) * len(opts)
        stepped = each[0] if len(opts) == 1 else each  # the scheduler follows the first optimizer
        rec["stepped"] = stepped
        rec["grads_after_step"] = _clone_grads(model)
        if each[0] is True:
            sched.step()
        if scaler is not None:
            scaler.update()
        rec["scale_after"] = scaler.get_scale() if scaler else 1.0
        rec["params_after"] = _clone_params(model)
        rec["opt_after"] = _clone_state(opts)
        rec["lr_after"] = opt.param_groups[0]["lr"]
        records.append(rec)
    return records


def rank_parity(ctx, subject: str, case):
    """Final parameters with the scaler and without any scaling, same steps and batches."""
    with_scaler = rank_scaled_training(ctx, subject, case, scaled=True)
    plain = rank_scaled_training(ctx, subject, case, scaled=False)
    return {"scaled": with_scaler[-1]["params_after"], "plain": plain[-1]["params_after"],
            "stepped": [r["stepped"] for r in with_scaler]}


def rank_scaler_on_subgroups(ctx, subject: str, case):
    """The scaler and ``first_nonfinite_gradient`` on two disjoint groups (even and odd
    ranks; every rank makes both, in the same order, as ``new_group`` requires), each rank
    passing its own group; gradients set directly, one of them non-finite on
    ``case.inject_rank``; one ``unscale_``, ``step`` and ``update``."""
    target = load_target(subject)
    groups = [dist.new_group(list(range(parity, ctx.world_size, 2))) for parity in (0, 1)]
    group = groups[ctx.rank % 2]
    torch.manual_seed(case.seed)
    model = torch.nn.Sequential(torch.nn.Linear(case.width, case.width), torch.nn.Linear(case.width, 1)).to(ctx.device)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.full_like(p, float(ctx.rank + 1))
    if ctx.rank == case.inject_rank:
        params[case.inject_param].grad.view(-1)[0] = VALUES[case.kind]
    first = target.call("first_nonfinite_gradient", model, group)
    scaler = target.factory("get_distributed_grad_scaler")(init_scale=2.0**case.scale_exp, growth_interval=1000, group=group)
    scaler.scale(torch.ones((), device=ctx.device))  # a loss is scaled before unscale_ (torch's scaler starts its state there)
    opt = torch.optim.SGD(params, lr=0.5)
    before = [p.detach().clone() for p in params]
    scaler.unscale_(opt)
    stepped = scaler.step(opt)
    scaler.update()
    changed = any(not torch.equal(b, p.detach()) for b, p in zip(before, params))
    return {"first": first, "stepped": stepped, "changed": changed, "scale": float(scaler.get_scale()),
            "names": [n for n, _ in model.named_parameters()]}
