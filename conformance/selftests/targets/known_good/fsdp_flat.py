"""A correct FSDP of another design than impl's, through the CS336 2026 names only.

``--target conformance.selftests.targets.known_good.fsdp_flat``: ``get_fsdp``,
``fsdp_on_after_backward``, ``fsdp_gather_full_params`` (no ``get_fsdp_strategy``, no
``fsdp_no_sync``: their laws read "not offered").

Design (where impl chooses otherwise, in brackets)
    Units      every module that owns a matrix (a parameter of 2 or more dimensions) is a
               unit; a matrix two modules share (a tied head) is a unit of the wrapper,
               gathered for the whole forward.
    Shards     a unit's trainable matrices flattened into one buffer, zero-padded to a
               multiple of W; rank r keeps elements [r c, (r + 1) c), c = ceil(n / W), as an
               fp32 ``nn.Parameter`` of the wrapper.  Frozen matrices get a flat of their own.
    Forward    a forward pre-hook all-gathers the unit in the compute dtype through an
               autograd Function and points the module's attributes at views of the result;
               a forward hook points them at an empty tensor again.  No prefetch.
    Saved      while the wrapper's forward runs, a saved-tensor hook swaps every tensor that
               lives on a gathered buffer for a token (shape, strides, offset), so autograd
               holds no gathered weight between forward and backward.  Backward's first
               unpack of a unit all-gathers it again; the copy lives until the unit's
               gradient is reduced.  [impl: frees the gathered storage with resize_(0) and
               refills the same storage before the unit's backward, with a prefetch.]
    Reduction  the Function's backward casts the full gradient to fp32, reduce-scatters it
               (sum) synchronously and divides by W: autograd accumulates the result in the
               shard's ``.grad``.  [impl: asynchronous reduce-scatter from a gradient hook,
               waited for in on_after_backward.]
    Replicated parameters of fewer dimensions (norm gains) stay in ``.module``;
               ``fsdp_on_after_backward`` all-reduces their gradients in fp32 and divides
               by W, one collective per parameter.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn


def _all_gather(out: torch.Tensor, shard: torch.Tensor) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, shard)


def _reduce_scatter(out: torch.Tensor, full: torch.Tensor) -> None:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, full, op=dist.ReduceOp.SUM)


class _Flat:
    """Some matrices of one unit, flattened, padded, and this rank's shard of them."""

    def __init__(self, params: list[tuple[list[str], list[tuple[nn.Module, str]], nn.Parameter]], trainable: bool,
                 compute_dtype: torch.dtype):
        self.world, rank = dist.get_world_size(), dist.get_rank()
        self.entries = []  # (names, owners, shape, offset, numel)
        offset = 0
        for names, owners, p in params:
            self.entries.append((names, owners, p.shape, offset, p.numel()))
            offset += p.numel()
        self.numel = offset
        self.chunk = max(1, math.ceil(offset / self.world))
        self.trainable = trainable
        self.compute_dtype = compute_dtype
        device = params[0][2].device
        with torch.no_grad():
            padded = torch.zeros(self.chunk * self.world, dtype=torch.float32, device=device)
            for (_, _, p), (_, _, _, off, n) in zip(params, self.entries):
                padded[off : off + n].copy_(p.detach().reshape(-1))
            local = padded[rank * self.chunk : (rank + 1) * self.chunk].clone()
        self.shard = nn.Parameter(local, requires_grad=trainable)
        self.for_backward_copy: torch.Tensor | None = None  # the re-gathered buffer of this step's backward
        self.empty = torch.empty(0, dtype=compute_dtype, device=device)

    def gather(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole padded buffer, all-gathered from the shards cast to ``dtype`` (no autograd)."""
        dtype = dtype or self.compute_dtype
        out = torch.empty(self.chunk * self.world, dtype=dtype, device=self.shard.device)
        _all_gather(out, self.shard.detach().to(dtype))
        return out

    def regathered(self) -> torch.Tensor:
        """The buffer in backward: gathered once per backward for a trainable flat (freed when
        its gradient is reduced), afresh per use for a frozen one (no gradient comes to free it)."""
        if not self.trainable:
            return self.gather()
        if self.for_backward_copy is None:
            self.for_backward_copy = self.gather()
        return self.for_backward_copy

    def reduce(self, grad: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the mean over ranks of the full gradient, in fp32."""
        self.for_backward_copy = None
        out = torch.empty(self.chunk, dtype=torch.float32, device=grad.device)
        _reduce_scatter(out, grad.to(torch.float32).contiguous())
        return out.div_(self.world)

    def point_owners_at(self, full: torch.Tensor | None) -> None:
        for _, owners, shape, off, n in self.entries:
            view = self.empty if full is None else full[off : off + n].view(shape)
            for module, attr in owners:
                setattr(module, attr, view)


class _GatherFlat(torch.autograd.Function):
    """shard (fp32) -> the full padded buffer in the compute dtype; backward reduce-scatters."""

    @staticmethod
    def forward(ctx, shard, flat):
        ctx.flat = flat
        return flat.gather()

    @staticmethod
    def backward(ctx, grad):
        return ctx.flat.reduce(grad), None


class _Token:
    """What autograd keeps instead of a tensor on a gathered buffer."""

    __slots__ = ("flat", "size", "stride", "offset")

    def __init__(self, flat: _Flat, t: torch.Tensor):
        self.flat, self.size, self.stride, self.offset = flat, t.size(), t.stride(), t.storage_offset()


class FlatFSDP(nn.Module):
    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("get_fsdp needs an initialised torch.distributed default group")
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point):
            raise ValueError(f"compute_dtype must be a floating torch.dtype or None, got {compute_dtype!r}")
        self.module = module
        self.compute_dtype = compute_dtype or torch.float32
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        # every (module, attribute) holding each matrix; replicated: everything else
        holders: dict[int, tuple[nn.Parameter, list[str], list]] = {}
        for mname, mod in module.named_modules(remove_duplicate=False):
            for attr, p in mod._parameters.items():
                if p is None or p.dim() < 2:
                    continue
                _, names, owners = holders.setdefault(id(p), (p, [], []))
                names.append(f"{mname}.{attr}" if mname else attr)
                if not any(m is mod and a == attr for m, a in owners):
                    owners.append((mod, attr))
        self._replicated = [p for p in module.parameters() if p.dim() < 2 and p.requires_grad]
        by_unit: dict[int, tuple[nn.Module | None, list]] = {}
        for p, names, owners in holders.values():
            modules = {id(m) for m, _ in owners}
            unit = owners[0][0] if len(modules) == 1 else None  # None: the wrapper's own unit
            by_unit.setdefault(id(unit), (unit, []))[1].append((names, owners, p))
        self.shards = nn.ParameterList()
        self._flats: list[_Flat] = []
        self._own: list[_Flat] = []  # gathered for the whole forward (matrices two modules share)
        for unit, params in by_unit.values():
            flats = []
            for trainable in (True, False):
                chosen = [e for e in params if e[2].requires_grad == trainable]
                if chosen:
                    flats.append(_Flat(chosen, trainable, self.compute_dtype))
            for flat in flats:
                if flat.trainable:
                    self.shards.append(flat.shard)
                for _, owners, *_ in flat.entries:
                    for mod, attr in owners:
                        mod._parameters.pop(attr, None)
                flat.point_owners_at(None)
            self._flats += flats
            if unit is None:
                self._own += flats
            else:
                unit.register_forward_pre_hook(lambda m, a, fl=tuple(flats): self._open(fl))
                unit.register_forward_hook(lambda m, a, o, fl=tuple(flats): self._close(fl))
        self._live: dict[int, _Flat] = {}  # storage address of a gathered buffer -> its flat

    # forward: gather, compute, point the attributes away again
    def _open(self, flats) -> None:
        for flat in flats:
            if flat.trainable and torch.is_grad_enabled():
                full = _GatherFlat.apply(flat.shard, flat)
            else:
                full = flat.gather()
            self._live[full.untyped_storage().data_ptr()] = flat
            flat.point_owners_at(full)

    def _close(self, flats) -> None:
        for flat in flats:
            flat.point_owners_at(None)
        self._live = {k: f for k, f in self._live.items() if all(f is not g for g in flats)}

    def _pack(self, t: torch.Tensor):
        try:
            flat = self._live.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            return t
        return t if flat is None else _Token(flat, t)

    @staticmethod
    def _unpack(saved):
        if isinstance(saved, _Token):
            return saved.flat.regathered().as_strided(saved.size, saved.stride, saved.offset)
        return saved

    def forward(self, *args, **kwargs):
        for flat in self._flats:
            flat.for_backward_copy = None
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            self._open(self._own)
            try:
                return self.module(*args, **kwargs)
            finally:
                self._close(self._own)

    def average_replicated_gradients(self) -> None:
        world = dist.get_world_size()
        for p in self._replicated:
            if p.grad is None:
                continue
            grad = p.grad.to(torch.float32)
            dist.all_reduce(grad)
            p.grad = grad.div_(world).to(p.dtype)

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        out = {}
        for flat in self._flats:
            full = flat.gather(torch.float32)
            for names, _, shape, off, n in flat.entries:
                for name in names:
                    out[name] = full[off : off + n].view(shape).clone()
        for name, p in self.module.named_parameters(remove_duplicate=False):
            out[name] = p.detach().float().clone()
        return out


def get_fsdp(module: nn.Module, compute_dtype: torch.dtype | None = None) -> FlatFSDP:
    return FlatFSDP(module, compute_dtype)


def fsdp_on_after_backward(model: FlatFSDP, optimizer) -> None:
    model.average_replicated_gradients()


def fsdp_gather_full_params(model: FlatFSDP) -> dict[str, torch.Tensor]:
    return model.full_parameters()
