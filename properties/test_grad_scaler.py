"""Gradient scaler: every law of ``conformance.laws.grad_scaler.laws`` against ``--target``.

Each law trains a small MLP through impl's DDP wrappers (bucketed = ``get_ddp``, and
per-parameter) or impl's FSDP on 2 ranks (extras: 2..4) with the target's scaler, gloo on
the CPU and NCCL on GPUs, non-finite values injected on one rank only.
"""

import pytest

from conformance.laws.grad_scaler.laws import LAWS_BY_NAME, check_law
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


def _check(name, target, device, n):
    check_law(LAWS_BY_NAME[name], target.spec, device, max_examples=examples(n))


def test_contract_after_unscale_every_gradient_is_the_scaled_gradient_times_the_inverse_scale_bit_for_bit(target, device):
    _check("unscale_gives_the_scaled_gradient_times_the_inverse_scale_exactly", target, device, 6)


def test_contract_an_inf_or_nan_on_one_rank_skips_the_step_on_every_rank_keeps_state_and_backs_off(target, device):
    _check("nonfinite_on_one_rank_skips_everywhere_keeps_state_and_backs_off", target, device, 8)


def test_contract_on_two_groups_of_other_ranks_each_group_decides_its_own_skip_and_first_nonfinite_gradient(target, device):
    _check("each_group_of_other_ranks_decides_its_own_skip_and_first_nonfinite_gradient", target, device, 4)


def test_contract_without_overflow_a_power_of_two_scale_trains_bit_for_bit_like_no_scaling(target, device):
    _check("power_of_two_scale_trains_bit_for_bit_like_no_scaling", target, device, 6)


def test_contract_the_scale_grows_after_growth_interval_clean_steps_and_an_overflow_resets_the_count(target, device):
    _check("scale_grows_after_growth_interval_clean_steps_and_overflow_resets_the_count", target, device, 8)


def test_contract_a_second_unscale_before_update_raises(target, device):
    _check("a_second_unscale_before_update_raises", target, device, 3)


def test_contract_every_rank_names_the_same_first_parameter_with_a_nonfinite_gradient(target, device):
    _check("first_nonfinite_gradient_is_the_same_first_parameter_on_every_rank", target, device, 6)


def test_fsdp_a_nonfinite_shard_gradient_on_one_rank_skips_the_step_on_every_rank(target, device):
    _check("fsdp_shard_overflow_on_one_rank_skips_everywhere", target, device, 5)


def test_contract_two_optimizers_under_one_scaler_each_skip_on_their_own_gradients_and_the_scale_backs_off_once(target, device):
    _check("each_of_two_optimizers_skips_on_its_own_gradients_and_update_backs_off_once", target, device, 5)


def test_clipping_after_unscale_uses_the_global_norm_across_ranks_and_shards(target, device):
    _check("clipping_after_unscale_uses_the_global_norm_across_ranks_and_shards", target, device, 5)


def test_no_sync_accumulation_with_loss_scaling_equals_the_big_batch_and_one_overflow_skips_all(target, device):
    _check("no_sync_accumulation_with_scaling_equals_the_big_batch_and_skips_as_one", target, device, 5)
