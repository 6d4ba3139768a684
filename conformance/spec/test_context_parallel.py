"""Fixed context-parallel spec cases: the report's checks for the capability.

No course handout covers ring attention, so there are no CS336 contract cases; the fixed
cases below are the contract of the issue that asked for the capability: the merge of two
partials, the two layouts and their RoPE positions on small sequences (the literal
positions are the layouts' definition: Llama 3's zigzag, chunks r and 2W-1-r), ring parity
with full attention at W = 1, 2 and 4 in both layouts with and without causal masking and
on subgroups of four ranks, a bound on the forward's K/V traffic, and a clear error for a
sequence that does not cut into equal chunks.  Extras (``conformance/capabilities.py``):
Ring Attention's exact exchanges, clear errors for bad shards, NCCL-safe calls.  Each runs
against ``--target`` through the same checks as the properties (whose docstrings name the
source of what they pin).
"""

from __future__ import annotations

import pytest
import torch

from conformance.harness import require_world_size
from conformance.laws.context_parallel import checks
from conformance.laws.context_parallel.strategies import LayoutCase, MergeCase, PartialCase, RingCase


def test_two_partials_merge_to_full_attention(target):
    case = MergeCase(batch=(2,), n_q=5, n_k=7, d=8, dtype=torch.float32, value_scale=1.0, cuts=(3,), order=(1, 0),
                     tree=(0,), masked_block=-1, mask_density=0.0, seed=1)
    checks.check_merge_partition(target.spec, case)


def test_four_partials_with_a_fully_masked_block_and_huge_scores_merge_to_full_attention(target):
    case = MergeCase(batch=(2, 2), n_q=4, n_k=12, d=16, dtype=torch.bfloat16, value_scale=30.0, cuts=(2, 5, 9),
                     order=(2, 0, 3, 1), tree=(1, 0, 0), masked_block=2, mask_density=0.3, seed=2)
    checks.check_merge_partition(target.spec, case)


def test_the_empty_partial_is_the_identity_and_masked_rows_give_no_nan(target):
    checks.check_merge_identity(target.spec, PartialCase(batch=(2,), n=6, d=4, dtype=torch.float16, lse_scale=1e4,
                                                         masked_rows=0.5, seed=3))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shard_and_unshard_follow_the_layout(target, layout, world_size):
    checks.check_layout_roundtrip(target.spec, LayoutCase(world_size, layout, 3, (2, 6 * world_size, 4), 1, 4))


def test_zigzag_positions_on_two_ranks_are_0_1_6_7_and_2_3_4_5(target):
    positions = target.factory("context_parallel_positions")
    assert torch.as_tensor(positions(8, 2, 0, "zigzag")).tolist() == [0, 1, 6, 7]
    assert torch.as_tensor(positions(8, 2, 1, "zigzag")).tolist() == [2, 3, 4, 5]
    assert torch.as_tensor(positions(8, 2, 1, "contiguous")).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_rope_positions_and_zigzag_balance_on_four_ranks(target, layout):
    case = LayoutCase(4, layout, 2, (1, 16 if layout == "contiguous" else 16, 8), 1, 5)
    checks.check_positions(target.spec, case)
    if layout == "zigzag":
        checks.check_zigzag_balance(target.spec, case)


@pytest.mark.distributed
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ring_attention_equals_full_attention(target, device, world_size, layout, is_causal):
    require_world_size(world_size, device)
    case = RingCase(world_size, layout, is_causal, (2, 2), 4, 16, torch.float32, 1.0, 10 + world_size)
    checks.check_ring_parity(target.spec, case)


@pytest.mark.distributed
@pytest.mark.parametrize("members", [(1, 3), (0, 2, 3)], ids=["ranks_1_3", "ranks_0_2_3"])
def test_ring_attention_on_a_subgroup_of_four_ranks_equals_full_attention(target, device, members):
    """Group ranks 0, 1 (, 2) are other global ranks: the protocol's ``group`` argument."""
    require_world_size(4, device)
    layout = "zigzag" if len(members) == 2 else "contiguous"
    checks.check_subgroup_parity(target.spec, RingCase(4, layout, True, (2,), 2, 8, torch.float32, 1.0, 15,
                                                       members=members))


@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_attention_moves_no_more_than_w_minus_1_key_value_blocks_on_four_ranks(target, device, layout):
    """A bound: no source fixes the messages (``checks.check_forward_traffic``)."""
    require_world_size(4, device)
    checks.check_forward_traffic(target.spec, RingCase(4, layout, True, (1,), 2, 8, torch.float32, 1.0, 20))


@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_attention_sends_w_minus_1_key_value_blocks_to_its_ring_neighbours_on_four_ranks(target, device, layout):
    """An extra: Ring Attention's own exchanges (``checks.check_forward_exchanges``)."""
    require_world_size(4, device)
    checks.check_forward_exchanges(target.spec, RingCase(4, layout, True, (1,), 2, 8, torch.float32, 1.0, 20))


@pytest.mark.distributed
def test_mismatched_shards_and_an_odd_zigzag_shard_are_clear_errors(target, device):
    """An extra: no source asks a ring to check its shards (``checks.check_bad_input``)."""
    require_world_size(2, device)
    checks.check_bad_input(target.spec, RingCase(2, "contiguous", False, (1,), 4, 8, torch.float32, 1.0, 30))


def test_a_sequence_that_does_not_cut_into_equal_chunks_is_a_clear_error(target):
    shard = target.factory("context_parallel_shard")
    for layout, n, world_size in (("contiguous", 7, 2), ("zigzag", 6, 4)):
        checks.check_uneven_length_is_a_clear_error(shard, torch.randn(1, n, 4), world_size, layout)


@pytest.mark.distributed
def test_point_to_point_calls_on_two_ranks_cannot_hang_on_nccl(target, device):
    require_world_size(2, device)
    checks.check_no_nccl_hang(target.spec, RingCase(2, "zigzag", True, (1,), 2, 8, torch.float32, 1.0, 40))
