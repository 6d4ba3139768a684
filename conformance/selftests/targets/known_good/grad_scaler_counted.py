"""A distributed gradient scaler of another design than impl's and torch's.

    --target conformance.selftests.targets.known_good.grad_scaler_counted

    get_distributed_grad_scaler(init_scale, growth_factor, backoff_factor, growth_interval, group)
    first_nonfinite_gradient(model, group=None)

torch.amp.GradScaler's contract (scale, unscale_, step, update, get_scale; a second
unscale_ before update raises RuntimeError; update backs off on any optimizer's overflow,
else grows after growth_interval clean steps), with the protocol's additions (the
non-finite check agreed across the group, step returning whether it stepped).  The choices
differ where the contract leaves them free:

- the scale is a Python float, not a tensor;
- unscale_ divides every gradient by S (``torch._foreach_div_``), where impl and torch
  multiply by 1/S: the same bits while S is a power of two;
- the agreement is one all-reduce (SUM) of an int32 COUNT of non-finite elements per
  unscale_, not a MAX of a float32 flag;
- first_nonfinite_gradient all-reduces (MAX) one int32 flag per parameter and reads the
  first set one, not a MIN of the local first index.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def _world(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def _count_device(tensors, group) -> torch.device:
    """Where a collective's tensor lives: the gradients' GPU under NCCL, else the CPU."""
    if tensors and tensors[0].is_cuda and "nccl" in str(dist.get_backend(group)).lower():
        return tensors[0].device
    return torch.device("cpu")


def _grads_of(optimizer) -> list[torch.Tensor]:
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


class CountingGradScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
        if not init_scale > 0 or not growth_factor > 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ValueError(f"bad scaler settings: init_scale={init_scale}, growth_factor={growth_factor}, "
                             f"backoff_factor={backoff_factor}, growth_interval={growth_interval}")
        self.scale_value = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.group = growth_interval, group
        self.clean_steps = 0
        self.stage: dict[int, str] = {}  # id(optimizer) -> stage since the last update
        self.overflow: dict[int, bool] = {}  # id(optimizer) -> agreed "some rank saw a NaN/Inf"

    def get_scale(self) -> float:
        return self.scale_value

    def scale(self, outputs):
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return outputs * self.scale_value

    @torch.no_grad()
    def unscale_(self, optimizer) -> None:
        stage = self.stage.get(id(optimizer), _READY)
        if stage != _READY:
            raise RuntimeError(f"unscale_() called on an optimizer already {stage} since the last update()")
        grads = _grads_of(optimizer)
        device = _count_device(grads, self.group)
        bad = torch.zeros(1, dtype=torch.int32, device=device)
        for g in grads:
            bad += (~torch.isfinite(g)).sum().to(device=device, dtype=torch.int32)
        if _world(self.group) > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.SUM, group=self.group)  # the whole group's count
        if grads:
            torch._foreach_div_(grads, self.scale_value)  # g / S: exact for a power-of-two S
        self.overflow[id(optimizer)] = int(bad.item()) > 0
        self.stage[id(optimizer)] = _UNSCALED

    def step(self, optimizer, *args, **kwargs) -> bool:
        stage = self.stage.get(id(optimizer), _READY)
        if stage == _STEPPED:
            raise RuntimeError("step() called twice on one optimizer since the last update()")
        if stage == _READY:
            self.unscale_(optimizer)
        stepped = not self.overflow[id(optimizer)]
        if stepped:
            optimizer.step(*args, **kwargs)
        self.stage[id(optimizer)] = _STEPPED
        return stepped

    def update(self) -> None:
        if not self.overflow:
            raise RuntimeError("update() with no unscale_() or step() since the last update()")
        if any(self.overflow.values()):
            self.scale_value *= self.backoff_factor
            self.clean_steps = 0
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.clean_steps = 0
        self.stage.clear()
        self.overflow.clear()

    @torch.no_grad()
    def clip_grad_norm_(self, parameters, max_norm: float, sharded_parameters=()) -> torch.Tensor:
        """Clip to the global 2-norm: replicated gradients counted once, shards' squares summed
        over the group (float64)."""
        full = [p.grad for p in parameters if p.grad is not None]
        shards = [p.grad for p in sharded_parameters if p.grad is not None]
        device = _count_device(full + shards, self.group)
        shard_sq = torch.zeros(1, dtype=torch.float64, device=device)
        for g in shards:
            shard_sq += g.double().pow(2).sum().to(device)
        if _world(self.group) > 1:  # every rank calls it, shards or not
            dist.all_reduce(shard_sq, group=self.group)
        total = shard_sq.reshape(())
        for g in full:
            total = total + g.double().pow(2).sum().to(device)
        norm = total.sqrt()
        coef = min(1.0, max_norm / (float(norm) + 1e-6))
        if coef < 1.0:
            for g in full + shards:
                g.mul_(coef)
        return norm


def get_distributed_grad_scaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
    return CountingGradScaler(init_scale, growth_factor, backoff_factor, growth_interval, group)


@torch.no_grad()
def first_nonfinite_gradient(model, group=None):
    """The first parameter (named_parameters order) whose gradient holds a NaN or Inf on
    any rank: one int32 flag per parameter, all-reduced (MAX) over the group."""
    named = list(model.named_parameters())
    grads = [p.grad for _, p in named if p.grad is not None]
    device = _count_device(grads, group)
    flags = torch.tensor([int(p.grad is not None and not bool(torch.isfinite(p.grad).all())) for _, p in named],
                         dtype=torch.int32, device=device)
    if _world(group) > 1 and len(named):
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    hits = torch.nonzero(flags).flatten().tolist()
    return named[hits[0]][0] if hits else None
