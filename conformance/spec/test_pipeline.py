"""Pipeline parallelism: fixed spec cases against ``--target`` (capability rows of the report).

No course handout defines pipeline parallelism, so there are no CS336 contract cases; the
fixed cases below pin the issue's contract at chosen sizes: the schedule laws at named
(p, m) pairs (m < p among them), the bubble table for p = 2, m = 1..16, the warm-up of
1F1B and AFAB's fill-drain order, parity with the dense model on 1, 2 and 4 ranks for an
MLP stack and the GPT-style model and on groups of ranks that are not 0..p-1; and, as
extras, 1F1B and AFAB steps whose point-to-point calls cannot hang on NCCL (W 2 and 3) and
AFAB and 1F1B agreeing to the bit.  Batches divide evenly by m except in the one case named
"uneven".  Sources (``conformance/laws/pipeline/checks.py`` has them beside each check):
the schedules are GPipe's (Huang et al. 2019: fill-drain) and 1F1B's (Narayanan et al.
2021, section 2.2: warm-up of p - s - 1 forwards, then one forward one backward; torch's
Schedule1F1B runs the same), the bubble bound theirs, parity the definition of a pipeline.
"""


import pytest

from conformance.harness import require_world_size
from conformance.laws.pipeline import checks
from conformance.laws.pipeline.strategies import PipelineCase, ScheduleCase

pytestmark = pytest.mark.distributed

SIZES = [(1, 1), (1, 4), (2, 1), (2, 2), (2, 8), (3, 5), (4, 2), (4, 4), (4, 8), (8, 3)]
SCHEDULE_CHECKS = {
    "one_forward_one_backward": checks.check_counts,
    "dependency_order": checks.check_dependencies,
    "no_deadlock": checks.check_deadlock_free,
    "bubble": checks.check_bubble,
    "in_flight_bound": checks.check_in_flight,
}


@pytest.mark.parametrize("p, m", SIZES, ids=[f"p{p}-m{m}" for p, m in SIZES])
@pytest.mark.parametrize("name", ["afab", "1f1b"])
@pytest.mark.parametrize("law", list(SCHEDULE_CHECKS))
def test_schedule_law_at_fixed_sizes(law, name, p, m, target):
    SCHEDULE_CHECKS[law](target.spec, ScheduleCase(name, p, m, 1, 2))


@pytest.mark.parametrize("name", ["afab", "1f1b"])
def test_bubble_for_two_stages_and_1_to_16_microbatches(name, target):
    for m in range(1, 17):
        checks.check_bubble(target.spec, ScheduleCase(name, 2, m))


@pytest.mark.parametrize("p, m", [(4, 8), (4, 2), (3, 3)])
def test_1f1b_stage_s_runs_min_p_minus_s_m_forwards_before_its_first_backward(p, m, target):
    """Narayanan et al. 2021 (section 2.2, PipeDream-Flush): stage s warms up with p - s - 1
    forwards, then its steady state starts with a forward; torch's Schedule1F1B runs
    min(m, p - s) forwards before its first backward too."""
    plan = checks.target_plan(target.spec, "1f1b", p, m)
    for s, actions in enumerate(plan):
        kinds = [k for k, _, _ in actions]
        assert kinds.index("B") == min(p - s, m), f"stage {s}: {kinds}"


@pytest.mark.parametrize("p, m", [(4, 8), (4, 2)])
def test_afab_runs_every_forward_before_any_backward(p, m, target):
    """GPipe's fill-drain order (Huang et al. 2019; torch's ScheduleGPipe)."""
    for s, actions in enumerate(checks.target_plan(target.spec, "afab", p, m)):
        kinds = [k for k, _, _ in actions]
        assert kinds == ["F"] * m + ["B"] * m, f"stage {s}: {kinds}"


PARITY_CASES = {
    "W1-m4": PipelineCase(1, "mlp", 3, 4, 8, 4, seed=11),
    "W2-m1": PipelineCase(2, "mlp", 4, 4, 6, 1, seed=12),
    "W2-m4": PipelineCase(2, "mlp", 5, 5, 8, 4, seed=13),
    "W4-m8": PipelineCase(4, "mlp", 6, 3, 16, 8, seed=14),
    "W4-m4-equal-to-p": PipelineCase(4, "mlp", 4, 3, 8, 4, seed=15),
    "W2-gpt-m2": PipelineCase(2, "gpt", 4, 0, 4, 2, seed=16, seq=6),
    "W4-gpt-m4": PipelineCase(4, "gpt", 5, 0, 8, 4, seed=17, seq=5),
}


@pytest.mark.parametrize("key", list(PARITY_CASES))
def test_afab_and_1f1b_match_the_dense_model(key, target):
    checks.check_parity(target.spec, PARITY_CASES[key])


def test_afab_with_fewer_microbatches_than_stages_matches_the_dense_model(target):
    checks.check_parity(target.spec, PipelineCase(4, "mlp", 5, 3, 4, 2, seed=18), names=("afab",))


def test_1f1b_with_fewer_microbatches_than_stages_matches_the_dense_model(target):
    checks.check_parity(target.spec, PipelineCase(4, "mlp", 5, 3, 4, 2, seed=19), names=("1f1b",))


SUBGROUP_CASES = {
    "ranks-1-2-of-3-m3": PipelineCase(3, "mlp", 3, 4, 6, 3, seed=23, members=(1, 2)),
    "ranks-0-2-3-of-4-m4": PipelineCase(4, "mlp", 4, 3, 8, 4, seed=24, members=(0, 2, 3)),
    "ranks-1-3-of-4-m1": PipelineCase(4, "mlp", 2, 3, 3, 1, seed=25, members=(1, 3)),
}


@pytest.mark.parametrize("key", list(SUBGROUP_CASES))
def test_stages_on_a_group_of_other_ranks_match_the_dense_model(key, target):
    case = SUBGROUP_CASES[key]
    require_world_size(case.world_size)
    checks.check_parity(target.spec, case)


def test_point_to_point_calls_over_a_group_of_other_ranks_cannot_hang_on_nccl(target):
    case = PipelineCase(3, "mlp", 3, 4, 6, 3, seed=27, members=(1, 2))
    require_world_size(case.world_size)
    checks.check_no_nccl_hang(target.spec, case)


def test_afab_and_1f1b_agree_to_the_bit_at_2_ranks(target):
    checks.check_schedules_agree_to_the_bit(target.spec, PipelineCase(2, "mlp", 4, 4, 7, 3, seed=26))


def test_uneven_microbatches_match_the_dense_model(target):
    """7 rows in 3 micro-batches (3, 2, 2): the loss is normalised once, by 7."""
    checks.check_parity(target.spec, PipelineCase(2, "mlp", 4, 3, 7, 3, seed=20))


def test_gradient_accumulation_over_two_steps_matches_one_dense_step(target):
    checks.check_parity(target.spec, PipelineCase(2, "mlp", 4, 3, 8, 2, seed=21, steps=2))


@pytest.mark.parametrize("w, m", [(2, 4), (3, 3)])
def test_point_to_point_calls_cannot_hang_on_nccl(w, m, target):
    checks.check_no_nccl_hang(target.spec, PipelineCase(w, "mlp", w + 1, 3, 2 * m, m, seed=22))

