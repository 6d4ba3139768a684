"""Ring collectives: every law of ``conformance.laws.ring_collectives.laws`` against ``--target``,
on 1..4 ranks (gloo on the CPU, NCCL on GPUs)."""

import pytest

from conformance.laws.ring_collectives.laws import LAWS_BY_NAME, check_law
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


def test_contract_every_rank_gets_what_torch_distributed_collectives_give(target, device):
    check_law(LAWS_BY_NAME["results_equal_torch_distributed_collectives"], target.spec, device, max_examples=examples(10))


def test_contract_messages_peers_and_bytes_per_rank_stay_within_the_ring_bounds(target, device):
    check_law(LAWS_BY_NAME["messages_and_bytes_per_rank_stay_within_the_ring_bounds"], target.spec, device,
              max_examples=examples(10))


def test_messages_and_bytes_per_rank_equal_the_ring_formulas(target, device):
    check_law(LAWS_BY_NAME["messages_and_bytes_per_rank_equal_the_ring_formulas"], target.spec, device,
              max_examples=examples(6))


def test_subgroups_use_their_own_ring_of_global_ranks(target, device):
    check_law(LAWS_BY_NAME["subgroups_use_their_own_ring_of_global_ranks"], target.spec, device, max_examples=examples(4))


def test_non_contiguous_inputs_give_the_same_results(target, device):
    check_law(LAWS_BY_NAME["non_contiguous_inputs_give_the_same_results"], target.spec, device, max_examples=examples(4))


def test_mismatched_shapes_across_ranks_are_a_clear_error_on_every_rank(target, device):
    check_law(LAWS_BY_NAME["mismatched_shapes_across_ranks_are_a_clear_error_on_every_rank"], target.spec, device,
              max_examples=examples(4))


def test_point_to_point_calls_cannot_hang_on_nccl(target, device):
    check_law(LAWS_BY_NAME["point_to_point_calls_cannot_hang_on_nccl"], target.spec, device, max_examples=examples(6))
