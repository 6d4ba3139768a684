"""Optimizer-state sharding: ZeRO stage 1 (Rajbhandari et al., 2020).

Contract
    ShardedOptimizer(params, optimizer_cls, *, sync="allgather", bucket_mb=128,
                     process_group=None, **optimizer_kwargs)

    A ``torch.optim.Optimizer`` over *all* ``params`` (``param_groups`` lists every
    parameter, as a plain ``optimizer_cls`` would) that keeps optimizer state only for
    this rank's shard.  Every rank must construct it over the same parameters (same
    order, shapes, dtypes).  Construction and add_param_group are collective: the ranks
    agree in one all-reduce, so differing parameters, or bad input on any one rank, is
    a ValueError on every rank rather than a hang.

    Assignment: parameters go to ranks greedily, largest first (by bytes), each to the
    least-loaded rank so far, ties to the lowest rank; parameters of the same size keep
    their order.  A group added later continues from the loads so far.  The result
    depends only on the sizes, so it is the same on every rank, and no rank's load
    exceeds total/W + the largest parameter (LPT scheduling: a parameter always joins a
    rank at or below the mean).  With more ranks than parameters some ranks own nothing;
    they keep no state, and still take part in every collective.

    step(closure=None): evaluates the closure once, copies the hyperparameters of
    ``param_groups`` (an LR scheduler's edits) into the local optimizer, updates the
    local shard with ``optimizer_cls`` and makes every rank's parameters bit-identical
    to the owners' (``sync``, see ``impl.zero.param_sync``).  The shard is stepped in buckets
    of about ``bucket_mb`` so that communication of one bucket overlaps the update of
    the next (None: one bucket).  The default sync is "allgather": one collective per
    bucket that moves every rank's shard at once, where "broadcast" sends the owners'
    parameters one after another (perf/bench/sharded_optimizer.py measures both on two
    GPUs).  Optimizers whose step needs to re-evaluate the closure (LBFGS) are not
    supported.

    Bits: each parameter is updated by ``optimizer_cls`` with the same kwargs as a plain
    ``optimizer_cls`` over all parameters would use, so the result is bit-identical to
    the unsharded optimizer when both use the same implementation: the same ``foreach``
    / ``fused`` choice (the default None resolves the same way on both sides for the
    same devices).  The foreach and single-tensor paths apply the same per-element
    math, but the order of operations (and so the last bit) may differ between them,
    and a fused kernel differs again; foreach kernels act per tensor, so splitting a
    foreach update into shards or buckets does not change a bit.

    Devices: gloo takes CPU (and CUDA) tensors, NCCL CUDA tensors; a parameter on a
    device the process group's backend cannot move is a ValueError at construction.
    Without an initialised process group the optimizer runs as world size 1.

    State dicts:
      state_dict()                  this rank's shard, no communication: the format of a
                                    plain optimizer_cls (global parameter indices, all
                                    param_groups) holding only owned parameters' state,
                                    plus a "shard" entry (rank, world size, owned indices).
      consolidated_state_dict(to=0) collective: the full state of a plain optimizer_cls
                                    over all parameters (tensors on the CPU) on rank
                                    ``to``, None elsewhere; ``to=None`` returns it on
                                    every rank.
      load_state_dict(sd)           either: a shard dict must come from the same rank of
                                    the same world size; a full dict (consolidated, or a
                                    plain optimizer's) loads at any world size.

Memory: optimizer state ~ (state per element) x params/W per rank; parameters and
gradients stay replicated.  With sync="allgather" the parameters move once into the flat
buffer at construction (and at add_param_group), each aligned to 512 bytes.
"""

from __future__ import annotations

import copy
import hashlib
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from .param_sync import SYNC_STRATEGIES, AllGatherSync, BroadcastSync, NoSync, nbytes, plan_rounds

DEFAULT_SYNC = "allgather"
DEFAULT_BUCKET_MB = 128

# Device types each backend can communicate; other backends are not checked.
BACKEND_DEVICES = {"gloo": ("cpu", "cuda"), "nccl": ("cuda",)}


def assign_greedy(sizes: list[int], loads: list[int]) -> list[int]:
    """Owner of each item: largest first, to the least-loaded rank (ties: lowest rank).

    ``loads`` (per rank, updated in place) carries over from earlier assignments.
    """
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += sizes[i]
    return owners


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: every rank updates and keeps optimizer state for its shard only (see module doc)."""

    def __init__(
        self,
        params,
        optimizer_cls,
        *,
        sync: str = DEFAULT_SYNC,
        bucket_mb: float | None = DEFAULT_BUCKET_MB,
        process_group=None,
        **optimizer_kwargs: Any,
    ):
        if not callable(optimizer_cls) or isinstance(optimizer_cls, torch.optim.Optimizer):
            raise TypeError(f"optimizer_cls must be an optimizer class, got {optimizer_cls!r}")
        if sync not in SYNC_STRATEGIES:
            raise ValueError(f"sync must be one of {SYNC_STRATEGIES}, got {sync!r}")
        if bucket_mb is not None and not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive or None, got {bucket_mb!r}")
        self._group = process_group
        if dist.is_available() and dist.is_initialized():
            self._group = process_group or dist.group.WORLD
            self.world_size, self.rank = dist.get_world_size(self._group), dist.get_rank(self._group)
            self._global_ranks = [dist.get_global_rank(self._group, r) for r in range(self.world_size)]
        elif process_group is not None:
            raise ValueError("process_group given but torch.distributed is not initialised")
        else:
            self.world_size, self.rank, self._global_ranks = 1, 0, [0]
        self._sync_name = sync
        self._bucket_bytes = None if bucket_mb is None else int(bucket_mb * 2**20)
        self._optimizer_cls, self._optimizer_kwargs = optimizer_cls, optimizer_kwargs
        self._params: list[torch.Tensor] = []  # every parameter, in param_groups order
        self._owner: list[int] = []  # owner rank of each, by global index
        self._loads = [0] * self.world_size  # bytes assigned to each rank so far
        self._local: torch.optim.Optimizer | None = None

        # Validate everything that can differ between ranks, then agree on it in one
        # collective: a rank with bad input makes every rank raise, none waits forever.
        problem, groups, defaults = None, [], {}
        try:
            groups = _as_param_groups(params)
            for g in groups:
                self._validate_new_params(g["params"])
            # A throwaway instance gives optimizer_cls's full defaults (and rejects bad kwargs).
            first = groups[0]["params"][0]
            probe = torch.zeros(1, dtype=first.dtype, device=first.device, requires_grad=True)
            defaults = dict(optimizer_cls([probe], **optimizer_kwargs).defaults)
        except (ValueError, TypeError, KeyError) as exc:
            problem = exc
        self._agree(problem, [p for g in groups for p in g["params"]])

        super().__init__(groups, defaults)  # calls add_param_group for each group
        self._local = optimizer_cls([self._local_group(g) for g in self.param_groups], **optimizer_kwargs)
        self.state = self._local.state  # the wrapper's state is the shard's state
        self._rebuild_sync()

    # --- parameters and their owners -------------------------------------------------

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (before or after steps): its parameters are assigned to ranks,
        continuing from the current loads.  Collective: call it on every rank."""
        if self._local is not None:  # after construction (__init__ validated its groups)
            problem = None
            try:
                new = param_group["params"]
                new = [new] if isinstance(new, torch.Tensor) else list(new)
                self._validate_new_params(new)
            except (ValueError, TypeError, KeyError) as exc:
                problem, new = exc, []
            self._agree(problem, self._params + new)
        n_before = len(self._params)
        super().add_param_group(param_group)  # validates and fills in the defaults
        group = self.param_groups[-1]
        self._params.extend(group["params"])
        self._owner.extend(assign_greedy([nbytes(p) for p in group["params"]], self._loads))
        if self._local is not None:
            self._local.add_param_group(self._local_group(group, offset=n_before))
            self._rebuild_sync()

    def _validate_new_params(self, params: list) -> None:
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter group lists the same parameter twice")
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameters must be tensors, got {type(p).__name__}")
            self._check_device(p)

    def _agree(self, problem: Exception | None, params: list) -> None:
        """Collective: raise on every rank if any rank found a problem, or if the ranks'
        parameter lists differ (shapes, dtypes, order) and the collectives would not match."""
        if self.world_size == 1:
            if problem is not None:
                raise problem
            return
        fingerprint = repr([(tuple(p.shape), str(p.dtype)) for p in params]).encode()
        digest = int.from_bytes(hashlib.sha256(fingerprint).digest()[:7], "little")
        flags = torch.tensor([-int(problem is not None), digest, -digest], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self._group)
        if problem is not None:
            raise problem
        if int(flags[0]) != 0:
            raise ValueError("another rank rejected its parameters or optimizer arguments (see its error); every rank must pass the same")
        if int(flags[1]) != digest or int(-flags[2]) != digest:
            raise ValueError(
                "ranks constructed the sharded optimizer over different parameters (shapes/dtypes/order differ); "
                "every rank must pass the same parameters"
            )

    def _local_group(self, group: dict, offset: int | None = None) -> dict:
        """The local optimizer's copy of a group: same hyperparameters, owned parameters only."""
        if offset is None:
            offset = self._index_of_first(group)
        owned = [p for j, p in enumerate(group["params"]) if self._owner[offset + j] == self.rank]
        return {**{k: v for k, v in group.items() if k != "params"}, "params": owned}

    def _index_of_first(self, group: dict) -> int:
        at = 0
        for g in self.param_groups:
            if g is group:
                return at
            at += len(g["params"])
        raise AssertionError("group not in param_groups")

    def _check_device(self, p: torch.Tensor) -> None:
        if self._group is None:
            return
        backend = str(dist.get_backend(self._group)).lower()
        allowed = BACKEND_DEVICES.get(backend)
        if allowed is not None and p.device.type not in allowed:
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} is on device {p.device}, which the {backend} backend "
                f"cannot communicate (supported: {', '.join(allowed)})"
            )

    def _comm_device(self) -> torch.device:
        backend = str(dist.get_backend(self._group)).lower()
        if backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def owned_indices(self, rank: int | None = None) -> list[int]:
        """Global indices (param_groups order) of the parameters ``rank`` (default: this one) owns."""
        rank = self.rank if rank is None else rank
        return [i for i, r in enumerate(self._owner) if r == rank]

    def _rebuild_sync(self) -> None:
        owned = [self._shard_order(r) for r in range(self.world_size)]
        self._rounds = plan_rounds(owned, [nbytes(p) for p in self._params], self._bucket_bytes)
        if self.world_size == 1:
            self._sync = NoSync()
        elif self._sync_name == "broadcast":
            self._sync = BroadcastSync(self._params, self._rounds, self._group, self._global_ranks)
        else:
            self._sync = AllGatherSync(self._params, self._rounds, self._group, self.rank, self.world_size)

    def _shard_order(self, rank: int) -> list[int]:
        """A rank's parameters, largest first: buckets of equal index then have similar
        sizes on every rank (the greedy assignment hands out sizes in turn)."""
        return sorted(self.owned_indices(rank), key=lambda i: (-nbytes(self._params[i]), i))

    # --- the step ------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._push_hyperparameters()
        self._sync.prepare()
        works = []
        for i, rnd in enumerate(self._rounds):
            bucket = rnd.buckets[self.rank]
            if bucket:
                self._step_only({id(self._params[j]) for j in bucket}, whole_shard=len(self._rounds) == 1)
            works.extend(self._sync.launch(i))
        for work in works:
            work.wait()
        return loss

    def _push_hyperparameters(self) -> None:
        """Copy every hyperparameter (not the parameters) of param_groups into the local groups."""
        for group, local in zip(self.param_groups, self._local.param_groups):
            for key, value in group.items():
                if key != "params":
                    local[key] = value

    def _step_only(self, ids: set[int], whole_shard: bool) -> None:
        if whole_shard:
            self._local.step()
            return
        with _restricted(self._local, ids):
            self._local.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradient of every parameter, owned or not."""
        super().zero_grad(set_to_none=set_to_none)

    # --- state dicts ----------------------------------------------------------------------

    def _global_groups(self) -> list[dict]:
        """param_groups in state-dict form: hyperparameters and global parameter indices."""
        out, at = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            out.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(at, at + n))})
            at += n
        return out

    def _shard_state(self) -> dict[int, dict]:
        """This rank's state keyed by global index (the local optimizer's state_dict, renumbered)."""
        local_sd = self._local.state_dict()
        index = self._index
        local_to_global = [index[id(p)] for g in self._local.param_groups for p in g["params"]]
        return {local_to_global[j]: s for j, s in local_sd["state"].items()}

    @property
    def _index(self) -> dict[int, int]:
        return {id(p): i for i, p in enumerate(self._params)}

    def state_dict(self) -> dict:
        """This rank's shard (no communication); see the module doc for the format."""
        self._push_hyperparameters()
        return {
            "state": self._shard_state(),
            "param_groups": self._global_groups(),
            "shard": {"rank": self.rank, "world_size": self.world_size, "owned": self.owned_indices()},
        }

    def consolidated_state_dict(self, to: int | None = 0) -> dict | None:
        """Collective: the full plain-optimizer state dict on rank ``to`` (every rank if None)."""
        if to is not None and not 0 <= to < self.world_size:
            raise ValueError(f"to must be a rank in [0, {self.world_size}) or None, got {to}")
        mine = _to_cpu(self._shard_state())
        if self.world_size == 1:
            shards = [mine]
        elif to is None:
            shards = [None] * self.world_size
            dist.all_gather_object(shards, mine, group=self._group)
        else:
            shards = [None] * self.world_size if self.rank == to else None
            dist.gather_object(mine, shards, dst=self._global_ranks[to], group=self._group)
        if shards is None:
            return None
        state = {}
        for shard in shards:
            state.update(shard)
        return {"state": dict(sorted(state.items())), "param_groups": copy.deepcopy(self._global_groups())}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a shard dict (same rank and world size) or a full dict (any world size)."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("state_dict must be a dict with 'state' and 'param_groups'")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} parameter groups, this optimizer has {len(self.param_groups)}")
        for k, (saved, ours) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(ours["params"]):
                raise ValueError(f"parameter group {k} has {len(saved['params'])} parameters in state_dict, {len(ours['params'])} here")
        shard = state_dict.get("shard")
        if shard is not None and (shard["world_size"], shard["rank"], list(shard["owned"])) != (
            self.world_size,
            self.rank,
            self.owned_indices(),
        ):
            raise ValueError(
                f"state_dict is the shard of rank {shard['rank']} of {shard['world_size']}; this is rank "
                f"{self.rank} of {self.world_size} (load a consolidated_state_dict() to change world size)"
            )
        # Parameter ids in a state dict are positions in param_groups order (a plain
        # optimizer's numbering); the saved groups' hyperparameters replace ours.
        saved_ids = [i for g in groups for i in g["params"]]
        for group, saved in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        index = self._index
        local_groups, local_state, j = [], {}, 0
        for group, local in zip(self.param_groups, self._local.param_groups):
            ids = []
            for p in local["params"]:
                saved_id = saved_ids[index[id(p)]]
                if saved_id in state_dict["state"]:
                    local_state[j] = state_dict["state"][saved_id]
                ids.append(j)
                j += 1
            local_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        self._local.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self._local.state

    def __repr__(self) -> str:
        return (
            f"ShardedOptimizer({self._optimizer_cls.__name__}, rank {self.rank} of {self.world_size}, "
            f"owns {len(self.owned_indices())} of {len(self._params)} parameters, sync={self._sync_name!r})"
        )


# --- helpers ---------------------------------------------------------------------------


def _as_param_groups(params) -> list[dict]:
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors or of param-group dicts, not a single tensor")
    groups = list(params)
    if not groups:
        raise ValueError("ShardedOptimizer got an empty parameter list: at least one parameter is needed")
    if not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    groups = [dict(g) for g in groups]
    for g in groups:
        if isinstance(g["params"], torch.Tensor):
            g["params"] = [g["params"]]
        else:
            g["params"] = list(g["params"])
    if not any(g["params"] for g in groups):
        raise ValueError("ShardedOptimizer got an empty parameter list: every parameter group is empty")
    return groups


@contextmanager
def _restricted(optimizer: torch.optim.Optimizer, ids: set[int]):
    """Let ``optimizer.step()`` see only the parameters with these ids.  Valid for
    optimizers whose update of a parameter depends only on that parameter's gradient and
    state (every torch.optim optimizer but LBFGS)."""
    saved = [g["params"] for g in optimizer.param_groups]
    try:
        for g in optimizer.param_groups:
            g["params"] = [p for p in g["params"] if id(p) in ids]
        yield
    finally:
        for g, params in zip(optimizer.param_groups, saved):
            g["params"] = params


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone() if obj.device.type != "cpu" else obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


# --- configured variants, as targets (``--target impl.zero.optimizer:variants.NAME``) --


def _variant(**options):
    return SimpleNamespace(get_sharded_optimizer=lambda params, optimizer_cls, **kw: ShardedOptimizer(params, optimizer_cls, **options, **kw))


variants = SimpleNamespace(
    allgather=_variant(sync="allgather"),
    broadcast=_variant(sync="broadcast"),
    # tiny buckets: many rounds even for a small model (exercises the pipelined step)
    allgather_buckets=_variant(sync="allgather", bucket_mb=1e-4),
    broadcast_buckets=_variant(sync="broadcast", bucket_mb=1e-4),
)
