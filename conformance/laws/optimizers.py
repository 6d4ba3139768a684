"""Optimizers over a target's parameters, as a user of that target would build them.

torch's optimizers default to their foreach kernels for CUDA parameters, and those refuse a
list that mixes DTensor and plain tensors ("got mixed torch.Tensor and DTensor").  A target
whose parameters mix them is not wrong for it: torch's own FSDP2 sharding only the matrices
(the CS336 FSDP contract keeps norm gains replicated) and torch's tensor parallelism with
replicated embeddings and gains both do.  Such a parameter list gets the per-tensor loop
(``foreach=False``), the same arithmetic element by element; any other keeps torch's default.
"""

from __future__ import annotations

import torch


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch without DTensor has no mixed lists
        return False
    return isinstance(t, DTensor)


def _tensors(params) -> list:
    out = []
    for p in params:
        out.extend(p["params"] if isinstance(p, dict) else [p])
    return out


def build(optimizer_class, params, **kwargs):
    """``optimizer_class(params, **kwargs)``, with ``foreach=False`` where the parameters mix
    DTensor and plain tensors (unless the caller chose ``foreach`` itself)."""
    params = list(params)
    kinds = {_is_dtensor(p) for p in _tensors(params)}
    if len(kinds) > 1 and "foreach" not in kwargs:
        kwargs["foreach"] = False
    return optimizer_class(params, **kwargs)
