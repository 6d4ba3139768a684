"""Deliberately broken sharded optimizers (ZeRO-1): the suite must reject every one.

Each mutant is ``impl.zero.optimizer.ShardedOptimizer`` with one classic bug, as a
target: ``--target conformance.mutants.sharded_optimizer:no_sync_after_step``.  Each names
the laws (``conformance.laws.zero.laws``) that exist to catch it;
``conformance/selftests/test_sharded_optimizer_mutants.py`` checks that every one of them does.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from impl.zero.param_sync import BroadcastSync, NoSync
from impl.zero.optimizer import ShardedOptimizer

from conformance.lawbook import Mutant


class NoSyncAfterStep(ShardedOptimizer):
    """Each rank updates its shard and never sends it: the others keep stale parameters."""

    def _rebuild_sync(self):
        super()._rebuild_sync()
        self._sync = NoSync()


class WrongOwnerBroadcasts(ShardedOptimizer):
    """The broadcast of each parameter comes from the next rank, not from its owner."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_cls, sync="broadcast", **kwargs)

    def _rebuild_sync(self):
        super()._rebuild_sync()
        if isinstance(self._sync, BroadcastSync):
            ranks = self._global_ranks
            self._sync.global_ranks = ranks[1:] + ranks[:1]


class SyncBeforeStep(ShardedOptimizer):
    """Parameters are sent before the local update (the update never reaches the others)."""

    @torch.no_grad()
    def step(self, closure=None):
        self._push_hyperparameters()
        works = [w for i in range(len(self._rounds)) for w in self._sync.launch(i)]
        for w in works:
            w.wait()
        self._local.step()


class _RoundingSync:
    """Wraps a sync: the owner rounds its updated parameters to bfloat16 before sending
    (a 'compressed' parameter broadcast)."""

    def __init__(self, inner, params, rounds, rank):
        self.inner, self.params, self.rounds, self.rank = inner, params, rounds, rank

    def prepare(self):
        self.inner.prepare()

    def launch(self, round_index):
        for i in self.rounds[round_index].buckets[self.rank]:
            p = self.params[i]
            p.data.copy_(p.data.to(torch.bfloat16).to(p.dtype))
        return self.inner.launch(round_index)


class LossySync(ShardedOptimizer):
    """Parameters travel (and are kept) rounded to bfloat16."""

    def _rebuild_sync(self):
        super()._rebuild_sync()
        self._sync = _RoundingSync(self._sync, self._params, self._rounds, self.rank)


class StateForEveryParameter(ShardedOptimizer):
    """Every rank's local optimizer covers all parameters: right values, no memory saved."""

    def _local_group(self, group, offset=None):
        return {**{k: v for k, v in group.items() if k != "params"}, "params": list(group["params"])}


class GroupOptionsDropped(ShardedOptimizer):
    """Each shard's local groups keep their parameters but not their own hyperparameters:
    every group runs at the optimizer's defaults."""

    def _local_group(self, group, offset=None):
        return {"params": super()._local_group(group, offset)["params"]}

    def _push_hyperparameters(self):
        pass  # (impl copies every group's options to the shard before each step; this one never does)


class EverythingOnRankZero(ShardedOptimizer):
    """The assignment puts every parameter on rank 0: rank 0 holds all the state."""

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if self._local is None:  # during construction: reassign before the local optimizer exists
            self._owner = [0] * len(self._owner)


class NewGroupNeverAssigned(ShardedOptimizer):
    """A group added after construction joins param_groups but no rank ever updates it."""

    def add_param_group(self, param_group):
        if self._local is None:
            return super().add_param_group(param_group)
        torch.optim.Optimizer.add_param_group(self, param_group)


class HyperparametersNotPropagated(ShardedOptimizer):
    """Edits to param_groups (an LR scheduler) never reach the local optimizer."""

    def _push_hyperparameters(self):
        pass


class ConsolidationKeepsOnlyOwnShard(ShardedOptimizer):
    """consolidated_state_dict returns the receiving rank's shard only."""

    def consolidated_state_dict(self, to=0):
        if to is not None and self.rank != to:
            return None
        return {"state": self._shard_state(), "param_groups": self._global_groups()}


class LoadIgnoresSavedState(ShardedOptimizer):
    """load_state_dict restores the hyperparameters and drops the saved state."""

    def load_state_dict(self, state_dict):
        super().load_state_dict({**state_dict, "state": {}})


class ZeroGradKeepsZeroTensors(ShardedOptimizer):
    """zero_grad zeroes every gradient in place whatever set_to_none asks."""

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=False)


class ZeroGradOnlyOwned(ShardedOptimizer):
    """zero_grad clears only the gradients of the parameters this rank owns."""

    def zero_grad(self, set_to_none=True):
        self._local.zero_grad(set_to_none=set_to_none)


@dataclass(frozen=True)
class BrokenOptimizer:
    name: str
    cls: type
    bug: str
    caught_by: tuple[str, ...]

    def target(self):
        cls = self.cls
        return SimpleNamespace(get_sharded_optimizer=lambda params, optimizer_cls, **kw: cls(params, optimizer_cls, **kw), __name__=f"mutant:{self.name}")


SPECS = (
    BrokenOptimizer("no_sync_after_step", NoSyncAfterStep, "no parameter sync after the step",
                    ("matches_unsharded_bit_for_bit", "contract_matches_unsharded_bit_for_bit")),
    BrokenOptimizer("wrong_owner_broadcasts", WrongOwnerBroadcasts, "a non-owner broadcasts each parameter", ("matches_unsharded_bit_for_bit",)),
    BrokenOptimizer("sync_before_step", SyncBeforeStep, "sync runs before the local update", ("matches_unsharded_bit_for_bit",)),
    BrokenOptimizer(
        "lossy_sync",
        LossySync,
        "parameters rounded to bf16 for the sync",
        ("matches_unsharded_bit_for_bit", "matches_float64_within_oracle_across_implementations"),
    ),
    BrokenOptimizer("state_for_every_parameter", StateForEveryParameter, "state kept for all parameters", ("state_bytes_at_most_a_share_plus_largest",)),
    BrokenOptimizer("group_options_dropped", GroupOptionsDropped, "per-group lr and weight decay dropped on the shards",
                    ("spec:contract_parameter_groups_with_their_own_hyperparameters_match_unsharded",
                     "contract_matches_unsharded_bit_for_bit")),
    BrokenOptimizer("everything_on_rank_zero", EverythingOnRankZero, "rank 0 owns everything", ("state_bytes_at_most_a_share_plus_largest",)),
    BrokenOptimizer("new_group_never_assigned", NewGroupNeverAssigned, "an added group is never assigned", ("add_param_group_mid_training_matches_unsharded",)),
    BrokenOptimizer(
        "hyperparameters_not_propagated",
        HyperparametersNotPropagated,
        "param_groups edits never reach the shard",
        ("hyperparameter_edits_reach_every_shard", "spec:is_an_optimizer_whose_param_groups_list_every_parameter"),
    ),
    BrokenOptimizer(
        "consolidation_keeps_only_own_shard",
        ConsolidationKeepsOnlyOwnShard,
        "consolidated state holds one shard",
        ("consolidated_state_dict_is_a_plain_optimizers", "consolidated_state_dict_resumes_at_any_world_size"),
    ),
    BrokenOptimizer(
        "load_ignores_saved_state",
        LoadIgnoresSavedState,
        "load_state_dict drops the state",
        ("per_rank_state_dict_round_trips", "consolidated_state_dict_resumes_at_any_world_size"),
    ),
    BrokenOptimizer("zero_grad_keeps_zero_tensors", ZeroGradKeepsZeroTensors, "zero_grad() zeroes the gradients in place, ignoring set_to_none=True", ("zero_grad_clears_every_gradient",)),
    BrokenOptimizer("zero_grad_only_owned", ZeroGradOnlyOwned, "zero_grad leaves non-owned gradients", ("zero_grad_clears_every_gradient",)),
)
MUTANTS = tuple(Mutant(m.name, "sharded optimizer", m.bug, m.caught_by, target=f"{__name__}:{m.name}") for m in SPECS)

globals().update({m.name: m.target() for m in SPECS})
