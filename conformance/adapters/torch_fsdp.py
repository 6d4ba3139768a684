"""torch's own FSDP (``fully_shard`` with ``MixedPrecisionPolicy``) as a target.

``--target conformance.adapters.torch_fsdp``.  Each Linear and Embedding module is its own
``fully_shard`` group (a weight tied across two of them goes with the root module,
``fully_shard(root, ignored_params=norm gains)``: FSDP2 needs a single root);
norm gains stay plain replicated parameters whose gradients this adapter averages in
``fsdp_on_after_backward`` (the CS336 contract).  Parameters gathered in ``compute_dtype``,
reduced in fp32 (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

STRATEGIES = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}


class _Wrapped(nn.Module):
    def __init__(self, module, replicated):
        super().__init__()
        self.module = module
        self._replicated = replicated

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _is_matrix_module(mod) -> bool:
    return any(p.dim() >= 2 for p in mod._parameters.values() if p is not None) and not any(True for _ in mod.children())


def get_fsdp_strategy(module, strategy="FULL_SHARD", compute_dtype=None, reduce_dtype=None, unit_classes=None, shard_group_size=None):
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # pragma: no cover - torch too old
        raise NotImplementedError("this torch has no fully_shard")
    if strategy not in STRATEGIES:
        raise NotImplementedError(f"the torch adapter maps FULL_SHARD and SHARD_GRAD_OP only, not {strategy}")
    from torch.distributed.device_mesh import init_device_mesh

    device_type = next(module.parameters()).device.type
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype or torch.float32)
    for p in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(p.data, src=0)
    groups: dict[int, list] = {}
    for mod in module.modules():
        if _is_matrix_module(mod):
            for p in mod._parameters.values():
                if p is not None and p.dim() >= 2:
                    groups.setdefault(id(p), []).append(mod)
    replicated = [p for p in module.parameters() if p.dim() < 2 and p.requires_grad]
    if any(len(mods) > 1 for mods in groups.values()):
        # a weight tied across two modules: FSDP2 needs one root, so the tied weight is
        # sharded with the root module (norm gains ignored: they stay replicated)
        tied = {id(m) for mods in groups.values() if len(mods) > 1 for m in mods}
        for mods in groups.values():
            if len(mods) == 1 and id(mods[0]) not in tied:
                fully_shard(mods[0], mesh=mesh, mp_policy=mp, reshard_after_forward=STRATEGIES[strategy])
        fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=STRATEGIES[strategy], ignored_params=set(replicated))
        return _Wrapped(module, replicated)
    done = set()
    for mods in groups.values():
        mods = [m for m in mods if id(m) not in done]
        if not mods:
            continue
        done.update(id(m) for m in mods)
        fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh, mp_policy=mp, reshard_after_forward=STRATEGIES[strategy])
    return _Wrapped(module, replicated)


def get_fsdp(module, compute_dtype=None):
    return get_fsdp_strategy(module, "FULL_SHARD", compute_dtype)


def fsdp_on_after_backward(model, optimizer):
    world = dist.get_world_size()
    for p in model._replicated:
        if p.grad is not None and world > 1:
            dist.all_reduce(p.grad)
            p.grad.div_(world)


def fsdp_gather_full_params(model):
    out = {}
    for name, p in model.module.named_parameters(remove_duplicate=False):
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[name] = t.float().clone()
    return out
