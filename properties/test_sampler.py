"""Distributed sampler: every law of ``conformance.laws.sampler.laws`` against ``--target``.

The sampler laws are pure (each rank's sampler built in this process); the uneven-inputs
extra runs impl's DDP under the target's ``ddp_join`` on 2..4 ranks with different
numbers of batches, under a watchdog timeout.
"""

import pytest

from conformance.laws.sampler.laws import LAWS_BY_NAME, check_law
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


def _law(name):
    return LAWS_BY_NAME[name]


def test_contract_across_ranks_every_index_is_seen_each_epoch_and_padding_evens_the_shares(target):
    check_law(_law("shares_cover_every_index_and_pad_to_equal_lengths"), target.spec, max_examples=examples(60))


def test_contract_len_is_ceil_n_over_r_or_floor_n_over_r_with_drop_last_and_equals_what_it_yields(target):
    check_law(_law("len_is_ceil_n_over_r_or_floor_with_drop_last"), target.spec, max_examples=examples(40))


def test_contract_the_same_seed_and_epoch_repeat_the_order_and_the_next_epoch_changes_it(target):
    check_law(_law("same_seed_and_epoch_repeat_and_the_next_epoch_reorders"), target.spec, max_examples=examples(30))


def test_contract_without_shuffling_the_shares_keep_the_dataset_order_for_every_seed_and_epoch(target):
    check_law(_law("without_shuffle_the_shares_keep_the_dataset_order_for_every_seed_and_epoch"), target.spec,
              max_examples=examples(40))


def test_contract_a_sampler_kept_across_epochs_gives_after_set_epoch_what_a_fresh_one_gives(target):
    check_law(_law("a_sampler_kept_across_epochs_follows_set_epoch"), target.spec, max_examples=examples(30))


def test_torch_pads_with_the_start_of_the_order(target):
    check_law(_law("padding_repeats_the_start_of_the_order_as_torch_does"), target.spec, max_examples=examples(40))


def test_torch_without_shuffling_gives_rank_r_indices_r_r_plus_r_and_so_on(target):
    check_law(_law("without_shuffle_rank_r_gets_the_strided_order"), target.spec, max_examples=examples(30))


def test_another_seed_gives_another_order(target):
    check_law(_law("another_seed_gives_another_order"), target.spec, max_examples=examples(20))


def test_with_drop_last_and_shuffling_the_dropped_indices_change_between_epochs(target):
    check_law(_law("drop_last_drops_another_tail_each_epoch"), target.spec, max_examples=examples(15))


def test_a_rank_outside_0_to_r_is_a_value_error_naming_the_rank(target):
    check_law(_law("a_rank_outside_0_to_r_is_a_value_error"), target.spec, max_examples=examples(10))


def test_ranks_with_different_numbers_of_batches_finish_under_join_and_equal_the_documented_rule(target, device):
    check_law(_law("uneven_batches_finish_and_equal_the_join_rule"), target.spec, device, max_examples=examples(4))
