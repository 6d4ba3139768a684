"""torch.distributed's collectives wrapped in the rank: what moves, in which dtype, when.

PyTorch's own FSDP tests observe communication the same way (patching
``dist.all_gather_into_tensor`` and ``dist.reduce_scatter_tensor``).  Both
``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X`` are replaced, so
code that looks the collective up at call time is seen.  The spy can also sleep before
every collective on one rank (delay injection: a race shows as a different result).
"""

from __future__ import annotations

import functools
import time

COLLECTIVES = (
    "all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather",
    "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter",
    "all_reduce", "broadcast", "all_to_all_single",
)  # fmt: skip
GATHERS = ("all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather", "broadcast")


class Spy:
    def __init__(self):
        self.phase = "idle"
        self.events: list[tuple[str, str, str]] = []  # (collective, phase, dtype)
        # in order: ("gather", phase, elements gathered) and ("layer", name) where a layer's
        # forward begins (``mark``): how far ahead of the computation the gathers run
        self.timeline: list[tuple] = []
        self.delay_s = 0.0
        self.depth = 0

    def reset(self, delay_s: float = 0.0) -> None:
        self.phase, self.events, self.timeline, self.delay_s, self.depth = "idle", [], [], delay_s, 0

    def mark(self, layer: str) -> None:
        self.timeline.append(("layer", layer))


SPY = Spy()


def _dtype_of(args, kwargs) -> str:
    # the input of a collective: its second tensor argument for (output, input) ones
    tensors = [a for a in list(args) + list(kwargs.values()) if hasattr(a, "dtype")]
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and hasattr(a[0], "dtype")]
    if tensors:
        return str(tensors[-1].dtype).replace("torch.", "")
    if lists:
        return str(lists[-1][0].dtype).replace("torch.", "")
    return "?"


def _gathered_elements(name: str, args, kwargs) -> int:
    """Elements a gathering collective delivers: its output (the first tensor, or list of
    tensors, it is given); an all-reduce's whole tensor (a gather by summing zero-padded
    shards)."""
    first = next((a for a in list(args) + list(kwargs.values()) if hasattr(a, "numel") or isinstance(a, (list, tuple))), None)
    if isinstance(first, (list, tuple)):
        return sum(t.numel() for t in first if hasattr(t, "numel"))
    return first.numel() if first is not None else 0


def install() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_fsdp_spy", False):
            continue

        @functools.wraps(original)
        def spy(*args, _original=original, _name=name, **kwargs):
            if SPY.depth == 0:  # a deprecated name calling its successor is one collective
                SPY.events.append((_name, SPY.phase, _dtype_of(args, kwargs)))
                if _name in GATHERS or _name == "all_reduce":
                    SPY.timeline.append(("gather", SPY.phase, _gathered_elements(_name, args, kwargs)))
                if SPY.delay_s:
                    time.sleep(SPY.delay_s)
            SPY.depth += 1
            try:
                return _original(*args, **kwargs)
            finally:
                SPY.depth -= 1

        spy._fsdp_spy = True
        setattr(c10d, name, spy)
        if getattr(dist, name, None) is original:
            setattr(dist, name, spy)
