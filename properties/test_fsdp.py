"""FSDP laws against ``--target`` (the CS336 2026 names; the API tier also uses
``get_fsdp_strategy`` and ``fsdp_no_sync``).  Laws, models, reference and checks live in
``conformance/laws/fsdp/``; each example runs one case on a live pool of ranks (gloo on
the CPU, world sizes 1 to 4; NCCL on GPUs) within the law's time budget
(``conformance.lawbook.BudgetedLaw``: 60 s under the ci profile).  ``test_contract_*``
are the CS336 contract tier (its shapes, fp32/fp16, SGD); the others are extras of the
wider API."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from conformance.laws.fsdp.laws import LAWS_BY_NAME
from conformance.lawbook import BudgetedLaw
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


def _run(law_name: str, target, max_examples: int | None = None) -> None:
    law = BudgetedLaw(LAWS_BY_NAME[law_name])  # a verdict in about a minute under the ci profile

    @given(case=law.cases())
    def run(case):
        law.check(target.spec, case)

    if max_examples is not None:
        run = settings(max_examples=max_examples)(run)
    law.run(run)


def test_contract_gathered_parameters_match_one_process_trained_on_the_whole_batch(target):
    _run("fsdp_trajectory_matches_one_process", target)


def test_contract_each_rank_holds_its_share_and_the_shards_are_exactly_the_full_parameters(target):
    _run("fsdp_shards_partition_the_parameters", target)


def test_contract_master_weights_and_gradients_are_fp32_and_forward_communicates_in_the_compute_dtype(target):
    _run("fsdp_dtypes_fp32_master_compute_dtype_communication", target)


def test_contract_replicated_parameters_get_bit_identical_gradients_on_every_rank(target):
    _run("fsdp_replicated_gradients_are_bit_identical", target)


def test_contract_at_rest_no_full_parameter_is_held_and_bytes_are_total_over_w_plus_the_largest(target):
    _run("fsdp_memory_at_rest_is_sharded", target)


def test_contract_forward_gathers_a_layer_only_once_the_layer_two_before_it_has_run(target):
    # a mechanical check: an up-front gather shows in any example deep enough, and every one is
    _run("fsdp_forward_gathers_at_most_two_layers_ahead", target, examples(6))


def test_tied_frozen_adamw_and_bf16_models_match_one_process(target):
    _run("fsdp_wider_models_match_one_process", target)


def test_every_sharding_strategy_matches_one_process_within_its_memory_bound(target):
    _run("fsdp_strategies_match_one_process", target)


def test_full_shard_frees_every_unit_but_the_root_after_forward(target):
    _run("fsdp_full_shard_frees_after_forward", target)


def test_after_forward_autograd_holds_no_gathered_weight_only_activations(target):
    _run("fsdp_autograd_holds_no_gathered_weights_after_forward", target, max_examples=examples(4))


def test_full_shard_shard_grad_op_and_no_shard_give_the_same_bits(target):
    _run("fsdp_strategies_give_the_same_bits", target)


def test_a_delay_before_every_collective_on_one_rank_changes_no_bit(target):
    _run("fsdp_delayed_collectives_change_nothing", target)


def test_no_sync_micro_batches_then_a_synced_one_match_one_step_on_their_concatenation(target):
    _run("fsdp_no_sync_accumulation_matches", target)


def test_gradients_are_reduced_in_fp32_whatever_the_compute_dtype(target):
    _run("fsdp_gradients_reduced_in_fp32", target, examples(6))  # a mechanical check: its bugs show in any example


def test_no_unit_but_the_root_stays_gathered_after_backward_or_an_evaluation_forward(target):
    _run("fsdp_frees_after_backward_and_evaluation", target, examples(6))  # a mechanical check: its bugs show in any example


def test_backward_all_gathers_no_more_than_forward(target):
    _run("fsdp_backward_gathers_no_more_than_forward", target, examples(6))  # a mechanical check: its bugs show in any example
