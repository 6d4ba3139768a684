"""What a rank holds: the storages reachable from the wrapped model and its optimizer.

Observed, not assumed: every tensor reachable from the model object (its ``__dict__``,
submodules, parameters, buffers, plain attributes, lists, dicts and plain objects it
holds) and from the optimizer's state, counted once per storage by its bytes.  Storages
held only by autograd's saved tensors are not reachable this way, which is right for a
rank at rest (after backward, after a step).  DTensors count their local tensor.

Between forward and backward autograd's saved tensors hold memory too: ``SavedTensors``
records (weakly) every tensor saved for backward while it is active, so that what they
alone keep alive can be counted: activations, and any gathered full parameter a layer
saved (``F.linear(x, gathered)`` keeps ``gathered`` until backward, whatever the module's
attribute points at after forward).
"""

from __future__ import annotations

import types
import weakref

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
    return sum(reachable_storages(*roots, max_depth=max_depth).values())


def gathered_parameter_bytes(model, *roots, max_depth: int = 12) -> int:
    """Bytes of reachable leaf tensors that require grad and are not ``model``'s own
    parameters (by storage): parameters gathered for autograd and still allocated.  Inputs
    of reductions in flight (gradients, which require no grad) do not count."""
    own = set()
    for p in model.parameters():
        try:
            own.add(_local(p).untyped_storage().data_ptr())
        except Exception:
            pass
    return sum(nbytes for (ptr, _), nbytes in reachable_storages(model, *roots, max_depth=max_depth, where=_gathered).items()
               if ptr not in own)


def _gathered(t: torch.Tensor) -> bool:
    return t.is_leaf and t.requires_grad


def reachable_storages(*roots, max_depth: int = 12, where=None) -> dict[tuple, int]:
    """(storage address, device) -> bytes, of every storage reachable from ``roots``
    (only tensors for which ``where(tensor)`` holds, if given)."""
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
                if st.nbytes() and (where is None or where(obj)):
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
    return storages


class SavedTensors:
    """While active, every tensor autograd saves for backward, by weak reference."""

    shadowed = False  # a target's own saved-tensor hooks hid what was saved (note_if_shadowed)

    def __enter__(self):
        self.refs: list = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    def note_if_shadowed(self) -> None:
        """Call while a module's forward runs: if saved-tensor hooks other than this record's
        are innermost (a target's own: only the innermost pair sees what autograd saves),
        set ``shadowed``: what is saved then cannot be counted here."""
        top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        hooks = top(True) if top is not None else None
        if hooks is not None and hooks[0] != self._pack:
            self.shadowed = True

    def _pack(self, t):
        try:
            self.refs.append(weakref.ref(t))
        except TypeError:
            pass
        return t

    def bytes_held(self, exclude: dict | None = None) -> int:
        """Bytes of the live, non-empty storages of the saved tensors still alive, each
        once, leaving out the storages in ``exclude`` (those reachable otherwise)."""
        exclude = exclude or {}
        storages: dict[tuple, int] = {}
        for ref in self.refs:
            t = ref()
            if t is None:
                continue
            try:
                st = _local(t).untyped_storage()
            except Exception:  # noqa: BLE001 - no storage: nothing held
                continue
            key = (st.data_ptr(), str(t.device))
            if st.nbytes() and key not in exclude:
                storages[key] = st.nbytes()
        return sum(storages.values())
