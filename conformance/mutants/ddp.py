"""Deliberately broken data-parallel wrappers: the DDP laws must reject every one.

Each mutant is a target (``--target conformance.mutants.ddp:<name>``) offering one DDP
flavour; its wrapper is this project's own wrapper with one decision changed, so the
bug is the only difference.  ``caught_by`` names the laws of ``conformance.laws.ddp.laws.LAWS``
that must reject it (``conformance/selftests/test_ddp_mutants.py`` checks that they do):

    replicas_match  replicas bit-identical, and equal to one process on the whole batch
    no_sync         accumulation under no_sync(): silent, and equal to the concatenated batch
    layout          buckets partition the trainable parameters in reverse registration order
    overlap         a collective is issued while backward still produces gradients
    spec:<case>     a fixed spec case of ``conformance.laws.ddp.spec`` (two ranks)

Most bugs only show with two or more ranks; the mutant runner draws world sizes >= 2.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
import torch.distributed as dist

from impl.ddp import BucketedDDP, OverlappedIndividualDDP, comm
from impl.ddp.bucketed import MIB, plan_buckets

from conformance.lawbook import Mutant


class MutantTarget:
    """A target offering one flavour, built from one broken wrapper class."""

    def __init__(self, name: str, bug: str, caught_by: tuple[str, ...], flavour: str, wrapper: type):
        self.name, self.bug, self.caught_by, self.flavour, self.wrapper = name, bug, caught_by, flavour, wrapper

    @property
    def spec(self) -> str:
        return f"{__name__}:{self.name}"

    def _offer(self, flavour: str):
        if flavour != self.flavour:
            raise NotImplementedError(f"mutant {self.name} offers only the {self.flavour} flavour")

    def get_ddp_individual_parameters(self, module):
        self._offer("individual")
        return self.wrapper(module)

    def ddp_individual_parameters_on_after_backward(self, model, optimizer):
        model.finish_gradient_synchronization()

    def get_ddp_bucketed(self, module, bucket_size_mb):
        self._offer("bucketed")
        return self.wrapper(module, bucket_size_mb=bucket_size_mb)

    def ddp_bucketed_on_after_backward(self, model, optimizer):
        model.finish_gradient_synchronization()

    def ddp_bucketed_on_train_batch_start(self, model, optimizer):
        model.on_train_batch_start()

    def __repr__(self) -> str:
        return f"MutantTarget({self.name}: {self.bug})"


# --- the broken wrappers ------------------------------------------------------------------


class SumNotMean(BucketedDDP):
    """All-reduce sums and nobody divides by the world size."""

    def _start_average(self, unit, tensor):
        return comm.PendingAverage(tensor, dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True), 1)


class NoBroadcastAtWrap(OverlappedIndividualDDP):
    """Wrapping keeps each rank's own initial parameters and buffers."""

    def _state_to_broadcast(self):
        return []


class BuffersNotBroadcast(BucketedDDP):
    """Wrapping broadcasts the parameters but forgets the buffers."""

    def _state_to_broadcast(self):
        return list(self.module.parameters())


class PersistentStateOnly(BucketedDDP):
    """Wrapping broadcasts ``state_dict()``'s tensors: non-persistent buffers are left out."""

    def _state_to_broadcast(self):
        persistent = {id(t) for t in self.module.state_dict(keep_vars=True).values()}
        return list(self.module.parameters()) + [b for b in self.module.buffers() if id(b) in persistent]


class NonContiguousBroadcastLost(BucketedDDP):
    """A non-contiguous tensor is broadcast through a dense copy that is never copied back."""

    @torch.no_grad()
    def _broadcast_from_rank0(self):
        for tensor in self._state_to_broadcast():
            dist.broadcast(tensor if tensor.is_contiguous() else tensor.contiguous(), src=0)


class LastBucketNeverSent(BucketedDDP):
    """The last bucket in launch order is copied in but never all-reduced."""

    def _start_average(self, unit, tensor):
        if unit.index == len(self._units) - 1:
            return comm.PendingAverage(tensor, None, 1)
        return super()._start_average(unit, tensor)


class _LazyWork:
    """A collective that makes progress only when waited on (deterministic stand-in for
    an asynchronous one that has not completed when its result is read)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def wait(self):
        dist.all_reduce(self.tensor)


class FinishDoesNotWait(OverlappedIndividualDDP):
    """finish_gradient_synchronization() launches what is left but never waits: the
    optimizer reads gradients whose all-reduce has not happened."""

    def _start_average(self, unit, tensor):
        return comm.PendingAverage(tensor, _LazyWork(tensor), dist.get_world_size())

    def finish_gradient_synchronization(self):
        if not self._sync_enabled:
            return
        while self._next_launch < len(self._units):
            self._launch_next()
        self._reset_round()  # drops the pending work instead of waiting for it


class TiedWeightInTwoBuckets(BucketedDDP):
    """Buckets are built from every name of every parameter, so a tied weight is
    bucketed (and reduced) once per name."""

    def _synced_named_parameters(self):
        return [(n, p) for n, p in self.module.named_parameters(remove_duplicate=False) if p.requires_grad]

    def _hooked_params(self):
        seen, unique = set(), []
        for p in super()._hooked_params():
            if id(p) not in seen:
                seen.add(id(p))
                unique.append(p)
        return unique


class FrozenParameterReduced(BucketedDDP):
    """Frozen parameters (requires_grad=False) are bucketed too and come back with a zero
    gradient, so weight decay and momentum move them."""

    def _synced_named_parameters(self):
        return list(self.module.named_parameters())

    def _hooked_params(self):
        return [p for p in super()._hooked_params() if p.requires_grad]

    def _complete_missing(self, bucket, presence):
        super()._complete_missing(bucket, presence)
        for p, view in zip(bucket.params, bucket.views):
            if not p.requires_grad:
                p.grad = view


class MissingGradientBecomesZero(BucketedDDP):
    """A parameter no rank produced a gradient for gets a zero gradient instead of None."""

    def _complete_missing(self, bucket, presence):
        for p, view in zip(bucket.params, bucket.views):
            p.grad = view


class NoneBucketSizeRefused(BucketedDDP):
    """bucket_size_mb=None (one bucket of unbounded size, as the course's adapter says)
    multiplied out as a number: TypeError."""

    def __init__(self, module, bucket_size_mb=None, **kwargs):
        cap_bytes = bucket_size_mb * MIB  # BUG: None is not a size
        super().__init__(module, bucket_size_mb=cap_bytes / MIB, **kwargs)


class MissingGradientSentStale(BucketedDDP):
    """A rank without a parameter's gradient sends whatever its bucket slot still holds
    (last step's average) instead of zero: right until a step where only some ranks use a
    parameter that an earlier step reduced."""

    @staticmethod
    def _fill_missing(view):
        pass


class BucketMixesDtypes(BucketedDDP):
    """Buckets packed by size alone: parameters of another dtype share the first one's
    flat buffer (gradients cast into it, views of the wrong dtype handed back)."""

    def _layout(self, order):
        cap = None if self.bucket_size_mb is None else self.bucket_size_mb * MIB
        return plan_buckets([p.numel() * p.element_size() for _, p in order], [p.device for _, p in order], cap)


class PresenceFlagsNotReset(BucketedDDP):
    """The per-bucket presence flags are not set back to 1 after a round: a rank with every
    gradient writes no flags, so it sends last round's averaged flags.  After a round where
    no rank had a gradient (flag 0), a rank that now has it still says 0, and a rank missing
    it reads "no rank had it" and sets None instead of the average."""

    def _end_round(self):
        pass


class StaleReadySetAfterNoSync(BucketedDDP):
    """Hooks mark gradients ready under no_sync() too, and the marks are cleared only by
    finish: the next synced backward finds every bucket already complete and launches it
    at its first hook, before the other gradients of the micro-batch are accumulated."""

    def _on_gradient_ready(self, param):
        unit = self._unit_of[id(param)]
        if unit.pending is None:
            unit.ready.add(id(param))
        if self._sync_enabled:
            self._launch_ready_in_order()

    def on_train_batch_start(self):
        pass


class BucketOrderDependsOnRank(BucketedDDP):
    """Odd ranks lay out each bucket's parameters in the opposite order, so the all-reduce
    adds one parameter's gradient to another's."""

    def _layout(self, order):
        layout = super()._layout(order)
        return [idx[::-1] for idx in layout] if dist.get_rank() % 2 else layout


class NoOverlap(BucketedDDP):
    """Every bucket is launched by finish, after backward: correct, but nothing overlaps."""

    def _launch_ready_in_order(self):
        pass


class NoSyncStillCommunicates(BucketedDDP):
    """no_sync() does not hold communication back: each micro-batch's backward reduces its
    buckets and the context's exit finishes them (right numbers, wasted bandwidth)."""

    @contextlib.contextmanager
    def no_sync(self):
        yield
        self.finish_gradient_synchronization()


class BucketOverflowsCap(BucketedDDP):
    """A bucket is closed only once it has gone past the cap."""

    def _layout(self, order):
        cap = None if self.bucket_size_mb is None else self.bucket_size_mb * MIB
        buckets, current, size = [], [], 0
        for i, (_, p) in enumerate(order):
            current.append(i)
            size += p.numel() * p.element_size()
            if cap is not None and size > cap:
                buckets.append(current)
                current, size = [], 0
        return buckets + ([current] if current else [])


# --- the mutants as targets ---------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    bug: str
    caught_by: tuple[str, ...]
    flavour: str


_MUTANTS = {
    "sum_not_mean": (SumNotMean, _Spec("gradients summed over ranks, not averaged", ("replicas_match", "spec:exact_average", "spec:toy_training"), "bucketed")),
    "no_broadcast_at_wrap": (NoBroadcastAtWrap, _Spec("rank 0's parameters and buffers are not broadcast at wrap", ("replicas_match", "spec:wrap_broadcast", "spec:toy_training_tied"), "individual")),
    "persistent_state_only": (PersistentStateOnly, _Spec("non-persistent buffers are not broadcast at wrap", ("spec:wrap_broadcast",), "bucketed")),
    "non_contiguous_broadcast_lost": (NonContiguousBroadcastLost, _Spec("a non-contiguous parameter is broadcast into a copy never copied back", ("spec:wrap_broadcast",), "bucketed")),
    "buffers_not_broadcast": (BuffersNotBroadcast, _Spec("buffers are not broadcast at wrap", ("replicas_match", "spec:wrap_broadcast"), "bucketed")),
    "last_bucket_never_sent": (LastBucketNeverSent, _Spec("the last bucket is never all-reduced", ("replicas_match", "spec:exact_average"), "bucketed")),
    "finish_does_not_wait": (FinishDoesNotWait, _Spec("finish returns before the all-reduces complete", ("replicas_match", "spec:exact_average"), "individual")),
    "tied_weight_in_two_buckets": (TiedWeightInTwoBuckets, _Spec("a tied weight is bucketed and reduced once per name", ("layout",), "bucketed")),
    "frozen_parameter_reduced": (FrozenParameterReduced, _Spec("frozen parameters are bucketed and get zero gradients", ("layout", "replicas_match", "spec:frozen_and_unused"), "bucketed")),
    "presence_flags_not_reset": (PresenceFlagsNotReset, _Spec("presence flags keep last round's average", ("spec:frozen_and_unused",), "bucketed")),
    "missing_gradient_sent_stale": (MissingGradientSentStale, _Spec("a rank without a gradient sends its bucket slot's stale contents, not zero", ("spec:frozen_and_unused",), "bucketed")),
    "none_bucket_size_refused": (NoneBucketSizeRefused, _Spec("bucket_size_mb=None (one unbounded bucket) raises TypeError", ("spec:toy_training",), "bucketed")),
    "bucket_mixes_dtypes": (BucketMixesDtypes, _Spec("float32 and float64 gradients packed into one bucket of the first one's dtype", ("spec:mixed_dtypes",), "bucketed")),
    "missing_gradient_becomes_zero": (MissingGradientBecomesZero, _Spec("a gradient no rank produced becomes zero, not None", ("replicas_match", "spec:frozen_and_unused"), "bucketed")),
    # its bug is a race (the early all-reduce reads the bucket before or after the rest of
    # the micro-batch is accumulated into it): the no_sync law's many examples catch it; the
    # one fixed spec case caught it in most CI runs but not all (a quiet machine let gloo's
    # thread lose the race), so it is not claimed here
    "stale_ready_set_after_no_sync": (StaleReadySetAfterNoSync, _Spec("no_sync leaves bucket bookkeeping stale for the next synced backward", ("no_sync",), "bucketed")),
    "bucket_order_depends_on_rank": (BucketOrderDependsOnRank, _Spec("buckets assembled in a different order on different ranks", ("replicas_match", "layout", "spec:exact_average"), "bucketed")),
    "no_overlap": (NoOverlap, _Spec("all buckets launched after backward", ("overlap",), "bucketed")),
    "no_sync_still_communicates": (NoSyncStillCommunicates, _Spec("no_sync() still reduces every micro-batch", ("no_sync", "spec:no_sync_accumulate"), "bucketed")),
    "bucket_overflows_cap": (BucketOverflowsCap, _Spec("a bucket closes only after exceeding the cap", ("layout",), "bucketed")),
}

for _name, (_cls, _spec) in _MUTANTS.items():
    globals()[_name] = MutantTarget(_name, _spec.bug, _spec.caught_by, _spec.flavour, _cls)

TARGETS: dict[str, MutantTarget] = {name: globals()[name] for name in _MUTANTS}
MUTANTS = tuple(Mutant(t.name, "DDP", t.bug, t.caught_by, target=t.spec, flavour=t.flavour) for t in TARGETS.values())


def describe() -> str:
    """One line per mutant: name, flavour, bug, the laws that must catch it, and its class doc."""
    lines = []
    for m in TARGETS.values():
        doc = " ".join(inspect.getdoc(m.wrapper).split())
        lines.append(f"{m.name} [{m.flavour}] {m.bug}; caught by {', '.join(m.caught_by)}: {doc}")
    return "\n".join(lines)
