"""Deliberately broken FSDP wrappers: the suite must reject every one.

Each mutant is ``impl.fsdp.FSDP`` with one classic bug, as a target offering the CS336
2026 names and the strategy / no_sync entry points:
``--target conformance.mutants.fsdp:sum_not_mean``.  Each names the laws
(``conformance.laws.fsdp.laws``) that exist to catch it;
``conformance/selftests/test_fsdp_mutants.py`` checks that every one of them does.
"""

from __future__ import annotations

import torch

from impl.fsdp import wrapper as W
from impl.fsdp.wrapper import FSDP

from conformance.lawbook import Mutant


class SumNotMean(FSDP):
    """Sharded gradients are summed over ranks, never divided by W."""

    def _average(self, summed):
        if any(summed is p.grad for _, p in self._replicated):
            return super()._average(summed)
        return summed


class PaddingNotStripped(FSDP):
    """gather_full_params returns each unit's last parameter with the padding still on."""

    @torch.no_grad()
    def gather_full_params(self):
        result = super().gather_full_params()
        for unit in self._units:
            for flat in unit.flats:
                pad = flat.chunk * self.shard_size - flat.numel
                last = flat.slots[-1]
                if pad:
                    for n in last.names:
                        result[n] = torch.cat([result[n].reshape(-1), torch.zeros(pad)])
        return result


class ReplicatedNeverAveraged(FSDP):
    """Norm gains (replicated) keep each rank's own gradient: no all-reduce."""

    def _on_replicated_grad(self, p):
        return None


class LastReductionNotWaited(FSDP):
    """finish_gradient_synchronization does not wait for the last reduction issued."""

    def finish_gradient_synchronization(self):
        if self._pending_reductions:
            target, work, out, across = self._pending_reductions[-1]
            self._pending_reductions[-1] = (target, None, out, across)
        super().finish_gradient_synchronization()


class FullParamsNeverFreed(FSDP):
    """Freeing a unit drops the views but never releases the gathered buffer's storage."""

    def _free(self, flat):
        if flat.pending is not None:
            flat.pending[0].wait()
            flat.pending = None
        flat.gathered = True  # stays gathered: the next gather is skipped, memory is kept
        empty = torch.empty(0, dtype=self.compute_dtype, device=flat.shard.device)
        for s in flat.slots:
            for mod, attr in s.owners:
                setattr(mod, attr, empty)


class GradsInComputeDtype(FSDP):
    """Gradients are reduced and left in the compute dtype (fp16/bf16), not fp32."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        self.reduce_dtype = self.compute_dtype

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.flat_shards:
            if p.grad is not None:
                p.grad = p.grad.to(self.compute_dtype)


class OptimizerStepsComputeDtype(FSDP):
    """The shards the optimizer steps are kept in the compute dtype (no fp32 master)."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        with torch.no_grad():
            for p in self.flat_shards:
                p.data = p.data.to(self.compute_dtype)

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.flat_shards:
            if p.grad is not None:
                p.grad = p.grad.to(p.dtype)


class ShardOffsetOffByOne(FSDP):
    """Ranks above 0 take their shard starting one element too early."""

    def _shard_start(self, chunk):
        start = super()._shard_start(chunk)
        return start - 1 if start > 0 else start


class TiedWeightReducedTwice(FSDP):
    """A unit holding a tied weight (one parameter, two owners) has its gradient counted twice."""

    def finish_gradient_synchronization(self):
        fresh = [t for t, *_ in self._pending_reductions if isinstance(t, W._Flat)]
        super().finish_gradient_synchronization()
        for flat in fresh:
            if any(len(s.owners) > 1 for s in flat.slots) and flat.shard.grad is not None:
                flat.shard.grad.mul_(2)


class ShardGradOpReducesInComputeDtype(FSDP):
    """SHARD_GRAD_OP reduce-scatters in the compute dtype while FULL_SHARD uses fp32."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        if self.strategy == "SHARD_GRAD_OP":
            self.reduce_dtype = self.compute_dtype


class GathersInFp32(FSDP):
    """Forward all-gathers the fp32 shards and casts afterwards: twice the bytes on the wire."""

    def _start_gather(self, flat):
        if flat.gathered or flat.pending is not None:
            return
        full = flat.full
        full.untyped_storage().resize_(full.numel() * full.element_size())
        if self.shard_group is None:
            full.data.copy_(flat.shard.detach())
        else:
            buf = torch.empty(full.numel(), dtype=flat.shard.dtype, device=full.device)
            W.comm.all_gather_flat(buf, flat.shard.detach(), self.shard_group, async_op=False)
            full.data.copy_(buf)
        flat.gathered = True


class GatheredCopiesSavedForBackward(FSDP):
    """Each gather hands the layers views of a copy of the gathered buffer: the buffer is
    freed after forward as it should be, but autograd keeps the copies it saved until
    backward, so every layer's full parameters are held between forward and backward."""

    def _gather(self, unit, set_views):
        for flat in unit.flats:
            self._finish_gather(flat)
            if set_views:
                full = flat.full.clone()  # BUG: the layers compute with (and autograd saves) a copy
                for slot in flat.slots:
                    view = full[slot.offset : slot.offset + slot.numel].view(slot.shape)
                    for mod, attr in slot.owners:
                        setattr(mod, attr, view)


class NeverReshardAfterForward(FSDP):
    """FULL_SHARD keeps every unit gathered from forward to backward (SHARD_GRAD_OP's memory)."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        self.reshard_after_forward = False


class NoSyncDropsAccumulated(FSDP):
    """The first synced backward after no_sync forgets the sharded gradients accumulated so far."""

    def _on_full_grad(self, flat):
        if self._sync:
            flat.accumulated = None
        super()._on_full_grad(flat)


class HybridReplicasNotReduced(FSDP):
    """HYBRID_SHARD reduce-scatters inside the shard group but never across replicas."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        if self.strategy == "HYBRID_SHARD":
            self.replicate_group = None


class ReducesInComputeDtype(FSDP):
    """Gradients are reduce-scattered in the compute dtype, then stored as fp32."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        self.reduce_dtype = self.compute_dtype


class FreesOnlyAtFinish(FSDP):
    """A unit's gathered parameters are freed at on_after_backward, not after its own
    backward: the whole model is gathered when backward ends."""

    def _free(self, flat):
        if getattr(self, "_in_backward_hook", False):
            return
        super()._free(flat)

    def _on_full_grad(self, flat):
        self._in_backward_hook = True
        try:
            super()._on_full_grad(flat)
        finally:
            self._in_backward_hook = False


class EvaluationKeepsGathered(FSDP):
    """SHARD_GRAD_OP keeps units gathered after a forward under torch.no_grad, as if a
    backward would come to free them."""

    def _post_forward(self, unit, out):
        if not self.reshard_after_forward and not torch.is_grad_enabled():
            return None
        return super()._post_forward(unit, out)


class BackwardPrefetchesForwardOrder(FSDP):
    """Backward prefetches the next unit in forward order, whose backward is already done:
    it is gathered again for nothing."""

    def _pre_backward(self, unit):
        self._gather(unit, set_views=False)
        self._prefetch(unit, +1)


class GathersEverythingUpFront(FSDP):
    """Forward starts gathering every unit before the first layer runs, as a wrapper that
    all-gathers the whole model in its forward and then computes: the whole model is held
    at once, where the handout bounds it to the layers two ahead."""

    def forward(self, *args, **kwargs):
        for unit in self._units:
            for flat in unit.flats:
                self._start_gather(flat)
        return super().forward(*args, **kwargs)


class _Target:
    """A target offering one FSDP class through the protocol's names."""

    def __init__(self, cls):
        self.cls = cls

    def get_fsdp(self, module, compute_dtype=None):
        return self.cls(module, compute_dtype=compute_dtype)

    def get_fsdp_strategy(self, module, strategy="FULL_SHARD", compute_dtype=None, reduce_dtype=None, unit_classes=None, shard_group_size=None):
        return self.cls(module, strategy=strategy, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype, unit_classes=unit_classes, shard_group_size=shard_group_size)

    @staticmethod
    def fsdp_on_after_backward(model, optimizer):
        model.finish_gradient_synchronization()

    @staticmethod
    def fsdp_gather_full_params(model):
        return model.gather_full_params()

    @staticmethod
    def fsdp_no_sync(model):
        return model.no_sync()


SPECS = (
    ("sum_not_mean", SumNotMean, "sharded gradients summed over ranks, not averaged", ("fsdp_trajectory_matches_one_process",)),
    ("padding_not_stripped", PaddingNotStripped, "gather returns a unit's last parameter with the padding on", ("fsdp_wider_models_match_one_process",)),
    ("replicated_never_averaged", ReplicatedNeverAveraged, "replicated (norm) gradients never averaged over ranks", ("fsdp_replicated_gradients_are_bit_identical", "fsdp_trajectory_matches_one_process")),
    ("last_reduction_not_waited", LastReductionNotWaited, "the last reduction issued is not waited for", ("fsdp_delayed_collectives_change_nothing",)),
    ("full_params_never_freed", FullParamsNeverFreed, "gathered buffers never released", ("fsdp_memory_at_rest_is_sharded",)),
    ("grads_in_compute_dtype", GradsInComputeDtype, "gradients reduced and left in the compute dtype", ("fsdp_dtypes_fp32_master_compute_dtype_communication",)),
    ("optimizer_steps_compute_dtype", OptimizerStepsComputeDtype, "the optimizer steps compute-dtype shards, no fp32 master", ("fsdp_dtypes_fp32_master_compute_dtype_communication",)),
    ("shard_offset_off_by_one", ShardOffsetOffByOne, "shard offsets off by one on ranks above 0", ("fsdp_shards_partition_the_parameters", "fsdp_trajectory_matches_one_process")),
    ("tied_weight_reduced_twice", TiedWeightReducedTwice, "a tied weight's gradient reduced twice", ("fsdp_wider_models_match_one_process",)),
    ("gathers_in_fp32", GathersInFp32, "forward gathers fp32 shards and casts after", ("fsdp_dtypes_fp32_master_compute_dtype_communication",)),
    ("gathered_copies_saved_for_backward", GatheredCopiesSavedForBackward, "layers compute with copies of the gathered buffers, which autograd holds until backward",
     ("fsdp_full_shard_frees_after_forward", "fsdp_autograd_holds_no_gathered_weights_after_forward")),
    ("never_reshard_after_forward", NeverReshardAfterForward, "FULL_SHARD keeps units gathered between forward and backward", ("fsdp_full_shard_frees_after_forward",)),
    ("no_sync_drops_accumulated", NoSyncDropsAccumulated, "the synced backward forgets what no_sync accumulated", ("fsdp_no_sync_accumulation_matches",)),
    ("shard_grad_op_reduces_in_compute_dtype", ShardGradOpReducesInComputeDtype, "SHARD_GRAD_OP reduces in bf16/fp16, FULL_SHARD in fp32", ("fsdp_strategies_give_the_same_bits",)),
    ("reduces_in_compute_dtype", ReducesInComputeDtype, "gradients reduce-scattered in fp16/bf16, stored as fp32", ("fsdp_gradients_reduced_in_fp32",)),
    ("frees_only_at_finish", FreesOnlyAtFinish, "units freed at on_after_backward, not after their backward", ("fsdp_frees_after_backward_and_evaluation", "fsdp_strategies_match_one_process")),
    ("evaluation_keeps_gathered", EvaluationKeepsGathered, "SHARD_GRAD_OP keeps units gathered after a no_grad forward", ("fsdp_strategies_match_one_process",)),
    ("backward_prefetches_forward_order", BackwardPrefetchesForwardOrder, "backward prefetches in forward order, re-gathering finished units", ("fsdp_backward_gathers_no_more_than_forward",)),
    ("gathers_everything_up_front", GathersEverythingUpFront, "forward gathers every unit before the first layer runs", ("fsdp_forward_gathers_at_most_two_layers_ahead",)),
    ("hybrid_replicas_not_reduced", HybridReplicasNotReduced, "HYBRID_SHARD never reduces across replica groups", ("fsdp_strategies_match_one_process",)),
)

for _name, _cls, _bug, _laws in SPECS:
    globals()[_name] = _Target(_cls)

MUTANTS = tuple(Mutant(name, "FSDP", bug, caught_by, target=f"{__name__}:{name}") for name, _, bug, caught_by in SPECS)
