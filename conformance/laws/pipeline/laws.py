"""The pipeline-parallel laws, written against the target protocol.

A target offers
    ``get_pipeline_schedule(name, n_stages, n_microbatches)`` -> per rank, the ordered
        actions (``kind`` "F"/"B", ``microbatch``, ``stage``) for name "afab" or "1f1b";
    ``pipeline_train_step(stage_module, schedule_name, inputs, targets, loss_fn,
        n_microbatches, group=None, normalizer=None)`` -> the step's loss on the last stage.

Capability "pipeline parallelism".  There is no course handout for it: the contract tier
is the issue's list (schedule laws, parity with the dense model, m < p, a pipeline over a
group of ranks that are not 0..p-1), each quantity fixed by the GPipe and 1F1B papers or
torch's pipelining contract (``checks`` names the source of each) or bounded from the side
that costs the user (the bubble, activations in flight); the extras are gradient
accumulation across steps, GPT-style transformer stages with ignore_index, float64 stages,
AFAB and 1F1B agreeing to the bit, and point-to-point calls that cannot hang on NCCL
(``conformance.laws.p2p_hang``: gloo buffers what NCCL makes wait, so CPU ranks alone would
pass a 1F1B that deadlocks on GPUs).

``check_law(law, subject, device, max_examples=None, **settings)`` runs one law under
Hypothesis.  A case the target declines (a verdict such as ``NotApplicable``: torch's 1F1B
refuses m < p) does not end the run: the other cases are still checked, a failure among
them still fails, and only then is the first verdict raised, so the law is reported
skipped with its reason, never passed; ``rejection(law_name, target_spec, max_examples)`` is the mutant self-test's
runner: the first line of the law's failure on the target, or None.
"""

from __future__ import annotations

from hypothesis import settings

from conformance.harness import resolve_device
from conformance.lawbook import API, CONTRACT, Law, by_name, first_failure_line, mutant_settings, check_examples
from conformance.laws.pipeline import checks
from conformance.laws.pipeline.strategies import pipeline_cases, schedule_cases, subgroup_pipeline_cases
from conformance.verdicts import NeedsHardware

CAPABILITY = "pipeline parallelism"


def _parity(subject, case):
    """AFAB and 1F1B gradients equal the dense model's on the whole batch."""
    checks.check_parity(subject, case)


def _bitwise(subject, case):
    """AFAB and 1F1B gradients agree to the bit where their backward orders agree."""
    checks.check_schedules_agree_to_the_bit(subject, case)


def _needs_a_group_of_other_ranks(case):
    if case.world_size < 3:
        raise NeedsHardware("needs 3 ranks: a group whose group ranks differ from its members' global ranks "
                            "leaves out a rank of the world")


def _subgroup(subject, case):
    """Stages on a group of ranks that are not 0..p-1 (stage i on group rank i) give the
    dense model's gradients under AFAB and 1F1B."""
    _needs_a_group_of_other_ranks(case)
    checks.check_parity(subject, case)


def _subgroup_hang(subject, case):
    """A pipeline over a group of ranks that are not 0..p-1: its point-to-point calls, played
    under NCCL's rules, complete under AFAB and 1F1B."""
    _needs_a_group_of_other_ranks(case)
    checks.check_no_nccl_hang(subject, case)


def _accumulation(subject, case):
    """Gradients accumulated over several pipeline steps, each normalised by the global
    count, equal one dense step on the whole batch."""
    checks.check_parity(subject, case)


def _gpt(subject, case):
    """The GPT-style model cut into stages (embeddings, blocks, head) matches the dense GPT
    under a summed cross-entropy with ignored targets, normalised by the tokens that count."""
    checks.check_parity(subject, case)


LAWS = (
    Law("every_microbatch_gets_one_forward_and_one_backward_per_stage", CAPABILITY, CONTRACT,
        cases=lambda device=None: schedule_cases(), check=checks.check_counts),
    Law("forward_before_backward_and_stage_order_in_the_simulated_timeline", CAPABILITY, CONTRACT,
        cases=lambda device=None: schedule_cases(costs=(2, 3)), check=checks.check_dependencies),
    Law("simulated_sends_and_receives_never_deadlock", CAPABILITY, CONTRACT,
        cases=lambda device=None: schedule_cases(), check=checks.check_deadlock_free),
    Law("idle_fraction_is_at_most_p_minus_1_over_m_plus_p_minus_1", CAPABILITY, CONTRACT,
        cases=lambda device=None: schedule_cases(costs=(3, 3)), check=checks.check_bubble),
    Law("in_flight_microbatches_at_most_p_minus_s_under_1f1b_and_m_under_afab", CAPABILITY, CONTRACT,
        cases=lambda device=None: schedule_cases(), check=checks.check_in_flight),
    Law("afab_and_1f1b_gradients_equal_the_dense_model", CAPABILITY, CONTRACT,
        cases=lambda device=None: pipeline_cases(device), check=_parity, needs=("ranks",)),
    Law("stages_on_a_group_of_other_ranks_match_the_dense_model", CAPABILITY, CONTRACT,
        cases=lambda device=None: subgroup_pipeline_cases(device), check=_subgroup, needs=("3 ranks",),
        doc="stages on a group of ranks that are not 0..p-1 (ranks 1 and 2 of 3, ...): stage i on group rank i, "
            "gradients equal the dense model's (the protocol's group=; torch's PipelineStage(group=...))"),
    Law("afab_and_1f1b_gradients_agree_to_the_bit_where_their_backward_orders_agree", CAPABILITY, API,
        cases=lambda device=None: pipeline_cases(device, max_microbatches=4, min_world_size=2), check=_bitwise,
        needs=("ranks",), extra="AFAB and 1F1B bit-identical"),
    Law("gradient_accumulation_across_steps_equals_one_step_on_the_whole_batch", CAPABILITY, API,
        cases=lambda device=None: pipeline_cases(device, steps=(2, 3), max_microbatches=4), check=_accumulation,
        needs=("ranks",), extra="gradient accumulation across steps"),
    Law("float64_stages_send_float64_and_match_the_dense_model_to_float64_precision", CAPABILITY, API,
        cases=lambda device=None: pipeline_cases(device, max_microbatches=4, min_world_size=2, dtype="float64"), check=_parity,
        needs=("ranks",), extra="activations and gradients in a dtype other than float32"),
    Law("gpt_stages_match_the_dense_gpt_with_ignored_targets", CAPABILITY, API,
        cases=lambda device=None: pipeline_cases(device, model="gpt", max_microbatches=4), check=_gpt,
        needs=("ranks",), extra="GPT-style transformer stages, ignore_index"),
    Law("point_to_point_calls_cannot_hang_on_nccl", CAPABILITY, API,
        # two stages and two micro-batches at least: where 1F1B has a steady state to deadlock in
        cases=lambda device=None: pipeline_cases(device, max_microbatches=4, min_world_size=2, min_microbatches=2),
        check=lambda subject, case: checks.check_no_nccl_hang(subject, case), needs=("ranks",),
        extra="NCCL-safe exchanges"),
    Law("point_to_point_calls_over_a_group_of_other_ranks_cannot_hang_on_nccl", CAPABILITY, API,
        # the ranks outside the group cannot help make groups for it: a design that opens a
        # second group on the world only, or keeps one group on subgroups, shows here
        cases=lambda device=None: subgroup_pipeline_cases(device, min_microbatches=2), check=_subgroup_hang,
        needs=("3 ranks",), extra="NCCL-safe exchanges on a group of other ranks"),
)
LAWS_BY_NAME = by_name(LAWS)
DISTRIBUTED = {law.name for law in LAWS if law.needs}


def check_law(law: Law, subject: str, device=None, max_examples: int | None = None, **extra_settings) -> None:
    device = resolve_device(device)
    check_examples(law, subject, device=device, max_examples=max_examples, go_on_after_verdicts=True, **extra_settings)


MUTANT_SETTINGS = mutant_settings()


def mutant_examples(law_name: str) -> int:
    """Examples (ci profile) a mutant run of the law draws: pure schedule laws are cheap, a
    law on ranks costs a pipeline step per example."""
    return 4 if law_name in DISTRIBUTED else 12


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure on ``target_spec``, or None if it passes."""
    return first_failure_line(lambda: check_law(LAWS_BY_NAME[law_name], target_spec, max_examples=max_examples, **MUTANT_SETTINGS))
