"""A verdict within a law's time budget, whatever the target (issue 42).

``conformance.lawbook.check_examples`` runs a law within a wall-clock budget: it stops
drawing examples when the budget has no room for another, stops shrinking a failure at the
budget and reports the smallest failing example found so far, and a case still running when
the budget runs out is a failure ("undecided") that says where the ranks were.  Checked
here with a small distributed law and three fixture targets
(``conformance/selftests/targets/slow_mean.py``) whose every call sleeps, so that twelve
examples, or a shrink through a few dozen, outlast the test's budget of a few seconds:
slow but correct, slow and summing instead of averaging, slow and hanging.  Also: a verdict
(not offered) ends a law at once instead of being shrunk, and ranks that raise the same
verdict seconds apart keep their pool.
"""

from __future__ import annotations

import time
import warnings

import hypothesis
import pytest
import torch
import torch.distributed as dist
from hypothesis import strategies as st

from conformance import harness
from conformance.harness import LawBudgetSpent, RankContext, run_on_ranks
from conformance.lawbook import CONTRACT, Law, LawBudgetWarning, check_examples
from conformance.target import load_target
from conformance.verdicts import NotOffered

pytestmark = pytest.mark.distributed

BUDGET_S = 4.0
SLACK_S = 3.0  # the last case's end, Hypothesis's own work, a loaded machine
SETTINGS = dict(max_examples=12, derandomize=True, database=None, deadline=None)
FIXTURES = "conformance.selftests.targets.slow_mean"
# The harness's budgets and pools are what is checked, not a device: every pool here is a
# gloo one (the fixture targets all-reduce CPU tensors, which NCCL refuses under --device cuda).
DEVICE = "cpu"


# --- the law (its case function runs on the ranks) ----------------------------------------


def mean_on_ranks(ctx: RankContext, target_spec: str, n: int):
    t = torch.arange(n, dtype=torch.float32) + ctx.rank
    return load_target(target_spec).obj.mean_over_ranks(t)


def mean_is_right(target_spec: str, case) -> None:
    world, n = case
    results = run_on_ranks(mean_on_ranks, world, target_spec, n, timeout=60, device=DEVICE)
    expected = torch.arange(n, dtype=torch.float32) + (world - 1) / 2
    for rank, got in enumerate(results):
        assert torch.equal(got, expected), f"rank {rank}: mean over {world} ranks of arange({n}) + rank is {got.tolist()}"


def mean_cases(device=None):
    return st.tuples(st.sampled_from([1, 2]), st.integers(1, 8))


MEAN = Law("mean_over_ranks_is_the_mean", "selftest", CONTRACT, mean_cases, mean_is_right)


@pytest.fixture(scope="module", autouse=True)
def pools_up():
    """Pools of both world sizes up before any clock starts (a first start is not charged
    to a budget anyway; this keeps the timings below about the law alone)."""
    for world in (1, 2):
        run_on_ranks(mean_on_ranks, world, f"{FIXTURES}:correct", 1, timeout=120, device=DEVICE)


def _timed(target: str, **kwargs) -> float:
    start = time.monotonic()
    check_examples(MEAN, f"{FIXTURES}:{target}", budget_s=BUDGET_S, **SETTINGS, **kwargs)
    return time.monotonic() - start


# --- verdicts within the budget -----------------------------------------------------------------


def test_a_slow_correct_target_passes_on_the_examples_its_budget_had_room_for():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        elapsed = _timed("correct")
    assert elapsed < BUDGET_S + SLACK_S, f"the law took {elapsed:.1f} s on a budget of {BUDGET_S} s"
    told = [w for w in caught if issubclass(w.category, LawBudgetWarning)]
    assert told and "ran and passed before its time budget" in str(told[0].message), [str(w.message) for w in caught]


def test_a_slow_buggy_target_fails_within_the_budget_with_the_example_found_so_far():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="mean over 2 ranks") as info:
        _timed("summing")
    elapsed = time.monotonic() - start
    assert elapsed < BUDGET_S + SLACK_S, f"shrinking went on for {elapsed:.1f} s on a budget of {BUDGET_S} s"
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "shrinking stopped" in notes and "case=(2," in notes, notes


def test_a_case_still_running_when_the_budget_runs_out_is_undecided_and_says_where_the_ranks_were():
    start = time.monotonic()
    with pytest.raises(LawBudgetSpent) as info:
        _timed("hanging", explicit=[(2, 6)])
    elapsed = time.monotonic() - start
    assert elapsed < BUDGET_S + SLACK_S, f"the hanging case was cut after {elapsed:.1f} s on a budget of {BUDGET_S} s"
    message = str(info.value)
    assert message.startswith("undecided: the law mean_over_ranks_is_the_mean's time budget of 4 s ran out"), message
    assert "rank 0: still running" in message and "mean_over_ranks" in message, message


def test_a_case_asked_for_once_the_budget_is_spent_is_undecided_at_once():
    with harness.time_budget(0.01, "law x"):
        time.sleep(0.02)
        with pytest.raises(LawBudgetSpent, match="undecided: the law x's time budget of 0.01 s was spent before case"):
            run_on_ranks(mean_on_ranks, 2, f"{FIXTURES}:correct", 1, timeout=60, device=DEVICE)


def test_the_budget_counts_from_the_first_example_so_a_slow_start_leaves_one_to_judge():
    """On a loaded GPU machine the work before a law's first example (Hypothesis's start, a
    compile-cache reset) once took over the whole of a 1 s budget, and the law passed on no
    example at all.  Here that work takes 1.5 s of a 1 s budget; each example 0.6 s: one runs."""
    from conformance.lawbook import BudgetedLaw

    ran = []
    law = BudgetedLaw(Law("slow_start", "selftest", CONTRACT, mean_cases, lambda subject, case: (ran.append(case), time.sleep(0.6))),
                      seconds=1.0)

    @hypothesis.settings(**SETTINGS)
    @hypothesis.given(case=law.cases())
    def run(case):
        if not ran:
            time.sleep(1.5)
        law.check(None, case)

    with pytest.warns(LawBudgetWarning, match=r"^slow_start: 1 example\(s\) ran and passed"):
        law.run(run)
    assert len(ran) == 1, ran


def test_a_verdict_ends_the_law_at_once_instead_of_being_shrunk():
    calls = []

    def not_offered(subject, case):
        calls.append(case)
        raise NotOffered("target 'x' has no mean_over_ranks()")

    law = Law("declined", "selftest", CONTRACT, mean_cases, not_offered)
    with pytest.raises(NotOffered):
        check_examples(law, None, **SETTINGS)
    assert len(calls) == 1, calls


# --- the pool survives ranks that raise the same verdict seconds apart ----------------------------


def not_offered_after_working(ctx: RankContext, seconds: list[float]):
    """Each rank works (spins: a rank importing on a loaded machine runs, it does not sleep)
    for its number of seconds, then reaches the same verdict."""
    end = time.monotonic() + seconds[ctx.rank]
    while time.monotonic() < end:
        pass
    raise NotOffered("target 'x' has no get_fsdp_strategy()")


def pid(ctx: RankContext):
    import os

    return os.getpid()


def test_ranks_raising_the_same_verdict_seconds_apart_keep_their_pool():
    # rank 1 raises 1.3 s after rank 0, which took 2 s: a fixed one-second grace tore the pool down
    before = run_on_ranks(pid, 2, timeout=60, device=DEVICE)
    with pytest.raises(NotOffered):
        run_on_ranks(not_offered_after_working, 2, [2.0, 3.3], timeout=60, device=DEVICE)
    assert run_on_ranks(pid, 2, timeout=60, device=DEVICE) == before, "the pool was torn down and started again"


def raise_on_rank_0_while_rank_1_waits(ctx: RankContext):
    time.sleep(1.5)  # the grace grows with the time the first failure took
    if ctx.rank == 0:
        raise ValueError("deliberate failure on rank 0")
    dist.barrier()


def test_a_rank_blocked_in_a_collective_ends_the_wait_for_a_symmetric_failure_early():
    run_on_ranks(pid, 2, timeout=60, device=DEVICE)
    start = time.monotonic()
    with pytest.raises(harness.RankFailure, match="deliberate failure on rank 0"):
        run_on_ranks(raise_on_rank_0_while_rank_1_waits, 2, timeout=60, device=DEVICE)
    waited = time.monotonic() - start - 1.5
    assert waited < 1.4, f"the parent waited {waited:.1f} s for rank 1, which sat in a barrier"
