"""Tensor-parallel laws against ``--target`` (``conformance/laws/tensor_parallel``).

Each example runs one case on a live pool of rank processes (gloo on the CPU, world sizes
1 to 4; NCCL on GPUs, up to the number of GPUs) and compares with the dense module run in
float64 and float32 in this process, through the oracle.  A law whose factories the target
lacks is reported "not offered"; the collective-count laws need 2 ranks, the subgroup law 3.
A case the target declines (a verdict) does not stop the law: the other cases still run, and
the law then reads skipped with the verdict's reason.  Sources of every pinned quantity are
in ``conformance/laws/tensor_parallel/laws.py``.
"""

from __future__ import annotations

import pytest

from conformance.laws.tensor_parallel.laws import LAWS_BY_NAME, check_law
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


# Examples per law in the ci profile (scaled for the others): whole-model laws train a
# model on every rank and differentiate it per token in the reference, so they draw fewer.
CI_EXAMPLES = {"tensor_parallel_gpt_matches_the_dense_model_over_optimizer_steps": 5,
               "sequence_parallel_gpt_matches_the_dense_model_over_optimizer_steps": 4,
               "tensor_parallel_block_matches_the_dense_block": 8,
               "sequence_parallel_block_matches_the_dense_block": 6,
               # 3 or 4 ranks an example; the spec cases hold one of each entry point
               "every_entry_point_on_a_subgroup_shards_by_group_rank_and_matches_the_dense_module": 6,
               "mlp_does_one_all_reduce_forward_and_one_backward": 6}


def _law(name):
    law = LAWS_BY_NAME[name]

    def run(target):
        check_law(law, target.spec, go_on_after_verdicts=True, max_examples=examples(CI_EXAMPLES.get(name, 12)))

    return run


def test_column_parallel_linear_output_shards_and_gradients_equal_the_dense_layer(target):
    _law("column_parallel_linear_matches_the_dense_layer")(target)


def test_row_parallel_linear_output_and_gradients_equal_the_dense_layer_with_the_bias_added_once(target):
    _law("row_parallel_linear_matches_the_dense_layer_with_the_bias_added_once")(target)


def test_vocab_parallel_embedding_looks_up_every_id_as_the_dense_table_does(target):
    _law("vocab_parallel_embedding_matches_the_dense_table_for_every_id")(target)


def test_vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits(target):
    _law("vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits")(target)


def test_vocab_parallel_cross_entropy_is_invariant_to_adding_a_constant_to_all_logits(target):
    _law("vocab_parallel_cross_entropy_is_invariant_to_adding_a_constant_to_all_logits")(target)


def test_vocab_parallel_cross_entropy_stays_finite_and_right_for_huge_logits(target):
    _law("vocab_parallel_cross_entropy_stays_finite_for_huge_logits")(target)


def test_tensor_parallel_block_output_and_gradients_equal_the_dense_block(target):
    _law("tensor_parallel_block_matches_the_dense_block")(target)


def test_tensor_parallel_gpt_losses_gradients_and_parameters_after_steps_equal_the_dense_model(target):
    _law("tensor_parallel_gpt_matches_the_dense_model_over_optimizer_steps")(target)


def test_every_entry_point_on_a_subgroup_shards_by_group_rank_and_matches_the_dense_module(target):
    _law("every_entry_point_on_a_subgroup_shards_by_group_rank_and_matches_the_dense_module")(target)


def test_mlp_does_at_most_one_collective_each_way_and_the_block_two(target):
    _law("mlp_and_block_do_at_most_megatrons_collectives_each_way")(target)


def test_mlp_does_exactly_one_all_reduce_forward_and_one_backward_and_the_block_two(target):
    _law("mlp_does_one_all_reduce_forward_and_one_backward")(target)


def test_sequence_parallel_block_output_and_gradients_equal_the_dense_block(target):
    _law("sequence_parallel_block_matches_the_dense_block")(target)


def test_sequence_parallel_block_all_gathers_and_reduce_scatters_instead_of_all_reducing(target):
    _law("sequence_parallel_block_all_gathers_and_reduce_scatters_instead_of_all_reducing")(target)


def test_sequence_parallel_gpt_matches_the_dense_model_over_optimizer_steps(target):
    _law("sequence_parallel_gpt_matches_the_dense_model_over_optimizer_steps")(target)
