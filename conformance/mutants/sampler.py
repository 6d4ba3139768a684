"""Deliberately broken distributed samplers and joins: the suite must reject every one.

Each mutant is a target (``--target conformance.mutants.sampler:epoch_ignored``) offering
``get_distributed_sampler`` (and ``ddp_join``) with one decision changed from
``impl.data``.  Each names the laws (``conformance.laws.sampler.laws``) that must reject it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

import impl
from conformance.lawbook import Mutant
from impl.data.join import _Join
from impl.data.sampler import DistributedSampler

CAPABILITY = "distributed sampler"


class _SeededPerRank(DistributedSampler):
    def order(self):
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch + 7919 * self.rank)  # BUG: each rank its own shuffle
        return torch.randperm(self.dataset_len, generator=g).tolist()


class _PaddingFromTheEnd(DistributedSampler):
    def padded(self):
        order = self.order()
        if self.drop_last:
            return order[: self.total_size]
        missing = self.total_size - len(order)
        if missing > 0:
            cycled = order * math.ceil(missing / len(order))
            order = order + cycled[len(cycled) - missing:]  # BUG: repeats the END of the order
        return order


class _NoPadding(DistributedSampler):
    def padded(self):
        order = self.order()
        return order[: self.total_size] if self.drop_last else order  # BUG: the last ranks come up short


class _ShuffledAnyway(DistributedSampler):
    def order(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)  # BUG: shuffle=False is ignored
        return torch.randperm(self.dataset_len, generator=g).tolist()


class _EpochIgnored(DistributedSampler):
    def order(self):
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator()
        g.manual_seed(self.seed)  # BUG: set_epoch has no effect
        return torch.randperm(self.dataset_len, generator=g).tolist()


class _ShareCachedAtFirstIteration(DistributedSampler):
    def __iter__(self):
        if not hasattr(self, "_share"):  # BUG: later set_epoch calls on this object change nothing
            self._share = self.padded()[self.rank : self.total_size : self.num_replicas]
        return iter(self._share)


class _SeedIgnored(DistributedSampler):
    def order(self):
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator()
        g.manual_seed(self.epoch)  # BUG: the user's seed plays no part
        return torch.randperm(self.dataset_len, generator=g).tolist()


class _DropsTheSameTail(DistributedSampler):
    def order(self):
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        n = self.total_size if self.drop_last else self.dataset_len
        return torch.randperm(n, generator=g).tolist()  # BUG: with drop_last, indices T..N-1 never appear


class _RankEqualToReplicasAccepted(DistributedSampler):
    def __init__(self, dataset_len, num_replicas, rank, **kwargs):
        # BUG: checks rank > num_replicas, so rank == num_replicas gets through
        super().__init__(dataset_len, num_replicas, 0 if rank == num_replicas else rank, **kwargs)
        self.rank = rank


def _sampler_target(cls):
    def make(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        return cls(dataset_len, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)

    return SimpleNamespace(get_distributed_sampler=make, ddp_join=impl.ddp_join)


class _JoinThatLeaves(_Join):
    def __exit__(self, exc_type, exc, tb):
        self._handle.remove()
        return False  # BUG: a rank out of data stops taking part; the others wait in a collective


seeded_per_rank = _sampler_target(_SeededPerRank)
padding_from_the_end = _sampler_target(_PaddingFromTheEnd)
no_padding = _sampler_target(_NoPadding)
epoch_ignored = _sampler_target(_EpochIgnored)
shuffled_without_shuffle = _sampler_target(_ShuffledAnyway)
share_cached_at_first_iteration = _sampler_target(_ShareCachedAtFirstIteration)
seed_ignored = _sampler_target(_SeedIgnored)
drops_the_same_tail = _sampler_target(_DropsTheSameTail)
rank_equal_to_replicas_accepted = _sampler_target(_RankEqualToReplicasAccepted)
joined_rank_stops_participating = SimpleNamespace(get_distributed_sampler=impl.get_distributed_sampler,
                                                  ddp_join=lambda model: _JoinThatLeaves(model))


def _m(name, bug, caught_by):
    return Mutant(name, CAPABILITY, bug, tuple(caught_by), f"conformance.mutants.sampler:{name}")


MUTANTS = (
    _m("seeded_per_rank", "the shuffle is seeded per rank: ranks disagree on the order",
       ["shares_cover_every_index_and_pad_to_equal_lengths"]),
    _m("padding_from_the_end", "padding repeats the end of the order instead of its start: torch's documentation "
       "allows it, torch's own rule (the extra) does not",
       ["padding_repeats_the_start_of_the_order_as_torch_does", "without_shuffle_rank_r_gets_the_strided_order"]),
    _m("no_padding", "no padding: when N % R != 0 the last ranks get one index fewer than len() says",
       ["len_is_ceil_n_over_r_or_floor_with_drop_last", "shares_cover_every_index_and_pad_to_equal_lengths"]),
    _m("shuffled_without_shuffle", "shuffle=False is ignored: the order is shuffled anyway",
       ["without_shuffle_the_shares_keep_the_dataset_order_for_every_seed_and_epoch"]),
    _m("epoch_ignored", "set_epoch is ignored: every epoch has the same order",
       ["same_seed_and_epoch_repeat_and_the_next_epoch_reorders"]),
    _m("share_cached_at_first_iteration", "the share is computed at the first iteration and kept: set_epoch on a kept sampler changes nothing",
       ["a_sampler_kept_across_epochs_follows_set_epoch"]),
    _m("seed_ignored", "the shuffle is seeded with the epoch alone: every seed gives the same orders",
       ["another_seed_gives_another_order"]),
    _m("drops_the_same_tail", "with drop_last the permutation is of range(T): indices T..N-1 are dropped every epoch",
       ["drop_last_drops_another_tail_each_epoch"]),
    _m("rank_equal_to_replicas_accepted", "a rank equal to num_replicas is accepted (an off-by-one in the range check)",
       ["a_rank_outside_0_to_r_is_a_value_error"]),
    _m("joined_rank_stops_participating", "a rank out of batches leaves the join instead of shadowing the collectives",
       ["uneven_batches_finish_and_equal_the_join_rule"]),
)
