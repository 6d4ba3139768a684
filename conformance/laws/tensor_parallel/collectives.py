"""Observe the collectives a rank issues, by kind (all_reduce, all_gather, reduce_scatter, ...).

Two views, merged: torch's ``CommDebugMode`` sees every collective that reaches the
dispatcher (``torch.distributed`` calls on tensors, the process group's own methods and
the functional collectives DTensor uses), and the ``torch.distributed`` functions are
wrapped to record the Python-level calls (named in failure messages).  The count is the
dispatcher's: a ``torch.distributed`` call that reaches it is not counted twice.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch.distributed as dist

WRAPPED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
           "reduce_scatter_tensor", "broadcast", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv")


def kind(op_name: str) -> str:
    key = op_name.split(".")[-1].replace("_", "").lower()
    for name in ("allreduce", "reducescatter", "allgather", "alltoall", "broadcast", "send", "recv", "barrier"):
        if name in key:
            return {"allreduce": "all_reduce", "reducescatter": "reduce_scatter", "allgather": "all_gather",
                    "alltoall": "all_to_all"}.get(name, name)
    return key


class Observed:
    def __init__(self):
        self.counts: Counter = Counter()
        self.python_calls: list[str] = []

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


@contextlib.contextmanager
def observe():
    """with observe() as seen: ...  ->  seen.counts: Counter of collective kinds."""
    from torch.distributed.tensor.debug import CommDebugMode

    seen = Observed()
    saved = {}
    for name in WRAPPED:
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        saved[name] = fn

        def wrapper(*args, __fn=fn, __name=name, **kwargs):
            seen.python_calls.append(__name)
            return __fn(*args, **kwargs)

        setattr(dist, name, wrapper)
    mode = CommDebugMode()
    try:
        with mode:
            yield seen
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        for op, n in mode.get_comm_counts().items():
            seen.counts[kind(str(op))] += n
