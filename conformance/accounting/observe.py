"""Every collective and point-to-point call a rank makes, with its payload in bytes.

torch.distributed's functions are replaced (on ``torch.distributed`` and on
``distributed_c10d``) for the duration of the ``recording()`` block, so code that looks
them up at call time is seen; a call made from inside another recorded call (a
deprecated name calling its successor) counts once.  The payload follows
``communication``'s definition: the full tensor a collective is about.
"""

from __future__ import annotations

import contextlib
import functools

NAMES = (
    "all_reduce", "broadcast",
    "all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather",
    "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter",
    "send", "recv", "isend", "irecv", "batch_isend_irecv",
)  # fmt: skip


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _payload(name: str, args, kwargs) -> list[tuple[str, int]]:
    a = list(args)
    if name in ("all_reduce", "broadcast", "send", "isend", "recv", "irecv"):
        return [(name, _nbytes(a[0] if a else kwargs["tensor"]))]
    if name in ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"):
        return [(name, _nbytes(a[0] if a else kwargs["output_tensor"]))]  # the assembled output
    if name == "all_gather":
        return [(name, sum(_nbytes(t) for t in a[0]))]
    if name in ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"):
        return [(name, _nbytes(a[1] if len(a) > 1 else kwargs["input"]))]  # the reduced input
    if name == "reduce_scatter":
        return [(name, sum(_nbytes(t) for t in a[1]))]
    if name == "batch_isend_irecv":
        return [(op.op.__name__, _nbytes(op.tensor)) for op in a[0]]
    raise ValueError(name)


@contextlib.contextmanager
def recording():
    """Yields a list that fills with (call name, payload bytes) in call order."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    events: list[tuple[str, int]] = []
    depth = [0]
    saved = []
    for name in NAMES:
        original = getattr(c10d, name, None) or getattr(dist, name, None)
        if original is None:
            continue

        @functools.wraps(original)
        def wrapper(*args, _original=original, _name=name, **kwargs):
            if depth[0] == 0:
                events.extend(_payload(_name, args, kwargs))
            depth[0] += 1
            try:
                return _original(*args, **kwargs)
            finally:
                depth[0] -= 1

        for mod in (c10d, dist):
            if getattr(mod, name, None) is original:
                saved.append((mod, name, original))
                setattr(mod, name, wrapper)
    try:
        yield events
    finally:
        for mod, name, original in saved:
            setattr(mod, name, original)
