"""A gradient scaler for data-parallel and sharded training: every rank skips together.

Contract (torch.amp.GradScaler's, with two changes marked *)
    ``DistributedGradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, group=None)``; ``group`` is a torch.distributed process group
    (None: the default group when one is initialised, else this process alone).

    scale(outputs)      outputs * S (a tensor, or nested lists/tuples of tensors); S is a
                        0-dim fp32 tensor, so an fp16 loss is scaled in fp32, as torch does.
    unscale_(opt)       for every gradient of ``opt``'s parameters: note whether it holds a
                        NaN/Inf, then multiply it in place by 1/S (1/S computed in float64,
                        rounded to fp32: exact when S is a power of two).
                      * The local flags are agreed across ``group``: one all-reduce (MAX)
                        of a one-element fp32 tensor, waited before anyone reads it, so
                        every rank sees the same "found inf".
                        A second unscale_ of the same optimizer before update() raises
                        RuntimeError, as does unscale_ after step().
    step(opt, *a, **k)  unscales first if unscale_ was not called; then runs
                        ``opt.step(*a, **k)`` unless a non-finite gradient was found.
                      * Returns True if the optimizer stepped, False if the step was skipped
                        (torch returns the optimizer's own return value).  Drive an LR
                        scheduler with it: ``if scaler.step(opt): scheduler.step()``.
    update()            once per iteration, after the optimizers' steps: if any optimizer
                        found a non-finite gradient since the last update, S <- S *
                        backoff_factor and the growth counter resets to 0; otherwise the
                        counter grows by one and, on reaching growth_interval, S <- S *
                        growth_factor and the counter resets.  update() with no unscale_
                        or step since the last one raises RuntimeError.
    get_scale()         S as a Python float.
    clip_grad_norm_(parameters, max_norm, sharded_parameters=())
                        (beyond torch's scaler) call after unscale_: clips to the GLOBAL
                        2-norm.  ``parameters`` hold full gradients that are the same on
                        every rank (DDP, FSDP's replicated biases): counted once.
                        ``sharded_parameters`` hold disjoint pieces (FSDP shards): their
                        squared norms are summed over ``group`` (one all-reduce, float64).
                        Gradients are multiplied by min(1, max_norm / (norm + 1e-6)).
                        Returns the norm (0-dim float64 tensor, the same on every rank).

What it communicates
    One all-reduce of one fp32 element per unscale_ (on CUDA under NCCL, on the CPU
    otherwise), one of one float64 element per sharded clip.  Nothing else.

Errors
    A non-positive scale or factor, growth_factor <= 1, backoff_factor outside (0, 1) or a
    growth_interval that is not a positive int raises ValueError naming it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"


def _group_size(group) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _flag_device(grads, group) -> torch.device:
    for g in grads:
        if g.is_cuda and "nccl" in str(dist.get_backend(group)).lower():
            return g.device
        break
    return torch.device("cpu")


def _grads(optimizer) -> list[torch.Tensor]:
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


class DistributedGradScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
        if not (isinstance(init_scale, (int, float)) and math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"init_scale must be a positive finite number, got {init_scale!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if not (isinstance(growth_interval, int) and growth_interval > 0):
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")
        self._scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.group = group
        self._growth_tracker = 0
        self._per_optimizer: dict[int, dict] = {}

    # --- scaling -------------------------------------------------------------------

    def get_scale(self) -> float:
        return self._scale

    def _scale_tensor(self, device) -> torch.Tensor:
        return torch.tensor(self._scale, dtype=torch.float32, device=device)

    def scale(self, outputs):
        if isinstance(outputs, torch.Tensor):
            return outputs * self._scale_tensor(outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"scale() takes a tensor or lists/tuples of tensors, got {type(outputs).__name__}")

    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": READY, "found_inf": None})

    # --- the agreed non-finite check ---------------------------------------------------

    def _agree(self, flag: torch.Tensor) -> torch.Tensor:
        """MAX of the ranks' flags; waited here, so nobody reads a half-finished value."""
        if _group_size(self.group) > 1:
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            work.wait()
        return flag

    @torch.no_grad()
    def _unscale_grads(self, grads) -> torch.Tensor:
        """Multiply every gradient by 1 / scale (exact for a power of two) and return this
        rank's flag (1.0 if any gradient held a NaN or Inf), without a host sync: one fused
        check-and-unscale per (device, dtype), torch's own kernel, where it has one."""
        flag_device = _flag_device(grads, self.group)
        found = torch.zeros(1, dtype=torch.float32, device=flag_device)
        groups: dict[tuple, list[torch.Tensor]] = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), gs in groups.items():
            f = torch.zeros(1, dtype=torch.float32, device=device)
            inv = torch.full((1,), 1.0 / self._scale, dtype=torch.float32, device=device)
            try:
                torch._amp_foreach_non_finite_check_and_unscale_(gs, f, inv)
            except (RuntimeError, NotImplementedError):  # a dtype or device without the fused kernel
                f = torch.stack([(~torch.isfinite(g)).any() for g in gs]).any().float().reshape(1)
                for g in gs:
                    g.mul_(1.0 / self._scale)
            found = torch.maximum(found, f.to(flag_device))
        return found

    def unscale_(self, optimizer) -> None:
        state = self._state(optimizer)
        if state["stage"] == UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        if state["stage"] == STEPPED:
            raise RuntimeError("unscale_() is being called after step(); call update() first")
        flag = self._unscale_grads(_grads(optimizer))
        state["found_inf"] = self._agree(flag)
        state["stage"] = UNSCALED

    def _found_inf(self, state) -> bool:
        return bool(state["found_inf"].item() > 0)

    def step(self, optimizer, *args, **kwargs) -> bool:
        state = self._state(optimizer)
        if state["stage"] == STEPPED:
            raise RuntimeError("step() has already been called on this optimizer since the last update()")
        if state["stage"] == READY:
            self.unscale_(optimizer)
        stepped = not self._found_inf(state)
        if stepped:
            optimizer.step(*args, **kwargs)
        state["stage"] = STEPPED
        return stepped

    def update(self) -> None:
        states = [s for s in self._per_optimizer.values() if s["found_inf"] is not None]
        if not states:
            raise RuntimeError("update(): no unscale_() or step() since the last update(), nothing to decide on")
        if any(self._found_inf(s) for s in states):
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._scale *= self.growth_factor
                self._growth_tracker = 0
        self._per_optimizer.clear()

    # --- clipping to the global norm ---------------------------------------------------

    def _sharded_square_sum(self, local: torch.Tensor) -> torch.Tensor:
        if _group_size(self.group) > 1:
            dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self.group)
        return local

    @torch.no_grad()
    def clip_grad_norm_(self, parameters, max_norm: float, sharded_parameters=()) -> torch.Tensor:
        replicated = [p.grad for p in _as_list(parameters) if p.grad is not None]
        sharded = [p.grad for p in _as_list(sharded_parameters) if p.grad is not None]
        flag_device = _flag_device(replicated + sharded, self.group)
        squares = torch.zeros((), dtype=torch.float64, device=flag_device)
        for g in sharded:
            squares += g.detach().double().pow(2).sum().to(flag_device)
        squares = self._sharded_square_sum(squares.reshape(1)).reshape(())
        for g in replicated:
            squares += g.detach().double().pow(2).sum().to(flag_device)
        norm = squares.sqrt()
        coef = min(1.0, float(max_norm) / (float(norm) + 1e-6))
        if coef < 1.0:
            for g in replicated + sharded:
                g.mul_(coef)
        return norm


def _as_list(params) -> list:
    if isinstance(params, torch.Tensor):
        return [params]
    return list(params)
