"""Fully sharded data parallelism (ZeRO-3 / ZeRO-2) with mixed precision.

Contract
    ``FSDP(module, *, strategy="FULL_SHARD", compute_dtype=None, reduce_dtype=None,
    unit_classes=None, shard_group_size=None, group=None)`` is a ``torch.nn.Module`` around
    ``module`` (kept as ``.module``).  The default ``torch.distributed`` group must be
    initialised (gloo on the CPU, NCCL on GPUs); every rank wraps the same architecture.
    ``group``: the process group FSDP shards and reduces over (None: the default group);
    W below is its size, and every collective FSDP issues stays inside it (how FSDP is
    composed with tensor or pipeline parallelism: FSDP over the data-parallel group of a
    mesh).  HYBRID_SHARD builds its groups from the default group and takes no ``group``.
    Wrapping broadcasts the parameters and buffers of the group's first rank to the group,
    so its ranks start identical.

Which parameters are sharded
    Every parameter with two or more dimensions (Linear and Embedding weights: the
    matrices) is sharded.  Parameters with fewer dimensions (norm gains, biases) are
    replicated: they stay in ``.module`` as ordinary parameters, and after backward their
    gradients are averaged over all ranks (all-reduce in fp32, sum then divide by W), so
    every rank holds the same bits.  This is the CS336 2026 contract.

Units
    A unit is a module whose sharded parameters are gathered together.  ``unit_classes``
    (a tuple of module classes, or a predicate ``module -> bool``) picks them, e.g. the
    transformer block class; by default every module that directly owns a matrix is a
    unit (each Linear and Embedding).  The root module is a unit too and holds what no
    other unit owns.  A parameter used by modules of two different units (a tied
    embedding and output layer) belongs to the root unit, so it is gathered once for the
    whole forward and backward and reduced once.

Layout and shards
    A unit's trainable matrices are flattened, in ``named_parameters`` order, into one
    flat buffer padded with zeros to a multiple of S (the shard group size) and split
    into S equal contiguous shards; shard s is elements ``[s*c, (s+1)*c)`` with
    ``c = ceil(numel / S)``.  Rank s keeps its shard as an fp32 ``nn.Parameter``
    registered on the wrapper (``flat_shards.i``); the original parameters are removed
    from their modules and become plain tensor attributes (views of the gathered buffer
    during forward and backward, an empty tensor otherwise).  Frozen matrices
    (``requires_grad=False``) go into a second flat buffer of the same unit that is
    gathered the same way and never reduced; having no gradient hook, it is freed after
    the unit's backward by an identity on the unit's inputs (``_AfterBackward``).
    ``fsdp_model.parameters()`` is therefore: the fp32 shards, then the replicated and
    frozen parameters of ``.module``.  An optimizer built on it keeps state for the local
    shard only (ZeRO-3's optimizer-state sharding comes for free).

Strategies (S = shard group size, R = replicas; W = S * R)
    FULL_SHARD     S = W.  Gather before a unit's forward, free after it; gather again
                   before its backward, reduce-scatter its gradients, free.  (ZeRO-3.)
    SHARD_GRAD_OP  S = W.  As FULL_SHARD, but the gathered parameters stay from forward
                   to backward (one all-gather per step instead of two).  (ZeRO-2 plus
                   parameter sharding at rest.)
    NO_SHARD       S = 1.  Every rank keeps everything; gradients are all-reduced (DDP).
    HYBRID_SHARD   S = ``shard_group_size`` (default 2 when it divides W, else W): shard
                   inside groups of S consecutive ranks, replicate across the R groups;
                   gradients are reduce-scattered inside the group, then all-reduced
                   across the replicas of the same shard.
    The root unit is never freed between its forward and its backward (its parameters
    are used at both ends of the model); it is freed after its gradients are reduced.

Communication and dtypes
    Forward and backward all-gather the shards cast to ``compute_dtype`` (default: the
    parameters' own fp32), so parameters travel and compute in it.  Gradients arrive in
    ``compute_dtype``, are cast to ``reduce_dtype`` (default fp32), reduce-scattered
    (sum) as soon as the unit's backward is done (a hook on the gathered buffer), divided
    by W, and stored in the shard's ``.grad`` as fp32.  The next unit's all-gather is
    issued asynchronously when a unit starts its forward (forward order) or its backward
    (reverse order), so it overlaps the unit's compute.
    At most ``REDUCTIONS_IN_FLIGHT`` reductions are outstanding: issuing one completes the
    oldest beyond that (wait, average, add to the shard's ``.grad``), which releases its
    full-size input.  Keeping every input alive until the end of backward held a whole
    unsharded fp32 gradient of the model at the peak, whatever W.
    ``finish_gradient_synchronization()`` completes the outstanding reductions and frees
    whatever is still gathered; after it every gradient has its parameter's shape and
    dtype.  Replicated parameters are not cast: modules that mix them with compute-dtype
    activations must handle the dtypes as they would in a plain model (CS336's RMSNorm
    upcasts).

Gradient accumulation
    Inside ``no_sync()`` backward communicates nothing: each unit adds its full gradient
    (fp32) to a local accumulator, replicated gradients accumulate in ``.grad``; the
    first backward outside reduces the sums.  (Accumulation keeps one full-size fp32
    gradient buffer per unit: memory traded for no communication.)

Saved for backward
    Autograd saves views of a unit's gathered buffer.  Freeing a unit releases the
    buffer's storage (``resize_(0)``) and re-gathering refills the same storage, so the
    saved views read the right values again in backward.

Buffers
    Left in ``.module`` as they are (broadcast from rank 0 at wrap time, never
    synchronised after).

Gathering
    ``gather_full_params()`` (collective) returns ``{name: fp32 tensor}`` for every
    original parameter name (tied parameters under each of their names): shards
    all-gathered with the padding stripped, replicated and frozen ones copied.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from . import comm

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
# Reductions outstanding at once: each holds its unit's full-size gradient until it is waited on.
REDUCTIONS_IN_FLIGHT = 2


@dataclass
class _Slot:
    """One original parameter inside a flat buffer."""

    names: list[str]  # every name it had in module.named_parameters(remove_duplicate=False)
    owners: list[tuple[nn.Module, str]]  # (module, attribute) pairs that used it
    shape: torch.Size
    offset: int
    numel: int


@dataclass
class _Flat:
    """A flat buffer of one unit: trainable (reduced) or frozen (gathered only)."""

    slots: list[_Slot]
    numel: int
    chunk: int  # elements per shard, ceil(numel / S)
    shard: torch.Tensor  # this rank's fp32 shard (nn.Parameter when trainable)
    full: torch.Tensor  # gathered buffer (chunk * S,), compute dtype; storage freed at rest
    trainable: bool
    gathered: bool = False
    pending: object = None  # (work, source) of an asynchronous gather in flight
    accumulated: torch.Tensor | None = None  # no_sync gradient sums (fp32, full size)


@dataclass
class _Unit:
    module: nn.Module
    name: str
    flats: list[_Flat] = field(default_factory=list)
    is_root: bool = False


def _default_unit(module: nn.Module) -> bool:
    return any(p is not None and p.dim() >= 2 for p in module._parameters.values())


class FSDP(nn.Module):
    def __init__(
        self,
        module: nn.Module,
        *,
        strategy: str = "FULL_SHARD",
        compute_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        unit_classes=None,
        shard_group_size: int | None = None,
        group=None,
    ):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("FSDP needs an initialised default torch.distributed process group")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        for what, dt in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dt is not None and (not isinstance(dt, torch.dtype) or not dt.is_floating_point):
                raise ValueError(f"{what} must be a floating torch.dtype or None, got {dt!r}")
        params = list(module.parameters())
        if any(p.dtype != torch.float32 for p in params):
            bad = sorted({str(p.dtype) for p in params if p.dtype != torch.float32})
            raise ValueError(f"FSDP keeps fp32 master parameters; the module has parameters in {bad}")
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise ValueError(f"all parameters must live on one device, found {sorted(map(str, devices))}")

        if group is not None and strategy == "HYBRID_SHARD":
            raise ValueError("HYBRID_SHARD builds its shard and replicate groups over the default group; pass group=None")
        self.module = module
        self.strategy = strategy
        self.group = group
        self.world_size = dist.get_world_size(group)
        whole = group if group is not None else dist.group.WORLD
        self.compute_dtype = compute_dtype or torch.float32
        self.reduce_dtype = reduce_dtype or torch.float32
        if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
            self.shard_group, self.replicate_group = (whole if self.world_size > 1 else None), None
            self.shard_size = self.world_size
        elif strategy == "NO_SHARD":
            self.shard_group, self.replicate_group = None, (whole if self.world_size > 1 else None)
            self.shard_size = 1
        else:
            size = shard_group_size or (2 if self.world_size % 2 == 0 else self.world_size)
            self.shard_group, self.replicate_group = comm.hybrid_groups(size)
            self.shard_size = size
        self.shard_rank = dist.get_rank(self.shard_group) if self.shard_group is not None else 0
        self.reshard_after_forward = strategy in ("FULL_SHARD", "HYBRID_SHARD")
        self._sync = True
        self._pending_reductions: list = []
        self._forward_order: list[_Unit] = []
        self._order_frozen = False

        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                comm.broadcast_from_first(t.data, group)
        self._build_units(module, unit_classes)
        self._register_hooks()

    # --- construction --------------------------------------------------------------

    def _build_units(self, module: nn.Module, unit_classes) -> None:
        if unit_classes is None:
            is_unit = _default_unit
        elif callable(unit_classes) and not isinstance(unit_classes, (tuple, type)):
            is_unit = unit_classes
        else:
            classes = unit_classes if isinstance(unit_classes, tuple) else (unit_classes,)
            is_unit = lambda m: isinstance(m, classes)  # noqa: E731

        names = dict()  # module -> its qualified name
        for mname, mod in module.named_modules(remove_duplicate=False):
            names.setdefault(mod, mname)
        root = _Unit(module, "", is_root=True)
        units = {module: root}
        for mname, mod in module.named_modules():
            if mod is not module and is_unit(mod):
                units[mod] = _Unit(mod, mname)

        def unit_of(mname: str) -> _Unit:
            parts = mname.split(".") if mname else []
            for k in range(len(parts), 0, -1):
                mod = module.get_submodule(".".join(parts[:k]))
                if mod in units:
                    return units[mod]
            return root

        # every (module, attribute) that holds each parameter, in registration order
        uses: dict[int, dict] = {}
        for mname, mod in module.named_modules(remove_duplicate=False):
            for pname, p in mod._parameters.items():
                if p is None:
                    continue
                entry = uses.setdefault(id(p), {"param": p, "names": [], "owners": [], "units": []})
                full_name = f"{mname}.{pname}" if mname else pname
                if full_name not in entry["names"]:
                    entry["names"].append(full_name)
                if (mod, pname) not in [(m, a) for m, a in entry["owners"]]:
                    entry["owners"].append((mod, pname))
                    entry["units"].append(unit_of(mname))

        per_unit: dict[int, list] = {}
        self._replicated: list[tuple[str, nn.Parameter]] = []
        for entry in uses.values():
            p = entry["param"]
            if p.dim() < 2:
                if p.requires_grad:
                    self._replicated.append((entry["names"][0], p))
                continue
            owner_units = {id(u) for u in entry["units"]}
            unit = entry["units"][0] if len(owner_units) == 1 else root
            per_unit.setdefault(id(unit), [unit, []])[1].append(entry)

        # only parameters that stay in .module are kept by reference (never the sharded ones)
        self._kept_names = [(n, e["param"]) for e in uses.values() if e["param"].dim() < 2 for n in e["names"]]
        self.flat_shards = nn.ParameterList()
        self._units: list[_Unit] = []
        for unit, entries in per_unit.values():
            for trainable in (True, False):
                chosen = [e for e in entries if e["param"].requires_grad == trainable]
                if chosen:
                    unit.flats.append(self._make_flat(chosen, trainable))
            self._units.append(unit)
        self._root = root
        if root not in self._units:
            self._units.insert(0, root)

    def _make_flat(self, entries, trainable: bool) -> _Flat:
        slots, offset = [], 0
        for e in entries:
            p = e["param"]
            slots.append(_Slot(e["names"], e["owners"], p.shape, offset, p.numel()))
            offset += p.numel()
        numel, S = offset, self.shard_size
        chunk = max(1, math.ceil(numel / S))
        device = entries[0]["param"].device
        with torch.no_grad():
            flat = torch.zeros(chunk * S, dtype=torch.float32, device=device)
            for s, e in zip(slots, entries):
                flat[s.offset : s.offset + s.numel].copy_(e["param"].reshape(-1))
            start = self._shard_start(chunk)
            local = flat[start : start + chunk].clone()
        del flat
        shard = nn.Parameter(local, requires_grad=trainable) if trainable else local
        if trainable:
            self.flat_shards.append(shard)
        full = torch.empty(chunk * S, dtype=self.compute_dtype, device=device)
        full.untyped_storage().resize_(0)
        if trainable:
            full.requires_grad_(True)
        out = _Flat(slots, numel, chunk, shard, full, trainable)
        for s in slots:
            for mod, attr in s.owners:
                del mod._parameters[attr]
                setattr(mod, attr, torch.empty(0, dtype=self.compute_dtype, device=device))
        if trainable:
            full.register_post_accumulate_grad_hook(lambda t, f=out: self._on_full_grad(f))
        return out

    def _register_hooks(self) -> None:
        for unit in self._units:
            if unit.is_root or not unit.flats:
                continue
            unit.module.register_forward_pre_hook(lambda m, a, u=unit: self._pre_forward(u, a))
            unit.module.register_forward_hook(lambda m, a, out, u=unit: self._post_forward(u, out))
        for _, p in self._replicated:
            p.register_post_accumulate_grad_hook(self._on_replicated_grad)

    def _shard_start(self, chunk: int) -> int:
        """Where this rank's shard starts in a unit's padded flat buffer."""
        return self.shard_rank * chunk

    def _average(self, summed: torch.Tensor) -> torch.Tensor:
        """Sum over ranks -> mean over ranks, in place."""
        return summed.div_(self.world_size)

    # --- gather and free ---------------------------------------------------------------

    def _start_gather(self, flat: _Flat) -> None:
        if flat.gathered or flat.pending is not None:
            return
        full = flat.full
        full.untyped_storage().resize_(full.numel() * full.element_size())
        source = flat.shard.detach().to(self.compute_dtype)
        if self.shard_group is None:
            full.data.copy_(source)
            flat.gathered = True
            return
        work = comm.all_gather_flat(full.data, source, self.shard_group, async_op=True)
        flat.pending = (work, source)

    def _finish_gather(self, flat: _Flat) -> None:
        self._start_gather(flat)
        if flat.pending is not None:
            flat.pending[0].wait()
            flat.pending = None
            flat.gathered = True

    def _gather(self, unit: _Unit, set_views: bool) -> None:
        for flat in unit.flats:
            self._finish_gather(flat)
            if set_views:
                for s in flat.slots:
                    view = flat.full[s.offset : s.offset + s.numel].view(s.shape)
                    for mod, attr in s.owners:
                        setattr(mod, attr, view)

    def _free(self, flat: _Flat) -> None:
        if flat.pending is not None:
            flat.pending[0].wait()
            flat.pending = None
        flat.full.untyped_storage().resize_(0)
        flat.gathered = False
        empty = torch.empty(0, dtype=self.compute_dtype, device=flat.shard.device)
        for s in flat.slots:
            for mod, attr in s.owners:
                setattr(mod, attr, empty)

    def _prefetch(self, unit: _Unit, step: int) -> None:
        if not self._order_frozen or unit not in self._forward_order:
            return
        i = self._forward_order.index(unit) + step
        if 0 <= i < len(self._forward_order):
            for flat in self._forward_order[i].flats:
                self._start_gather(flat)

    # --- forward -----------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if self._pending_reductions:
            self.finish_gradient_synchronization()
        if self._forward_order and not self._order_frozen:
            self._order_frozen = True
        self._gather(self._root, set_views=True)
        out = self.module(*args, **kwargs)
        if not torch.is_grad_enabled():
            for flat in self._root.flats:
                self._free(flat)
        return out

    def _pre_forward(self, unit: _Unit, args: tuple):
        if not self._order_frozen and unit not in self._forward_order:
            self._forward_order.append(unit)
        self._gather(unit, set_views=True)
        self._prefetch(unit, +1)
        if torch.is_grad_enabled() and any(not f.trainable for f in unit.flats):
            # Frozen matrices have no gradient hook to free them after the unit's backward:
            # an identity on the unit's inputs whose backward runs once that backward is done.
            grads = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
            if grads:
                passed = _AfterBackward.apply(lambda u=unit: self._post_backward(u), *(args[i] for i in grads))
                args = list(args)
                for i, t in zip(grads, passed):
                    args[i] = t
                return tuple(args)
        return None

    def _post_forward(self, unit: _Unit, out):
        needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(out))
        if not needs_backward or self.reshard_after_forward:
            for flat in unit.flats:
                self._free(flat)
        if needs_backward:
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(lambda g, u=unit: self._pre_backward(u))
        return None

    # --- backward ----------------------------------------------------------------------

    def _pre_backward(self, unit: _Unit) -> None:
        self._gather(unit, set_views=False)
        self._prefetch(unit, -1)

    def _post_backward(self, unit: _Unit) -> None:
        for flat in unit.flats:
            if not flat.trainable and (flat.gathered or flat.pending is not None):
                self._free(flat)

    def _on_full_grad(self, flat: _Flat) -> None:
        grad = flat.full.grad
        flat.full.grad = None
        grad = grad.to(self.reduce_dtype if self._sync else torch.float32)
        if not self._sync:
            flat.accumulated = grad if flat.accumulated is None else flat.accumulated.add_(grad)
        else:
            if flat.accumulated is not None:
                grad = flat.accumulated.add_(grad).to(self.reduce_dtype)
                flat.accumulated = None
            if self.shard_group is None:  # NO_SHARD or W = 1: all-reduce the whole buffer
                work = None
                if self.replicate_group is not None:
                    work = comm.all_reduce_sum(grad, self.replicate_group, async_op=True)
                self._pending_reductions.append((flat, work, grad, False))
            else:
                out = torch.empty(flat.chunk, dtype=self.reduce_dtype, device=grad.device)
                work = comm.reduce_scatter_sum(out, grad, self.shard_group, async_op=True)
                self._pending_reductions.append((flat, (work, grad), out, self.replicate_group is not None))
            self._complete_oldest_reductions(REDUCTIONS_IN_FLIGHT)
        self._free(flat)

    def _on_replicated_grad(self, p: torch.Tensor) -> None:
        if not self._sync or self.world_size == 1:
            return
        work = comm.all_reduce_sum(p.grad, self.group, async_op=True)
        self._pending_reductions.append((p, work, None, False))

    def _complete(self, target, work, out, across_replicas) -> None:
        """Wait for one reduction and leave its averaged fp32 gradient in place."""
        if isinstance(work, tuple):
            work = work[0]  # (work, its input kept alive until the collective is done)
        if work is not None:
            work.wait()
        if isinstance(target, _Flat):
            if across_replicas:
                comm.all_reduce_sum(out, self.replicate_group, async_op=False)
            grad = self._average(out).to(torch.float32)
            shard = target.shard
            shard.grad = grad if shard.grad is None else shard.grad.add_(grad)
        else:
            self._average(target.grad)

    def _complete_oldest_reductions(self, keep: int) -> None:
        """Complete the oldest flat reductions until at most ``keep`` are outstanding (every
        rank issues its reductions in the same order, so they complete in the same order)."""
        flats = [i for i, entry in enumerate(self._pending_reductions) if isinstance(entry[0], _Flat)]
        done = set(flats[: max(0, len(flats) - keep)])
        if not done:
            return
        for i in sorted(done):  # in issue order
            self._complete(*self._pending_reductions[i])
        self._pending_reductions = [e for i, e in enumerate(self._pending_reductions) if i not in done]

    def finish_gradient_synchronization(self) -> None:
        """Wait for every outstanding reduction; leave averaged fp32 gradients; free all."""
        pending, self._pending_reductions = self._pending_reductions, []
        for entry in pending:
            self._complete(*entry)
        for unit in self._units:
            for flat in unit.flats:
                if flat.gathered or flat.pending is not None:
                    self._free(flat)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside communicate nothing; the next one outside reduces the sums."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    # --- gathering -----------------------------------------------------------------------

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{name: full fp32 tensor} for every original parameter name (collective)."""
        result = {}
        for unit in self._units:
            for flat in unit.flats:
                full = torch.empty(flat.chunk * self.shard_size, dtype=torch.float32, device=flat.shard.device)
                if self.shard_group is None:
                    full.copy_(flat.shard)
                else:
                    comm.all_gather_flat(full, flat.shard.detach(), self.shard_group, async_op=False)
                for s in flat.slots:
                    value = full[s.offset : s.offset + s.numel].view(s.shape).clone()
                    for n in s.names:
                        result[n] = value
        for name, p in self._kept_names:
            result[name] = p.detach().clone()
        return result

    def local_shards(self) -> list[tuple[list[str], torch.Tensor, int, int]]:
        """Per trainable flat buffer: (parameter names, shard, shard index, unpadded numel)."""
        return [
            ([n for s in f.slots for n in s.names[:1]], f.shard, self.shard_rank, f.numel)
            for u in self._units
            for f in u.flats
            if f.trainable
        ]


class _AfterBackward(torch.autograd.Function):
    """Identity on a unit's inputs; its backward (after the unit's own) calls ``callback``."""

    @staticmethod
    def forward(ctx, callback, *tensors):
        ctx.callback = callback
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.callback()
        return (None, *grads)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
