"""Deliberately broken gradient scalers: the suite must reject every one.

Each mutant is a target (``--target conformance.mutants.grad_scaler:flag_not_all_reduced``)
offering ``get_distributed_grad_scaler`` and ``first_nonfinite_gradient`` with one decision
changed from ``impl.amp``.  Each names the laws (``conformance.laws.grad_scaler.laws``)
that must reject it.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch.distributed as dist

import impl
from conformance.lawbook import Mutant
from impl.amp.grad_scaler import UNSCALED, DistributedGradScaler
from impl.amp.nonfinite import local_first_nonfinite

CAPABILITY = "gradient scaler"


class _NotAllReduced(DistributedGradScaler):
    def _agree(self, flag):
        return flag  # BUG: each rank decides from its own gradients


class _ReadBeforeWait(DistributedGradScaler):
    def _agree(self, flag):
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        seen = flag.clone()  # BUG: read while the all-reduce is still in flight
        work.wait()
        return seen


class _StepSaysItStepped(DistributedGradScaler):
    def step(self, optimizer, *args, **kwargs):
        super().step(optimizer, *args, **kwargs)
        return True  # BUG: a skipped step reports True, so the LR scheduler steps on it


class _UnscaleTwice(DistributedGradScaler):
    def unscale_(self, optimizer):
        super().unscale_(optimizer)
        self._state(optimizer)["stage"] = "ready"  # BUG: forgets it unscaled: step (or a second call) divides again


class _ClipLocalNorm(DistributedGradScaler):
    def _sharded_square_sum(self, local):
        return local  # BUG: each rank clips by the norm of its own shards


class _GrowthCounterKept(DistributedGradScaler):
    def update(self):
        tracker = self._growth_tracker
        found = any(self._found_inf(s) for s in self._per_optimizer.values() if s["found_inf"] is not None)
        super().update()
        if found:
            self._growth_tracker = tracker  # BUG: an overflow does not reset the count of clean steps


class _BackoffByOneOverGrowth(DistributedGradScaler):
    def update(self):
        scale = self._scale
        found = any(self._found_inf(s) for s in self._per_optimizer.values() if s["found_inf"] is not None)
        super().update()
        if found:
            self._scale = scale / self.growth_factor  # BUG: backoff_factor ignored (right only when it is 1/growth)


class _NoneGradsNotSkipped(DistributedGradScaler):
    def unscale_(self, optimizer):
        state = self._state(optimizer)
        if state["stage"] != "ready":
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]]  # BUG: None gradients kept
        state["found_inf"] = self._agree(self._unscale_grads(grads))
        state["stage"] = UNSCALED


class _OneStageForAll(DistributedGradScaler):
    def _state(self, optimizer):
        return self._per_optimizer.setdefault(0, {"stage": "ready", "found_inf": None})  # BUG: not per optimizer


class _UpdateReadsTheLastOptimizer(DistributedGradScaler):
    def update(self):
        states = [s for s in self._per_optimizer.values() if s["found_inf"] is not None]
        if states:
            self._per_optimizer = {0: states[-1]}  # BUG: an overflow in an earlier optimizer is forgotten
        super().update()


class _OneSkipForAll(DistributedGradScaler):
    def _found_inf(self, state):
        found = [s["found_inf"] for s in self._per_optimizer.values() if s["found_inf"] is not None]
        return any(bool(f.item() > 0) for f in found)  # BUG: every optimizer skips when any found one


class _AgreesOverTheWorld(DistributedGradScaler):
    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval, group=None):
        super().__init__(init_scale, growth_factor, backoff_factor, growth_interval, None)  # BUG: group dropped


def _first_nonfinite_over_the_world(model, group=None):
    return impl.first_nonfinite_gradient(model, None)  # BUG: group dropped


def _first_nonfinite_local(model, group=None):
    named = list(model.named_parameters())
    i = local_first_nonfinite(named)  # BUG: no agreement across ranks
    return None if i is None else named[i][0]


def _scaler_target(cls):
    def make(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
        return cls(init_scale, growth_factor, backoff_factor, growth_interval, group)

    return SimpleNamespace(get_distributed_grad_scaler=make, first_nonfinite_gradient=impl.first_nonfinite_gradient)


flag_not_all_reduced = _scaler_target(_NotAllReduced)
flag_read_before_the_all_reduce_finished = _scaler_target(_ReadBeforeWait)
scheduler_steps_on_a_skipped_step = _scaler_target(_StepSaysItStepped)
unscale_applied_twice = _scaler_target(_UnscaleTwice)
clipping_on_local_shard_norms = _scaler_target(_ClipLocalNorm)
growth_counter_not_reset_on_overflow = _scaler_target(_GrowthCounterKept)
backoff_by_one_over_growth = _scaler_target(_BackoffByOneOverGrowth)
none_gradients_not_passed_over = _scaler_target(_NoneGradsNotSkipped)
one_stage_for_all_optimizers = _scaler_target(_OneStageForAll)
update_reads_only_the_last_optimizer = _scaler_target(_UpdateReadsTheLastOptimizer)
one_skip_decision_for_all_optimizers = _scaler_target(_OneSkipForAll)
group_ignored = SimpleNamespace(get_distributed_grad_scaler=_scaler_target(_AgreesOverTheWorld).get_distributed_grad_scaler,
                                first_nonfinite_gradient=_first_nonfinite_over_the_world)
first_nonfinite_answered_locally = SimpleNamespace(get_distributed_grad_scaler=impl.get_distributed_grad_scaler,
                                                   first_nonfinite_gradient=_first_nonfinite_local)

SKIP = "nonfinite_on_one_rank_skips_everywhere_keeps_state_and_backs_off"
TWO = "each_of_two_optimizers_skips_on_its_own_gradients_and_update_backs_off_once"


def _m(name, bug, caught_by):
    return Mutant(name, CAPABILITY, bug, tuple(caught_by), f"conformance.mutants.grad_scaler:{name}")


MUTANTS = (
    _m("flag_not_all_reduced", "the non-finite flag is not all-reduced: only the rank that saw the Inf skips",
       [SKIP, "fsdp_shard_overflow_on_one_rank_skips_everywhere"]),
    _m("flag_read_before_the_all_reduce_finished", "the flag is read before the async all-reduce is waited on", [SKIP]),
    _m("scheduler_steps_on_a_skipped_step", "step returns True on a skipped step, so the LR scheduler steps", [SKIP]),
    _m("unscale_applied_twice", "an explicit unscale_ is not remembered: step divides by the scale again",
       ["unscale_gives_the_scaled_gradient_times_the_inverse_scale_exactly", "a_second_unscale_before_update_raises",
        "power_of_two_scale_trains_bit_for_bit_like_no_scaling",
        "no_sync_accumulation_with_scaling_equals_the_big_batch_and_skips_as_one"]),
    _m("clipping_on_local_shard_norms", "clipping uses each rank's local shard norm, not the global norm",
       ["clipping_after_unscale_uses_the_global_norm_across_ranks_and_shards"]),
    _m("growth_counter_not_reset_on_overflow", "an overflow backs the scale off but keeps the count of clean steps",
       ["scale_grows_after_growth_interval_clean_steps_and_overflow_resets_the_count"]),
    _m("backoff_by_one_over_growth", "an overflow divides the scale by growth_factor instead of multiplying by backoff_factor",
       ["scale_grows_after_growth_interval_clean_steps_and_overflow_resets_the_count"]),
    _m("none_gradients_not_passed_over", "unscale_ hands a parameter without a gradient (None) to the unscale kernel",
       ["spec:frozen_and_unused_parameters_are_passed_over"]),
    _m("one_stage_for_all_optimizers", "one unscale_/step stage for the scaler, not one per optimizer: the second "
       "optimizer's unscale_ raises", [TWO, "spec:two_optimizers_each_skip_on_their_own_gradients"]),
    _m("update_reads_only_the_last_optimizer", "update() decides on the last optimizer's flag: an overflow in an earlier "
       "one does not back the scale off", ["spec:two_optimizers_each_skip_on_their_own_gradients"]),
    _m("one_skip_decision_for_all_optimizers", "every optimizer skips when any one found a non-finite gradient",
       ["spec:two_optimizers_each_skip_on_their_own_gradients"]),
    _m("group_ignored", "the scaler and first_nonfinite_gradient agree over the world, not the group they are given",
       ["each_group_of_other_ranks_decides_its_own_skip_and_first_nonfinite_gradient"]),
    _m("first_nonfinite_answered_locally", "first_nonfinite_gradient answers from the local gradients only",
       ["first_nonfinite_gradient_is_the_same_first_parameter_on_every_rank"]),
)
