"""What a rank holds: the storages reachable from the wrapped model and its optimizer.

Observed, not assumed: every tensor reachable from the model object (its ``__dict__``,
submodules, parameters, buffers, plain attributes, lists, dicts and plain objects it
holds) and from the optimizer's state, counted once per storage by its bytes.  Storages
held only by autograd's saved tensors are not reachable this way, which is right for a
rank at rest (after backward, after a step).  DTensors count their local tensor.
"""

from __future__ import annotations

import types

import torch

_SKIP = (types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, type, str, bytes, int, float, bool, torch.dtype, torch.device)


def _local(t: torch.Tensor) -> torch.Tensor:
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return _local(t).untyped_storage().nbytes()
    except Exception:  # a tensor without storage (meta, a wrapper subclass)
        return 0


def reachable_bytes(*roots, max_depth: int = 12) -> int:
    seen_obj: set[int] = set()
    storages: dict[tuple, int] = {}
    stack = [(r, 0) for r in roots]
    while stack:
        obj, depth = stack.pop()
        if obj is None or isinstance(obj, _SKIP) or id(obj) in seen_obj or depth > max_depth:
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            t = _local(obj)
            try:
                st = t.untyped_storage()
                if st.nbytes():
                    storages[(st.data_ptr(), str(t.device))] = st.nbytes()
            except Exception:
                pass
            if obj.grad is not None if obj.is_leaf else False:
                stack.append((obj.grad, depth + 1))
            continue
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
            stack.extend((k, depth + 1) for k in obj.keys() if isinstance(k, torch.Tensor))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in obj)
        elif isinstance(obj, torch.optim.Optimizer):
            stack.append((obj.state, depth + 1))
            stack.append((obj.param_groups, depth + 1))
        elif hasattr(obj, "__dict__"):
            stack.extend((v, depth + 1) for v in vars(obj).values())
    return sum(storages.values())
