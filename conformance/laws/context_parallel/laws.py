"""The context-parallel (ring attention) laws, written against the target protocol.

A target offers (documented in ``conformance/target.py`` and the README)
    ``get_ring_attention_autograd_function()`` -> an autograd.Function class whose
        ``apply(q, k, v, is_causal, group, layout)`` (positional; group None: the default
        group; layout "contiguous" or "zigzag") takes and returns this rank's shard
        (..., N / W, d) and saves one logsumexp tensor of shape q.shape[:-1];
    ``merge_attention_partials(o1, lse1, o2, lse2)`` -> (o, lse), natural-log L;
    ``context_parallel_shard(x, world_size, rank, layout="contiguous", dim=-2)``,
    ``context_parallel_unshard(shards, layout="contiguous", dim=-2)``,
    ``context_parallel_positions(seq_len, world_size, rank, layout="contiguous", device=None)``.

Capability "context parallel".  No course handout covers it: the contract tier is the
list of the issue that asked for it (merge algebra, layouts and positions, parity with full
attention in fp32, on the default group and on a subgroup, communication, causal work,
overlap), each pinned only as far as a source fixes it (``checks``' docstrings name them:
the protocol, Ring Attention, Llama 3's zigzag layout, torch's contracts).  Communication
and causal work are bounds from the user's side: no more K/V traffic than the other ranks'
blocks once each, no fully masked block computed.  Extras: Ring Attention's exact exchanges
(W - 1 K/V blocks to the next rank), zigzag's half blocks skipped, fp16 / bf16 parity,
NCCL-safe exchanges, and (a spec case) clear errors for bad shards.

``check_law(law, subject, device, max_examples=None, **settings)`` runs one law under
Hypothesis; ``rejection(law_name, target_spec, max_examples)`` is the mutant self-test's
runner: the first line of the law's failure on the target, or None.
"""

from __future__ import annotations

import torch
from hypothesis import settings

from conformance.harness import available_world_sizes, resolve_device
from conformance.lawbook import API, CONTRACT, Law, by_name, first_failure_line, mutant_settings, check_examples
from conformance.target import load_target
from conformance.laws.context_parallel import checks
from conformance.laws.context_parallel.strategies import (RingCase, layout_cases, merge_cases, partial_cases, ring_cases,
                                                          subgroup_ring_cases)

CAPABILITY = "context parallel"


def _zigzag_only(device=None):
    return layout_cases().filter(lambda c: c.layout == "zigzag")


LAWS = (
    Law("merged_blocks_of_any_key_partition_in_any_order_equal_full_attention", CAPABILITY, CONTRACT,
        cases=lambda device=None: merge_cases(), check=checks.check_merge_partition),
    Law("empty_partial_is_an_exact_identity_and_masked_partials_never_give_nan", CAPABILITY, CONTRACT,
        cases=lambda device=None: partial_cases(), check=checks.check_merge_identity),
    Law("shards_follow_the_layout_and_unshard_inverts_shard", CAPABILITY, CONTRACT,
        cases=lambda device=None: layout_cases(), check=checks.check_layout_roundtrip),
    Law("rope_positions_of_a_shard_are_the_slice_of_the_full_positions", CAPABILITY, CONTRACT,
        cases=lambda device=None: layout_cases(), check=checks.check_positions),
    Law("zigzag_gives_every_rank_the_same_causal_work", CAPABILITY, CONTRACT,
        cases=_zigzag_only, check=checks.check_zigzag_balance),
    Law("ring_output_logsumexp_and_gradients_equal_full_attention", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(device or "cpu"), check=checks.check_ring_parity, needs=("ranks",)),
    Law("ring_results_do_not_depend_on_when_messages_arrive", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(device or "cpu", min_world=2), check=checks.check_ring_parity_delayed,
        needs=("2 ranks",)),
    Law("ring_on_a_subgroup_of_other_global_ranks_equals_full_attention", CAPABILITY, CONTRACT,
        cases=lambda device=None: subgroup_ring_cases(device or "cpu"), check=checks.check_subgroup_parity,
        needs=("3 ranks",)),
    Law("forward_moves_no_more_than_the_other_ranks_key_value_blocks", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(device or "cpu"), check=checks.check_forward_traffic, needs=("ranks",)),
    Law("fully_masked_causal_blocks_are_never_computed", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(device or "cpu", min_world=2, causal=(True,)), check=checks.check_causal_work,
        needs=("2 ranks",)),
    Law("every_key_value_exchange_overlaps_a_block_computation", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(device or "cpu", min_world=2).filter(
            lambda c: not c.is_causal or c.layout == "zigzag"),
        check=checks.check_overlap, needs=("2 ranks",)),
    Law("forward_passes_w_minus_1_key_value_blocks_around_the_ring", CAPABILITY, API,
        cases=lambda device=None: ring_cases(device or "cpu"), check=checks.check_forward_exchanges, needs=("ranks",),
        extra="Ring Attention's exchanges"),
    Law("causal_chunk_blocks_above_the_diagonal_are_never_computed", CAPABILITY, API,
        cases=lambda device=None: ring_cases(device or "cpu", min_world=2, layouts=("zigzag",), causal=(True,)),
        check=checks.check_causal_chunk_work, needs=("2 ranks",), extra="zigzag half blocks skipped"),
    Law("ring_matches_full_attention_in_fp16_and_bf16", CAPABILITY, API,
        cases=lambda device=None: ring_cases(device or "cpu", dtypes=(torch.float16, torch.bfloat16)),
        check=checks.check_ring_parity, needs=("ranks",), extra="fp16 / bf16"),
    Law("point_to_point_calls_cannot_hang_on_nccl", CAPABILITY, API,
        cases=lambda device=None: ring_cases(device or "cpu", min_world=2), check=checks.check_no_nccl_hang,
        needs=("2 ranks",), extra="NCCL-safe exchanges"),
)
LAWS_BY_NAME = by_name(LAWS)


ENTRY_POINTS = {
    "merged_blocks_of_any_key_partition_in_any_order_equal_full_attention": "merge_attention_partials",
    "empty_partial_is_an_exact_identity_and_masked_partials_never_give_nan": "merge_attention_partials",
    "shards_follow_the_layout_and_unshard_inverts_shard": "context_parallel_shard",
    "rope_positions_of_a_shard_are_the_slice_of_the_full_positions": "context_parallel_positions",
    "zigzag_gives_every_rank_the_same_causal_work": "context_parallel_positions",
}


def probe(law: Law, subject: str) -> None:
    """Raise the verdict (not offered, needs a GPU) before any example runs, in this process."""
    target = load_target(subject)
    name = ENTRY_POINTS.get(law.name)
    if name is None:
        target.call("get_ring_attention_autograd_function")
    else:
        target.factory(name)


def check_law(law: Law, subject: str, device=None, max_examples: int | None = None, **extra_settings) -> None:
    device = resolve_device(device)
    probe(law, subject)
    check_examples(law, subject, device=device, max_examples=max_examples, **extra_settings)


MUTANT_SETTINGS = mutant_settings()

# Cases a mutant run checks before its draws (where their ranks can run), so that no draw
# decides a rejection: K/V blocks of 8 KiB (an extra block is more than the metadata
# allowance), and ranks 1 and 3 of 4 (or 1 and 2 of 3), whose group ranks 0 and 1 are
# other global ranks.
_F32 = torch.float32
MUTANT_EXPLICIT = {
    "forward_moves_no_more_than_the_other_ranks_key_value_blocks": (
        RingCase(2, "contiguous", False, (2, 2), 8, 32, _F32, 1.0, 0),),
    "ring_on_a_subgroup_of_other_global_ranks_equals_full_attention": (
        RingCase(4, "zigzag", True, (1,), 2, 8, _F32, 1.0, 0, members=(1, 3)),
        RingCase(3, "contiguous", False, (1,), 2, 8, _F32, 1.0, 0, members=(1, 2))),
}


def _runnable_explicit(law_name: str) -> tuple:
    top = max(available_world_sizes(resolve_device()))
    cases = [c for c in MUTANT_EXPLICIT.get(law_name, ()) if c.world_size <= top]
    return tuple(cases[:1])


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure on ``target_spec``, or None if it passes."""
    law = LAWS_BY_NAME[law_name]

    def run():
        probe(law, target_spec)
        for case in _runnable_explicit(law_name):
            law.check(target_spec, case)
        check_law(law, target_spec, max_examples=max_examples, **MUTANT_SETTINGS)

    return first_failure_line(run)
