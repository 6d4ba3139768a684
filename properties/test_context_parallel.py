"""Context-parallel (ring attention) laws against ``--target`` (default: our ``impl``).

One test per law of ``conformance.laws.context_parallel.laws``; the merge and layout laws
run in this process, the ring laws on a live pool of rank processes (gloo on the CPU,
world sizes 1 to 4; NCCL on GPUs, up to the number of GPUs).  A target without the entry
points is reported "not offered".  The extras (API-tier laws) are listed in
``conformance/capabilities.py`` (``contract_except``).
"""

from __future__ import annotations

import pytest

from conformance.laws.context_parallel.laws import LAWS_BY_NAME, check_law


def _law(name, target, device):
    check_law(LAWS_BY_NAME[name], target.spec, device)


def test_merging_the_blocks_of_any_key_partition_in_any_order_gives_full_attention(target, device):
    _law("merged_blocks_of_any_key_partition_in_any_order_equal_full_attention", target, device)


def test_an_empty_partial_is_an_exact_identity_and_masked_partials_never_give_nan(target, device):
    _law("empty_partial_is_an_exact_identity_and_masked_partials_never_give_nan", target, device)


def test_shards_follow_the_layout_and_unshard_inverts_shard(target, device):
    _law("shards_follow_the_layout_and_unshard_inverts_shard", target, device)


def test_the_rope_positions_of_a_shard_are_the_slice_of_the_full_positions(target, device):
    _law("rope_positions_of_a_shard_are_the_slice_of_the_full_positions", target, device)


def test_zigzag_gives_every_rank_the_same_causal_work(target, device):
    _law("zigzag_gives_every_rank_the_same_causal_work", target, device)


@pytest.mark.distributed
def test_ring_output_logsumexp_and_gradients_equal_full_attention_on_the_whole_sequence(target, device):
    _law("ring_output_logsumexp_and_gradients_equal_full_attention", target, device)


@pytest.mark.distributed
def test_ring_results_do_not_depend_on_when_messages_arrive(target, device):
    _law("ring_results_do_not_depend_on_when_messages_arrive", target, device)


@pytest.mark.distributed
def test_the_ring_on_a_subgroup_of_other_global_ranks_equals_full_attention(target, device):
    _law("ring_on_a_subgroup_of_other_global_ranks_equals_full_attention", target, device)


@pytest.mark.distributed
def test_the_forward_moves_no_more_than_the_other_ranks_key_value_blocks(target, device):
    _law("forward_moves_no_more_than_the_other_ranks_key_value_blocks", target, device)


@pytest.mark.distributed
def test_fully_masked_causal_blocks_are_never_computed(target, device):
    _law("fully_masked_causal_blocks_are_never_computed", target, device)


@pytest.mark.distributed
def test_every_key_value_exchange_overlaps_a_block_computation(target, device):
    _law("every_key_value_exchange_overlaps_a_block_computation", target, device)


@pytest.mark.distributed
def test_the_forward_passes_w_minus_1_key_value_blocks_around_the_ring(target, device):
    _law("forward_passes_w_minus_1_key_value_blocks_around_the_ring", target, device)


@pytest.mark.distributed
def test_causal_chunk_blocks_above_the_diagonal_are_never_computed(target, device):
    _law("causal_chunk_blocks_above_the_diagonal_are_never_computed", target, device)


@pytest.mark.distributed
def test_ring_matches_full_attention_in_fp16_and_bf16(target, device):
    _law("ring_matches_full_attention_in_fp16_and_bf16", target, device)


@pytest.mark.distributed
def test_point_to_point_calls_cannot_hang_on_nccl(target, device):
    _law("point_to_point_calls_cannot_hang_on_nccl", target, device)
