"""The tensor-parallel laws: each runs one case on the ranks, then checks it.

Entry points of the target protocol used (``impl/__init__.py`` documents them):
``get_column_parallel_linear``, ``get_row_parallel_linear``, ``get_vocab_parallel_embedding``,
``vocab_parallel_cross_entropy``, ``get_tensor_parallel_block``, ``get_tensor_parallel_gpt``,
``tensor_parallel_gather_full_params``, ``tensor_parallel_gather_full_grads``.

A law's subject is the target spec; the ranks load the target again.  ``rejection`` runs
one law against a target (a kept mutant) for the self-test.

Sources of what each law compares with (no CS336 handout covers tensor parallelism; each law's
``doc`` names its own):
  - values: the dense module itself (nn.Linear, nn.Embedding, F.cross_entropy, impl.models.gpt's
    Block and GPT) through the float64 oracle: the definition of a tensor-parallel layer in
    Megatron-LM (Shoeybi et al. 2019, section 3) and torch.distributed.tensor.parallel
    (ColwiseParallel, RowwiseParallel, loss_parallel) is that it computes the dense module.
  - which shard a rank holds: the protocol's chunk layout, ceil(n / W) items a rank, the
    last shards shorter or empty: torch's DTensor Shard(dim) placement (torch.chunk), which
    the protocol copies (Megatron-LM asks for sizes divisible by W, where all layouts agree).
  - the group: the protocol's ``group=`` (torch's layers take a DeviceMesh, which may be a
    sub-mesh, and the shard index is the rank in it): rank i of the group is shard i.
  - collectives: Megatron-LM section 3 (f and g: one all-reduce forward and one backward per
    column-then-row pair); the contract bounds their number from above (a collective more
    is traffic and a launch the user pays for), the exact kinds are an extra.
"""

from __future__ import annotations

from hypothesis import Phase, example, given, settings
from hypothesis.errors import FlakyFailure

from conformance.harness import available_world_sizes, pinned_world_size, run_on_ranks
from conformance.lawbook import API, CONTRACT, BudgetedLaw, Law, by_name
from conformance.verdicts import NeedsHardware, Verdict

from . import checks, rank
from .strategies import (CrossEntropyCase, LinearCase, SubgroupCase, block_cases, column_cases, cross_entropy_cases,
                         embedding_cases, model_cases, row_cases, subgroup_cases)

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


def _needs_three_ranks(rank_fn, check_fn):
    inner = _runner(rank_fn, check_fn)

    def check(subject, case):
        if case.world_size < 3:
            raise NeedsHardware("needs 3 ranks: a group whose group ranks differ from its members' global ranks "
                                "leaves out a rank of the world")
        inner(subject, case)

    check.__doc__ = check_fn.__doc__
    return check


LAWS = (
    Law("column_parallel_linear_matches_the_dense_layer", CAPABILITY, CONTRACT,
        cases=column_cases, check=_runner(rank.column_on_rank, checks.check_column), needs=("ranks",),
        doc="column-parallel linear: output shards (or the gathered output), input and parameter gradients equal the "
            "dense layer's (Megatron-LM's ColumnParallelLinear, torch's ColwiseParallel; shards in torch's Shard layout)"),
    Law("row_parallel_linear_matches_the_dense_layer_with_the_bias_added_once", CAPABILITY, CONTRACT,
        cases=row_cases, check=_runner(rank.row_on_rank, checks.check_row), needs=("ranks",),
        doc="row-parallel linear: replicated output, input-gradient shards, weight and bias gradients equal the dense "
            "layer's (Megatron-LM's RowParallelLinear, torch's RowwiseParallel)"),
    Law("vocab_parallel_embedding_matches_the_dense_table_for_every_id", CAPABILITY, CONTRACT,
        cases=embedding_cases, check=_runner(rank.embedding_on_rank, checks.check_embedding), needs=("ranks",),
        doc="vocab-parallel embedding: every id (shard boundaries, vocabularies not divisible by W) looks up the dense "
            "row; same gradient (Megatron-LM's VocabParallelEmbedding, torch's RowwiseParallel on nn.Embedding)"),
    Law("vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits", CAPABILITY, CONTRACT,
        cases=cross_entropy_cases, check=_runner(rank.cross_entropy_on_rank, checks.check_cross_entropy), needs=("ranks",),
        doc="vocab-parallel cross-entropy = F.cross_entropy on the full logits (none/sum/mean, ignore_index, "
            "boundaries); sharded gradient (torch's contract: F.cross_entropy, loss_parallel)"),
    Law("vocab_parallel_cross_entropy_is_invariant_to_adding_a_constant_to_all_logits", CAPABILITY, CONTRACT,
        cases=lambda min_world=1: cross_entropy_cases(min_world, shifted=True),
        check=_runner(rank.cross_entropy_on_rank, checks.check_cross_entropy_shift), needs=("ranks",),
        doc="loss and gradient of logits + c (exact) equal those of the logits (softmax's invariance; F.cross_entropy has it)"),
    Law("vocab_parallel_cross_entropy_stays_finite_for_huge_logits", CAPABILITY, CONTRACT,
        cases=lambda min_world=1: cross_entropy_cases(min_world, huge=True),
        check=_runner(rank.cross_entropy_on_rank, checks.check_cross_entropy), needs=("ranks",),
        doc="logits of order 1e30 to 1e36: loss and gradient finite and equal to F.cross_entropy's"),
    Law("tensor_parallel_block_matches_the_dense_block", CAPABILITY, CONTRACT,
        cases=block_cases, check=_runner(rank.block_on_rank, checks.check_block), needs=("ranks",),
        doc="GPT block with heads split (column-parallel QKV, row-parallel output) and MLP column then row: output "
            "and all gradients equal the dense block's (Megatron-LM section 3)"),
    Law("tensor_parallel_gpt_matches_the_dense_model_over_optimizer_steps", CAPABILITY, CONTRACT,
        cases=model_cases, check=_runner(rank.gpt_on_rank, checks.check_gpt), needs=("ranks",),
        doc="whole GPT + vocab-parallel loss: losses, first gradients and parameters after SGD/AdamW steps equal the "
            "dense model's"),
    Law("every_entry_point_on_a_subgroup_shards_by_group_rank_and_matches_the_dense_module", CAPABILITY, CONTRACT,
        cases=lambda min_world=1: subgroup_cases(),
        check=_needs_three_ranks(rank.subgroup_on_rank, checks.check_subgroup), needs=("3 ranks",),
        doc="column, row, embedding, cross-entropy and block on a group of some ranks of the world (ranks 1 and 2 "
            "of 3, 0 and 3 of 4, ...): shard i on group rank i, results equal the dense module's (the protocol's "
            "group=; torch's layers on a sub-mesh)"),
    Law("mlp_and_block_do_at_most_megatrons_collectives_each_way", CAPABILITY, CONTRACT,
        cases=lambda min_world=2: block_cases(max(2, min_world)),
        check=_needs_two_ranks(rank.mlp_collectives_on_rank, checks.check_mlp_collectives_at_most), needs=("2 ranks",),
        doc="observed collectives: the column+row MLP at most one each way, the block at most two (Megatron-LM "
            "section 3); any kind"),
    Law("mlp_does_one_all_reduce_forward_and_one_backward", CAPABILITY, API,
        cases=lambda min_world=2: block_cases(max(2, min_world)),
        check=_needs_two_ranks(rank.mlp_collectives_on_rank, checks.check_mlp_collectives), needs=("2 ranks",),
        extra="exactly Megatron's all-reduces",
        doc="observed collectives: column+row MLP exactly one all-reduce each way; the block two each way; nothing "
            "else (Megatron-LM's f and g; the contract is the bound above)"),
    Law("sequence_parallel_block_matches_the_dense_block", CAPABILITY, API,
        cases=lambda min_world=1: block_cases(min_world, sequence_parallel=True),
        check=_runner(rank.block_on_rank, checks.check_block), needs=("ranks",), extra="sequence parallelism",
        doc="block on sequence shards (norms on the rank's tokens): output and gradients equal the dense block's"),
    Law("sequence_parallel_block_all_gathers_and_reduce_scatters_instead_of_all_reducing", CAPABILITY, API,
        cases=lambda min_world=2: block_cases(max(2, min_world), sequence_parallel=True),
        check=_needs_two_ranks(rank.sp_collectives_on_rank, checks.check_sp_collectives), needs=("2 ranks",),
        extra="sequence parallelism collectives",
        doc="sequence-parallel block: two all-gathers and two reduce-scatters each way, no activation all-reduce "
            "(Korthikanti et al. 2022)"),
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
    # a column-parallel layer on global ranks 1 and 2 of 3: a rank that takes its shard by its
    # global rank holds the wrong one, whatever kinds the draws pick
    "every_entry_point_on_a_subgroup_shards_by_group_rank_and_matches_the_dense_module":
        (SubgroupCase(3, (1, 2), "column", LinearCase(2, 5, (2,), 4, 6, True, False)),),
}


def check_law(law: Law, subject: str, *, min_world: int = 1, explicit=(), go_on_after_verdicts: bool = False,
              **settings_kwargs) -> None:
    """Run ``law`` under Hypothesis against ``subject`` (the active profile, or the given
    settings), the ``explicit`` cases first.

    ``go_on_after_verdicts``: a case the target declines (a verdict: torch's layers cannot
    hold an empty vocabulary shard) is set aside and the other cases still run, so a failure
    among them still fails; then the first verdict is raised, and the law reads skipped with
    its reason, never passed."""
    declined: list[Verdict] = []
    law = BudgetedLaw(law, fixed=len(explicit))  # the test below keeps its source (its draws)

    @given(case=law.cases(min_world=min_world))
    def run(case):
        try:
            law.check(subject, case)
        except Verdict as verdict:
            if not go_on_after_verdicts:
                raise
            declined.append(verdict)

    for case in reversed(explicit):
        run = example(case=case)(run)

    if settings_kwargs:
        run = settings(**settings_kwargs)(run)
    law.run(run)
    if declined:
        raise declined[0]


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
