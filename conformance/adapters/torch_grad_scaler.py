"""torch.amp.GradScaler as a target for the gradient-scaler laws, adapted where our
contract asks more than torch.

``--target conformance.adapters.torch_grad_scaler``:

    get_distributed_grad_scaler(init_scale, growth_factor, backoff_factor, growth_interval, group)
        a ``torch.amp.GradScaler`` subclass (device from the first gradient's device type)
        with three additions:
        - ``unscale_`` runs torch's, then agrees the found-inf flags across ``group``:
          one all-reduce (MAX) of their sum, written back into torch's per-device
          ``found_inf`` tensors, so ``step`` and ``update`` see the agreed value
          (torch's own scaler decides per process);
        - ``step`` returns whether it stepped (torch returns the optimizer's return
          value): read from the same per-device flags torch's step reads;
        - ``clip_grad_norm_(parameters, max_norm, sharded_parameters=())``: the global
          norm (shards' squares summed over ``group``), as impl's.
    first_nonfinite_gradient(model, group=None)
        torch has none: impl's.

Uses torch internals (``_per_optimizer_states``, ``found_inf_per_device``) as of torch
2.13: the adapter breaks loudly if they move.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import impl
from impl.amp.grad_scaler import DistributedGradScaler


class _AgreeingGradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval, group):
        device = "cuda" if torch.cuda.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()).lower() else "cpu"
        super().__init__(device, init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval)
        self.group = group
        self._clipper = DistributedGradScaler(group=group)

    def unscale_(self, optimizer):
        super().unscale_(optimizer)
        found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            device = next(iter(found.values())).device if found else torch.device(self._device)
            flag = torch.zeros(1, dtype=torch.float32, device=device)
            for v in found.values():
                flag += v.to(device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            if not found:  # no gradient here at all: give torch's step something to read
                found[device] = torch.zeros(1, dtype=torch.float32, device=device)
            for v in found.values():
                v.copy_(flag.to(v.device).reshape(v.shape))

    def step(self, optimizer, *args, **kwargs):
        super().step(optimizer, *args, **kwargs)
        found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        return not any(float(v.item()) > 0 for v in found.values())

    def get_scale(self):
        return float(super().get_scale())

    def clip_grad_norm_(self, parameters, max_norm, sharded_parameters=()):
        return self._clipper.clip_grad_norm_(parameters, max_norm, sharded_parameters=sharded_parameters)


def get_distributed_grad_scaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
    return _AgreeingGradScaler(init_scale, growth_factor, backoff_factor, growth_interval, group)


def first_nonfinite_gradient(model, group=None):
    return impl.first_nonfinite_gradient(model, group)
