"""The tensor-parallel laws: each runs one case on the ranks, then checks it.

Entry points of the target protocol used (``impl/__init__.py`` documents them):
``get_column_parallel_linear``, ``get_row_parallel_linear``, ``get_vocab_parallel_embedding``,
``vocab_parallel_cross_entropy``, ``get_tensor_parallel_block``, ``get_tensor_parallel_gpt``,
``tensor_parallel_gather_full_params``, ``tensor_parallel_gather_full_grads``.

A law's subject is the target spec; the ranks load the target again.  ``rejection`` runs
one law against a target (a kept mutant) for the self-test.
"""

from __future__ import annotations

from hypothesis import Phase, example, given, settings
from hypothesis.errors import FlakyFailure

from conformance.harness import available_world_sizes, pinned_world_size, run_on_ranks
from conformance.lawbook import API, CONTRACT, Law, by_name
from conformance.verdicts import NeedsHardware

from . import checks, rank
from .strategies import (CrossEntropyCase, block_cases, column_cases, cross_entropy_cases, embedding_cases, model_cases,
                         row_cases)

CAPABILITY = "tensor parallelism"
CASE_TIMEOUT_S = 120.0
MUTANT_SETTINGS = dict(phases=[Phase.explicit, Phase.generate], database=None, derandomize=True, report_multiple_bugs=False, deadline=None)


def _runner(rank_fn, check_fn):
    def check(subject, case):
        results = run_on_ranks(rank_fn, case.world_size, subject, case, timeout=CASE_TIMEOUT_S)
        check_fn(case, results)

    check.__doc__ = check_fn.__doc__
    return check


def _max_world() -> int:
    pinned = pinned_world_size()
    return pinned if pinned is not None else max(available_world_sizes())


def _needs_two_ranks(rank_fn, check_fn):
    inner = _runner(rank_fn, check_fn)

    def check(subject, case):
        if case.world_size < 2:
            raise NeedsHardware("needs 2 ranks: a group of one rank communicates nothing")
        inner(subject, case)

    check.__doc__ = check_fn.__doc__
    return check


LAWS = (
    Law("column_parallel_linear_matches_the_dense_layer", CAPABILITY, CONTRACT,
        cases=column_cases, check=_runner(rank.column_on_rank, checks.check_column), needs=("ranks",),
        doc="column-parallel linear: output shards (or the gathered output), input and parameter gradients equal the dense layer's"),
    Law("row_parallel_linear_matches_the_dense_layer_with_the_bias_added_once", CAPABILITY, CONTRACT,
        cases=row_cases, check=_runner(rank.row_on_rank, checks.check_row), needs=("ranks",),
        doc="row-parallel linear: replicated output, input-gradient shards, weight and bias gradients equal the dense layer's"),
    Law("vocab_parallel_embedding_matches_the_dense_table_for_every_id", CAPABILITY, CONTRACT,
        cases=embedding_cases, check=_runner(rank.embedding_on_rank, checks.check_embedding), needs=("ranks",),
        doc="vocab-parallel embedding: every id (shard boundaries, vocabularies not divisible by W) looks up the dense row; same gradient"),
    Law("vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits", CAPABILITY, CONTRACT,
        cases=cross_entropy_cases, check=_runner(rank.cross_entropy_on_rank, checks.check_cross_entropy), needs=("ranks",),
        doc="vocab-parallel cross-entropy = F.cross_entropy on the full logits (none/sum/mean, ignore_index, boundaries); sharded gradient"),
    Law("vocab_parallel_cross_entropy_is_invariant_to_adding_a_constant_to_all_logits", CAPABILITY, CONTRACT,
        cases=lambda min_world=1: cross_entropy_cases(min_world, shifted=True),
        check=_runner(rank.cross_entropy_on_rank, checks.check_cross_entropy_shift), needs=("ranks",),
        doc="loss and gradient of logits + c (exact) equal those of the logits"),
    Law("vocab_parallel_cross_entropy_stays_finite_for_huge_logits", CAPABILITY, CONTRACT,
        cases=lambda min_world=1: cross_entropy_cases(min_world, huge=True),
        check=_runner(rank.cross_entropy_on_rank, checks.check_cross_entropy), needs=("ranks",),
        doc="logits of order 1e30 to 1e36: loss and gradient finite and equal to F.cross_entropy's"),
    Law("tensor_parallel_block_matches_the_dense_block", CAPABILITY, CONTRACT,
        cases=block_cases, check=_runner(rank.block_on_rank, checks.check_block), needs=("ranks",),
        doc="GPT block with heads split (column-parallel QKV, row-parallel output) and MLP column then row: output and all gradients"),
    Law("tensor_parallel_gpt_matches_the_dense_model_over_optimizer_steps", CAPABILITY, CONTRACT,
        cases=model_cases, check=_runner(rank.gpt_on_rank, checks.check_gpt), needs=("ranks",),
        doc="whole GPT + vocab-parallel loss: losses, first gradients and parameters after SGD/AdamW steps equal the dense model's"),
    Law("mlp_does_one_all_reduce_forward_and_one_backward", CAPABILITY, CONTRACT,
        cases=lambda min_world=2: block_cases(max(2, min_world)),
        check=_needs_two_ranks(rank.mlp_collectives_on_rank, checks.check_mlp_collectives), needs=("2 ranks",),
        doc="observed collectives: column+row MLP one all-reduce each way; the block two each way; nothing else"),
    Law("sequence_parallel_block_matches_the_dense_block", CAPABILITY, API,
        cases=lambda min_world=1: block_cases(min_world, sequence_parallel=True),
        check=_runner(rank.block_on_rank, checks.check_block), needs=("ranks",), extra="sequence parallelism",
        doc="block on sequence shards (norms on the rank's tokens): output and gradients equal the dense block's"),
    Law("sequence_parallel_block_all_gathers_and_reduce_scatters_instead_of_all_reducing", CAPABILITY, API,
        cases=lambda min_world=2: block_cases(max(2, min_world), sequence_parallel=True),
        check=_needs_two_ranks(rank.sp_collectives_on_rank, checks.check_sp_collectives), needs=("2 ranks",),
        extra="sequence parallelism",
        doc="sequence-parallel block: two all-gathers and two reduce-scatters each way, no activation all-reduce"),
    Law("sequence_parallel_gpt_matches_the_dense_model_over_optimizer_steps", CAPABILITY, API,
        cases=lambda min_world=1: model_cases(min_world, sequence_parallel=True),
        check=_runner(rank.gpt_on_rank, checks.check_gpt), needs=("ranks",), extra="sequence parallelism",
        doc="whole GPT with sequence parallelism: losses, gradients and parameters after steps equal the dense model's"),
)
LAWS_BY_NAME = by_name(LAWS)


# Cases a mutant run checks before its draws (two ranks, which every mutant run has), so that
# no draw decides a rejection: the cross-entropy mean over tokens some of which are ignored
# (with --world-size 2 the derandomised draws held none, and a mean counting the ignored
# tokens passed).
MUTANT_EXPLICIT = {
    "vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits":
        (CrossEntropyCase(2, 11, 10, 10, (2, 5), "mean", -100, 3, 1.0, 0.0, "float32"),),
}


def check_law(law: Law, subject: str, *, min_world: int = 1, explicit=(), **settings_kwargs) -> None:
    """Run ``law`` under Hypothesis against ``subject`` (the active profile, or the given
    settings), the ``explicit`` cases first."""

    @given(case=law.cases(min_world=min_world))
    def run(case):
        law.check(subject, case)

    for case in reversed(explicit):
        run = example(case=case)(run)

    if settings_kwargs:
        run = settings(**settings_kwargs)(run)
    run()


def mutant_examples(law_name: str) -> int:
    """Examples (ci profile) a mutant run draws: each is a step on 2 to 4 ranks."""
    return 6


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure against ``target_spec`` (world sizes >= 2),
    or None if the target passes ``max_examples`` deterministic examples."""
    if _max_world() < 2:
        raise NeedsHardware("needs 2 ranks: tensor-parallel bugs are invisible on one rank")
    try:
        check_law(LAWS_BY_NAME[law_name], target_spec, min_world=2, max_examples=max_examples,
                  explicit=MUTANT_EXPLICIT.get(law_name, ()), **MUTANT_SETTINGS)
    except AssertionError as exc:  # includes RankFailure and RankTimeout
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    except FlakyFailure as exc:
        return "flaky rejection: " + (str(exc.exceptions[0]).strip().splitlines() or [""])[0]
    return None
