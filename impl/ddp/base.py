"""What every data-parallel wrapper shares (the contract is in ``impl/ddp/__init__.py``).

``DataParallelBase`` holds the user module, broadcasts rank 0's state at wrap time, keeps
the unique parameters that require grad in registration order (tied weights once,
frozen ones never), implements ``no_sync`` and resolves the missing-gradient rule with
presence flags.  ``OrderedOverlapBase`` adds what the overlapped wrappers share: units of
parameters hooked with ``register_post_accumulate_grad_hook``, launched in one fixed
order as their gradients become ready.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn

from . import comm


class DataParallelBase(nn.Module):
    """Wraps ``module``; subclasses decide how gradients are averaged."""

    def __init__(self, module: nn.Module):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(self).__name__} wraps a torch.nn.Module, got {type(module).__name__}")
        comm.require_process_group(type(self).__name__)
        self.module = module
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self._sync_enabled = True
        self._broadcast_from_rank0()
        named = self._synced_named_parameters()
        self._names = [name for name, _ in named]  # registration order
        self._params = [p for _, p in named]
        devices = {p.device for p in self._params}
        if len(devices) > 1:
            raise ValueError(f"{type(self).__name__}: parameters span several devices {sorted(map(str, devices))}; one device per rank")
        self.device = devices.pop() if devices else torch.device("cpu")

    # --- what is synchronised --------------------------------------------------------

    def _synced_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Unique parameters that require grad, in registration order, first name of each."""
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def _state_to_broadcast(self) -> list[torch.Tensor]:
        """Every parameter (frozen too) and every buffer."""
        return list(self.module.parameters()) + list(self.module.buffers())

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        for tensor in self._state_to_broadcast():
            if tensor.is_contiguous():
                dist.broadcast(tensor, src=0)
            else:  # collectives need dense memory
                dense = tensor.contiguous()
                dist.broadcast(dense, src=0)
                tensor.copy_(dense)

    # --- entry points ----------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside communicate nothing; gradients accumulate locally."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def on_train_batch_start(self) -> None:
        """Nothing to prepare for the wrappers that synchronise after backward."""

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError

    # --- the missing-gradient rule ---------------------------------------------------

    @staticmethod
    def _local_presence(params) -> list[bool]:
        return [p.grad is not None for p in params]

    def _launch_presence(self, flags: list[bool]) -> comm.PendingAverage:
        """Average the 0/1 presence flags: > 0 after the collective iff some rank had a gradient."""
        tensor = torch.tensor([1.0 if f else 0.0 for f in flags], dtype=torch.float32, device=self.device)
        return comm.launch_average(tensor)

    @staticmethod
    def _global_presence(local: list[bool], averaged: torch.Tensor) -> list[bool]:
        # When this rank had every gradient, every parameter is present somewhere: no host sync.
        if all(local):
            return local
        return [v > 0 for v in averaged.tolist()]


class Unit:
    """A group of parameters averaged by one collective (one parameter, or one bucket)."""

    def __init__(self, index: int, params: list[nn.Parameter], names: list[str]):
        self.index = index
        self.params = params
        self.names = names
        self.ready: set[int] = set()  # id() of the parameters whose gradient is final this round
        self.pending: comm.PendingAverage | None = None
        self.local_present: list[bool] = []  # per parameter: had a gradient here at launch

    @property
    def complete(self) -> bool:
        return len(self.ready) == len(self.params)


class OrderedOverlapBase(DataParallelBase):
    """Units launched from gradient-ready hooks, always in the order of ``self._units``.

    A unit whose gradients are all ready waits for the units before it, so every rank
    issues the same collectives in the same order even when gradients arrive in another
    order or are missing on some rank.  ``finish_gradient_synchronization`` launches what
    is left (missing gradients count as zero), waits, and applies the presence rule.
    """

    # Feed collectives from a CUDA side stream (True) or from the backward's own stream.
    side_stream = False

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.comm_stream = comm.CommStream(self.device, enabled=self.side_stream)
        self._averager = comm.Averager(self.device)
        self._units = self._build_units()
        self._unit_of = {id(p): u for u in self._units for p in u.params}
        self._next_launch = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self._hooked_params()]

    # --- what subclasses decide ------------------------------------------------------

    def _build_units(self) -> list[Unit]:
        """The units, in launch order."""
        raise NotImplementedError

    def _launch(self, unit: Unit) -> None:
        """Start the unit's collective; set ``unit.pending`` and ``unit.local_present``."""
        raise NotImplementedError

    def _launch_presence_round(self) -> comm.PendingAverage | None:
        """A collective after the units deciding None vs zero, if the units do not carry flags."""
        return None

    def _start_average(self, unit: Unit, tensor: torch.Tensor) -> comm.PendingAverage:
        """The unit's collective (asynchronous)."""
        return self._averager.launch(tensor)

    def _complete_missing(self, unit: Unit, presence: torch.Tensor | None) -> None:
        """After the wait, for a unit with a gradient missing here: averaged gradient or None."""
        raise NotImplementedError

    def _end_round(self) -> None:
        """After the waits and the presence rule: prepare the units' state for the next round."""

    def _hooked_params(self) -> list[nn.Parameter]:
        return [p for u in self._units for p in u.params]

    # --- during backward -------------------------------------------------------------

    def _on_gradient_ready(self, param: torch.Tensor) -> None:
        if not self._sync_enabled:
            return  # no_sync: accumulate locally, keep no bookkeeping
        unit = self._unit_of[id(param)]
        if unit.pending is not None or id(param) in unit.ready:
            name = unit.names[[id(p) for p in unit.params].index(id(param))]
            raise RuntimeError(
                f"gradient of {name!r} became ready twice in one synchronisation round: "
                "call finish_gradient_synchronization() after every synced backward pass"
            )
        unit.ready.add(id(param))
        self._launch_ready_in_order()

    def _launch_ready_in_order(self) -> None:
        while self._next_launch < len(self._units) and self._units[self._next_launch].complete:
            self._launch_next()

    def _launch_next(self) -> None:
        unit = self._units[self._next_launch]
        self._next_launch += 1
        self._launch(unit)

    # --- after backward --------------------------------------------------------------

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        try:
            while self._next_launch < len(self._units):
                self._launch_next()  # gradients missing on this rank count as zero
            presence_round = self._launch_presence_round()
            self._averager.wait_all([unit.pending for unit in self._units])
            presence = presence_round.wait() if presence_round is not None else None
            for unit in self._units:
                if not all(unit.local_present):
                    self._complete_missing(unit, presence)
            self._end_round()
        finally:
            self._reset_round()

    def _reset_round(self) -> None:
        for unit in self._units:
            unit.ready.clear()
            unit.pending = None
        self._next_launch = 0

    def on_train_batch_start(self) -> None:
        if any(u.pending is not None for u in self._units):
            raise RuntimeError(
                "a gradient synchronisation is still in flight: call finish_gradient_synchronization() "
                "after the backward pass, before the next batch"
            )
        self._reset_round()

    def remove_hooks(self) -> None:
        """Detach this wrapper's hooks from the module's parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
