"""Fixed tensor-parallel spec cases: the conformance job's rows for tensor parallelism.

There is no course handout for tensor parallelism; the contract is this project's protocol
(``conformance/target.py``, tensor-parallelism section), whose every pinned quantity has its
source named in ``conformance/laws/tensor_parallel/laws.py``: values are the dense module's
(Megatron-LM section 3, torch's ``tensor.parallel``), shards follow torch's ``Shard``
layout, the number of collectives is bounded by Megatron-LM's (their exact kinds are an
extra).  Each case is one fixed example of a law at world size 2, 3 or 4 (gloo on the CPU;
on GPUs skipped as "needs N GPUs" where fewer are present), checked the same way; the
subgroup cases run each entry point on a group whose ranks are not the global ones.
"""

from __future__ import annotations

import pytest

from conformance.harness import require_world_size
from conformance.laws.tensor_parallel.laws import LAWS_BY_NAME
from conformance.laws.tensor_parallel.strategies import (BlockCase, CrossEntropyCase, EmbeddingCase, LinearCase, ModelCase,
                                                          SubgroupCase)

pytestmark = pytest.mark.distributed


def _run(law_name, target, case):
    require_world_size(case.world_size)
    LAWS_BY_NAME[law_name].check(target.spec, case)


def _ce(w, vocab, reduction, n_ignored=0, ignore_index=-100, scale=1.0, shift=0.0):
    return CrossEntropyCase(w, 11, vocab, 2 * w + 6, (2, w + 3), reduction, ignore_index, n_ignored, scale, shift, "float32")


# --- layers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel_linear_with_bias_at_2_ranks(target, gather_output):
    _run("column_parallel_linear_matches_the_dense_layer", target, LinearCase(2, 1, (2, 3), 6, 8, True, gather_output))


@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_linear_adds_its_bias_once_at_2_ranks(target, input_is_parallel):
    _run("row_parallel_linear_matches_the_dense_layer_with_the_bias_added_once", target, LinearCase(2, 2, (2, 3), 8, 5, True, input_is_parallel))


def test_row_parallel_linear_adds_its_bias_once_at_4_ranks(target):
    _run("row_parallel_linear_matches_the_dense_layer_with_the_bias_added_once", target, LinearCase(4, 3, (3,), 8, 4, True, True))


def test_vocab_parallel_embedding_divisible_vocabulary_at_2_ranks(target):
    _run("vocab_parallel_embedding_matches_the_dense_table_for_every_id", target, EmbeddingCase(2, 4, 8, 3, 2))


def test_vocab_parallel_embedding_vocabulary_not_divisible_by_4_ranks(target):
    _run("vocab_parallel_embedding_matches_the_dense_table_for_every_id", target, EmbeddingCase(4, 5, 10, 3, 2))


# --- cross-entropy -------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_vocab_parallel_cross_entropy_reductions_with_ignored_tokens_at_2_ranks(target, reduction):
    _run("vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits", target, _ce(2, 10, reduction, n_ignored=3))


def test_vocab_parallel_cross_entropy_mean_over_only_ignored_tokens_is_nan_with_zero_gradient_at_2_ranks(target):
    # as F.cross_entropy: the loss 0/0 is NaN, every logit's gradient 0 (not inf x 0 = NaN)
    _run("vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits", target, _ce(2, 10, "mean", n_ignored=2 * 2 + 6))


def test_vocab_parallel_cross_entropy_vocabulary_not_divisible_by_4_ranks(target):
    _run("vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits", target, _ce(4, 10, "mean", n_ignored=2, ignore_index=9))


def test_vocab_parallel_cross_entropy_with_an_empty_shard_at_4_ranks(target):
    # vocabulary 5 at 4 ranks: shards of 2, 2, 1 and 0 ids
    _run("vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits", target, _ce(4, 5, "mean"))


def test_vocab_parallel_cross_entropy_is_invariant_to_adding_4096_at_2_ranks(target):
    _run("vocab_parallel_cross_entropy_is_invariant_to_adding_a_constant_to_all_logits", target, _ce(2, 10, "mean", shift=4096.0))


def test_vocab_parallel_cross_entropy_stays_finite_for_logits_of_1e36_at_2_ranks(target):
    _run("vocab_parallel_cross_entropy_stays_finite_for_huge_logits", target, _ce(2, 10, "mean", scale=1e36))


# --- block and model -----------------------------------------------------------------------------


def test_tensor_parallel_block_at_2_ranks(target):
    _run("tensor_parallel_block_matches_the_dense_block", target, BlockCase(2, 6, 4, 4, 16, 2, 5, False))


def test_tensor_parallel_block_at_4_ranks(target):
    _run("tensor_parallel_block_matches_the_dense_block", target, BlockCase(4, 7, 2, 4, 8, 1, 4, False))


def test_mlp_and_block_do_at_most_megatrons_collectives_at_2_ranks(target):
    _run("mlp_and_block_do_at_most_megatrons_collectives_each_way", target, BlockCase(2, 8, 4, 2, 8, 1, 3, False))


def test_mlp_and_block_all_reduce_exactly_as_megatron_at_2_ranks(target):
    _run("mlp_does_one_all_reduce_forward_and_one_backward", target, BlockCase(2, 8, 4, 2, 8, 1, 3, False))


def test_tensor_parallel_gpt_two_sgd_steps_at_2_ranks(target):
    _run("tensor_parallel_gpt_matches_the_dense_model_over_optimizer_steps", target, ModelCase(2, 9, 4, 2, 8, 2, 11, 1, 4, "SGD", 2, -100))


# --- groups other than the world: group rank i is not global rank i -----------------------------

_SUBGROUP = "every_entry_point_on_a_subgroup_shards_by_group_rank_and_matches_the_dense_module"
SUBGROUP_CASES = {
    "column-ranks-1-2-of-3": SubgroupCase(3, (1, 2), "column", LinearCase(2, 21, (2,), 4, 5, True, False)),
    "column-gathered-ranks-0-2-of-3": SubgroupCase(3, (0, 2), "column", LinearCase(2, 22, (3,), 3, 6, True, True)),
    "row-ranks-1-3-of-4": SubgroupCase(4, (1, 3), "row", LinearCase(2, 23, (2,), 6, 3, True, True)),
    "embedding-ranks-1-2-of-3": SubgroupCase(3, (1, 2), "embedding", EmbeddingCase(2, 24, 7, 3, 2)),
    "cross-entropy-ranks-1-2-3-of-4": SubgroupCase(4, (1, 2, 3), "cross_entropy", _ce(3, 10, "mean", n_ignored=2)),
    "block-ranks-1-2-of-3": SubgroupCase(3, (1, 2), "block", BlockCase(2, 25, 2, 2, 4, 1, 3, False)),
    "gpt-ranks-2-3-of-4": SubgroupCase(4, (2, 3), "gpt", ModelCase(2, 26, 2, 2, 4, 1, 8, 1, 3, "SGD", 1, -100)),
}


@pytest.mark.parametrize("key", list(SUBGROUP_CASES))
def test_entry_point_on_a_subgroup(target, key):
    _run(_SUBGROUP, target, SUBGROUP_CASES[key])


# --- wider API: sequence parallelism --------------------------------------------------------------


def test_sequence_parallel_block_at_2_ranks(target):
    _run("sequence_parallel_block_matches_the_dense_block", target, BlockCase(2, 10, 4, 2, 8, 2, 4, True))


def test_sequence_parallel_block_collectives_at_2_ranks(target):
    _run("sequence_parallel_block_all_gathers_and_reduce_scatters_instead_of_all_reducing", target, BlockCase(2, 11, 4, 2, 8, 1, 4, True))
