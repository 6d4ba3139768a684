"""Activation checkpointing: every law of ``conformance.laws.checkpointing.laws`` against ``--target``.

Contract laws first (bit-for-bit gradients; the activation peak and the block forwards at
most what the strategy may cost, N 1..24, k 1..N), then the extras (the exact peak and
forwards of the reference plan, an input without grad, blocks with buffers and non-tensor
outputs, bad requests).
"""

import pytest

from conformance.laws.checkpointing.laws import LAWS_BY_NAME, check_law
from conformance.profiles import examples


def _law(name):
    return LAWS_BY_NAME[name]


def test_contract_gradients_and_loss_with_any_strategy_equal_no_checkpointing_bit_for_bit(target):
    check_law(_law("gradients_and_loss_equal_no_checkpointing_bit_for_bit"), target.spec, max_examples=examples(10))


def test_contract_activation_peak_seen_by_torchs_memory_tracker_is_at_most_the_bound(target):
    check_law(_law("activation_peak_is_at_most_the_bound"), target.spec, max_examples=examples(12))


def test_contract_block_forwards_counted_by_hooks_are_at_most_the_bound(target):
    check_law(_law("block_forwards_are_at_most_the_bound"), target.spec, max_examples=examples(12))


def test_exact_peak_of_the_reference_plan(target):
    check_law(_law("activation_peak_equals_the_reference_plans"), target.spec, max_examples=examples(4))


def test_exact_recomputation_of_the_reference_plan(target):
    check_law(_law("block_forwards_equal_the_reference_plans"), target.spec, max_examples=examples(4))


@pytest.mark.parametrize("law", ["input_without_grad_still_gives_parameter_gradients",
                                 "blocks_with_buffers_and_non_tensor_outputs_match_the_plain_stack",
                                 "bad_strategy_or_segment_size_is_a_clear_error"])
def test_extra(law, target):
    check_law(_law(law), target.spec, max_examples=examples(6))
