"""OverlappedIndividualDDP: one asynchronous all-reduce per parameter, from its hook.

Each parameter's gradient is averaged in place in ``param.grad`` by an async all-reduce
launched from ``register_post_accumulate_grad_hook`` while the rest of the backward pass
runs.  Units are single parameters in reverse registration order; a parameter whose
gradient is ready before the ones ahead of it in that order waits for them (see
``OrderedOverlapBase``), so all ranks issue the same collectives in the same order.
One small collective of presence flags, after the others, decides None vs zero for
gradients missing on some rank.
"""

from __future__ import annotations

import torch

from . import comm
from .base import OrderedOverlapBase, Unit


class OverlappedIndividualDDP(OrderedOverlapBase):
    def _build_units(self) -> list[Unit]:
        pairs = list(zip(self._names, self._params))[::-1]
        return [Unit(i, [p], [name]) for i, (name, p) in enumerate(pairs)]

    def _launch(self, unit: Unit) -> None:
        (param,) = unit.params
        present = param.grad is not None
        unit.local_present = [present]
        grad = param.grad if present else torch.zeros_like(param)
        unit.pending = self._start_average(unit, grad)

    def _launch_presence_round(self) -> comm.PendingAverage:
        return self._launch_presence([u.local_present[0] for u in self._units])

    def _complete_missing(self, unit: Unit, presence: torch.Tensor) -> None:
        if float(presence[unit.index]) > 0:
            unit.params[0].grad = unit.pending.tensor  # zeros from here, averaged with the others
