"""The module-level functions run on every rank (``conformance.harness.run_on_ranks``)."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist

from conformance.target import load_target

from . import memory, model as models, reference, spy
from .strategies import FSDPCase, make_optimizer


def _wrap(target, case: FSDPCase, module):
    if case.strategy is None:
        return target.call("get_fsdp", module, compute_dtype=case.compute_dtype)
    return target.call("get_fsdp_strategy", module, case.strategy, compute_dtype=case.compute_dtype)


def _owner_is_matrix(fsdp_model, name: str, blocks: models.Blocks) -> bool:
    parts = name.rsplit(".", 1)
    mod = fsdp_model.module.get_submodule(parts[0]) if len(parts) == 2 else fsdp_model.module
    return isinstance(mod, blocks.matrices)


def _attr_holds_full(module, name: str, numel: int) -> bool:
    """Does the attribute at ``name`` (module path + attribute) hold a full parameter's storage?"""
    owner, _, attr = name.rpartition(".")
    mod = module.get_submodule(owner) if owner else module
    t = getattr(mod, attr, None)
    if not isinstance(t, torch.Tensor):
        return False
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        t = local
    return t.numel() >= numel and memory.storage_bytes(t) >= numel * t.element_size()


def _mark_layers(fsdp_model, matrices: list[str], saved=None) -> list:
    """A forward pre-hook on whatever module now sits where each matrix's module was (a
    wrapper may have swapped it for its own), registered after the wrapper's own hooks:
    it marks the spy's timeline when that layer's forward begins, and notes on ``saved``
    (a ``memory.SavedTensors``) whether the target's own saved-tensor hooks hide the layer's."""
    def mark(name):
        spy.SPY.mark(name)
        if isinstance(saved, memory.SavedTensors):
            saved.note_if_shadowed()

    handles = []
    for name in matrices:
        owner = name.rpartition(".")[0]
        try:
            module = fsdp_model.module.get_submodule(owner)
        except AttributeError:
            continue
        handles.append(module.register_forward_pre_hook(lambda mod, args, _name=name: mark(_name)))
    return handles


def _unwrapped_autograd_bytes(plain, case: FSDPCase, ids, labels) -> int:
    """What autograd alone holds after the unwrapped model's forward on the same rows, in
    the compute dtype: the activations a correct FSDP also saves (its parameters, held by
    the model, are left out)."""
    model = plain if case.compute_dtype in (None, torch.float32) else copy.deepcopy(plain).to(case.compute_dtype)
    with memory.SavedTensors() as saved:
        loss = models.loss_of(model(ids), labels)
    held = saved.bytes_held(memory.reachable_storages(model))
    del loss
    return held


def train_on_rank(ctx, target_spec: str, case: FSDPCase, observe: bool = True) -> dict:
    """Train ``case.steps`` steps on this rank's slice of every batch; report what a law needs."""
    torch.use_deterministic_algorithms(True)
    spy.install()
    spy.SPY.reset(case.delay_s if ctx.rank == case.delay_rank else 0.0)
    target = load_target(target_spec)
    device = ctx.device
    blocks = models.course_blocks() or models.SUITE_BLOCKS
    out = {"steps": [], "rank": ctx.rank, "blocks": blocks.source}
    if blocks is not models.SUITE_BLOCKS and ctx.rank == 0:
        # the reference must run the same classes; before the target's FSDP touches anything
        out["reference"] = (reference.trajectory(case, torch.float32, blocks=blocks, device=device),
                            reference.trajectory(case, torch.float64, casts=False, blocks=blocks))
    base = models.build(case, device, blocks=blocks)
    plain = copy.deepcopy(base)  # unwrapped: what autograd alone holds after its forward is activations
    matrices = models.matrix_names(base, blocks)
    numels = {n: p.numel() for n, p in base.named_parameters(remove_duplicate=False)}
    tied_names = {n for n, p in base.named_parameters(remove_duplicate=False) if p is base.embedding.weight} if case.tied else set()
    spy.SPY.phase = "wrap"
    fsdp_model = _wrap(target, case, base)
    on_after_backward = target.factory("fsdp_on_after_backward")
    gather = target.factory("fsdp_gather_full_params")
    no_sync = target.factory("fsdp_no_sync") if case.micro > 1 else None
    optimizer = make_optimizer(case, fsdp_model.parameters())
    observed_from = 0
    for step in range(case.steps):
        rec = {}
        optimizer.zero_grad(set_to_none=True)
        for micro in range(case.micro):
            ids, labels = models.batch(case, step, micro, device)
            sl = models.rank_slice(case, ctx.rank)
            last = micro == case.micro - 1
            ctx_mgr = contextlib.nullcontext() if last else no_sync(fsdp_model)
            with ctx_mgr:
                spy.SPY.phase = "forward"
                marks = []
                saved = memory.SavedTensors() if observe and last else contextlib.nullcontext()
                if observe and step == case.steps - 1 and micro == 0:  # the last step's forward: any order learnt
                    marks, observed_from = _mark_layers(fsdp_model, matrices, saved), len(spy.SPY.timeline)
                with saved:
                    loss = models.loss_of(fsdp_model(ids[sl]), labels[sl]) / case.micro
                for handle in marks:
                    handle.remove()
                if observe and last:
                    rec["full_attrs_after_forward"] = sorted(
                        n for n in matrices if n not in tied_names and _attr_holds_full(fsdp_model.module, n, numels[n])
                    )
                    rec["bytes_after_forward"] = memory.reachable_bytes(fsdp_model, optimizer)
                    rec["autograd_bytes_after_forward"] = saved.bytes_held(memory.reachable_storages(fsdp_model, optimizer))
                    rec["saved_tensors_hidden"] = saved.shadowed
                    rec["unwrapped_autograd_bytes"] = _unwrapped_autograd_bytes(plain, case, ids[sl], labels[sl])
                spy.SPY.phase = "backward"
                loss.backward()
                if observe and last:  # every unit's backward has run: only the root may still be gathered
                    rec["bytes_after_loss_backward"] = memory.reachable_bytes(fsdp_model, optimizer)
                    rec["gathered_bytes_after_loss_backward"] = memory.gathered_parameter_bytes(fsdp_model, optimizer)
                    rec["full_attrs_after_loss_backward"] = sorted(
                        n for n in matrices if n not in tied_names and _attr_holds_full(fsdp_model.module, n, numels[n])
                    )
        spy.SPY.phase = "after_backward"
        on_after_backward(fsdp_model, optimizer)
        spy.SPY.phase = "step"
        if observe:
            rec["bytes_after_backward"] = memory.reachable_bytes(fsdp_model, optimizer)
            rec["full_attrs_after_backward"] = sorted(n for n in matrices if _attr_holds_full(fsdp_model.module, n, numels[n]))
            rec["params"] = [
                (tuple(p.shape), str(p.dtype), None if p.grad is None else (tuple(p.grad.shape), str(p.grad.dtype)), p.requires_grad)
                for p in fsdp_model.parameters()
            ]
            rec["module_params"] = [
                (n, tuple(p.shape), str(p.dtype), None if p.grad is None else (tuple(p.grad.shape), str(p.grad.dtype)))
                for n, p in fsdp_model.module.named_parameters()
                if p.requires_grad
            ]
            rec["replicated_grads"] = {
                n: p.grad.detach().clone() for n, p in fsdp_model.module.named_parameters() if p.requires_grad and p.grad is not None and not _owner_is_matrix(fsdp_model, n, blocks)
            }
            replicated_ids = {id(p) for n, p in fsdp_model.module.named_parameters() if not _owner_is_matrix(fsdp_model, n, blocks)}
            shards = [memory._local(p.detach()).reshape(-1) for p in fsdp_model.parameters() if p.requires_grad and id(p) not in replicated_ids]
            rec["local_shard"] = torch.cat(shards).float() if shards else torch.zeros(0)
        optimizer.step()
        spy.SPY.phase = "gather"
        full = gather(fsdp_model)
        rec["full"] = {k: v.detach().clone() for k, v in full.items()}
        if observe:
            rec["bytes_after_step"] = memory.reachable_bytes(fsdp_model, optimizer)
        out["steps"].append(rec)
    if case.eval_forward:  # an evaluation forward: no autograd, so no backward will free what it gathers
        spy.SPY.phase = "no_grad_forward"
        with torch.no_grad():
            fsdp_model(models.batch(case, 0, 0, device)[0][models.rank_slice(case, ctx.rank)])
        out["full_attrs_after_no_grad_forward"] = sorted(
            n for n in matrices if n not in tied_names and _attr_holds_full(fsdp_model.module, n, numels[n])
        )
    out["collectives"] = list(spy.SPY.events)
    out["timeline"] = list(spy.SPY.timeline[observed_from:]) if observe else []
    spy.SPY.reset()
    return out
