"""Observing collectives: torch.distributed's reducing collectives wrapped in the rank, and an event log."""

from __future__ import annotations

import functools


MAX_CPU_WORLD = 4
CASE_TIMEOUT_S = 60.0
MIB = 1 << 20


SPIED_COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor")


class EventLog:
    """Events of one step, in the order they happen; records only while started."""

    def __init__(self):
        self.events: list[tuple] | None = None

    def start(self) -> None:
        self.events = []

    def stop(self) -> list[tuple]:
        events, self.events = self.events or [], None
        return events

    def record(self, *event) -> None:
        if self.events is not None:
            self.events.append(event)


LOG = EventLog()


def install_collective_spy() -> None:
    """Wrap torch.distributed's reducing collectives so that each call is logged.

    Both ``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X`` are
    replaced, so code that calls ``dist.all_reduce`` at run time (and code imported later
    with ``from torch.distributed import all_reduce``) is seen.  Idempotent.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in SPIED_COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_ddp_law_spy", False):
            continue

        @functools.wraps(original)
        def spy(*args, _original=original, _name=name, **kwargs):
            LOG.record("collective", _name)
            return _original(*args, **kwargs)

        spy._ddp_law_spy = True
        setattr(c10d, name, spy)
        if getattr(dist, name, None) is original:
            setattr(dist, name, spy)


install_collective_spy()
