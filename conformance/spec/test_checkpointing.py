"""Activation checkpointing: fixed spec cases against ``--target`` (capability rows of the report).

No course test exists and no handout fixes a peak or a count of forwards; the contract cases
check the laws at chosen sizes: every strategy on N = 1, 7, 12 and 24 blocks with dropout
(bit-for-bit gradients), and the peak and the block forwards at most what the strategy may
cost (``reference.bound``) for segments that divide N and that do not, the best single level
(at perfect squares too) and the nested recursion.  Then the extras at fixed sizes, among
them the exact peak and forwards of the reference plan (impl's), which a correct design
that holds or recomputes less (torch's early stop) or more (reentrant nesting) misses.
"""

import pytest

from conformance.laws.checkpointing import checks
from conformance.laws.checkpointing.strategies import BadRequest, StackCase

STRATEGIES = [("every", None), ("segments", 1), ("segments", 3), ("segments", 5), ("sqrt", None), ("nested", None)]


def _case(n, strategy, k, seed=3, p=0.25, grad=True):
    return StackCase(n, strategy, k, rows=2, d=4, h=16, p=p, seed=seed, input_requires_grad=grad)


def _ids(cases):
    return [f"N{n}-{s}{'' if k is None else k}" for n, s, k in cases]


GRAD_CASES = [(n, s, k) for n in (1, 7, 12) for s, k in STRATEGIES if k is None or k <= n] + [(24, "nested", None)]
COST_CASES = [(n, s, k) for n in (1, 2, 7, 12, 24) for s, k in STRATEGIES if k is None or k <= n] + [(24, "segments", 24)]


@pytest.mark.parametrize("n, strategy, k", GRAD_CASES, ids=_ids(GRAD_CASES))
def test_contract_gradients_equal_no_checkpointing(n, strategy, k, target):
    checks.check_gradients(target.spec, _case(n, strategy, k))


@pytest.mark.parametrize("n, strategy, k", COST_CASES, ids=_ids(COST_CASES))
def test_contract_activation_peak_is_at_most_the_bound(n, strategy, k, target):
    checks.check_peak(target.spec, _case(n, strategy, k))


@pytest.mark.parametrize("n, strategy, k", COST_CASES, ids=_ids(COST_CASES))
def test_contract_block_forwards_are_at_most_the_bound(n, strategy, k, target):
    checks.check_forwards(target.spec, _case(n, strategy, k))


def test_contract_sqrt_at_perfect_squares_stays_within_the_bounds(target):
    checks.check_sqrt_at_perfect_squares(target.spec)


def _every_case_holds(check, spec):
    """Run ``check`` on every cost case; one failure listing the cases that miss."""
    misses = []
    for n, strategy, k in COST_CASES:
        try:
            check(spec, _case(n, strategy, k))
        except AssertionError as exc:
            misses.append(str(exc))
    assert not misses, f"{len(misses)} of {len(COST_CASES)} cases: " + "; ".join(misses[:4])


def test_exact_peak_of_the_reference_plan(target):
    _every_case_holds(checks.check_exact_peak, target.spec)
    checks.check_exact_peak_at_perfect_squares(target.spec)


def test_exact_recomputation_of_the_reference_plan(target):
    _every_case_holds(checks.check_exact_forwards, target.spec)


def test_none_strategy_equals_the_plain_stack(target):
    checks.check_gradients(target.spec, _case(5, "none", None))


@pytest.mark.parametrize("strategy, k", [("every", None), ("segments", 2), ("nested", None)])
def test_input_without_grad_gives_parameter_gradients(strategy, k, target):
    checks.check_input_without_grad(target.spec, _case(6, strategy, k, grad=False))


@pytest.mark.parametrize("strategy, k", [("every", None), ("segments", 3), ("nested", None)])
def test_blocks_with_a_buffer_returning_a_tensor_and_a_dict(strategy, k, target):
    checks.check_buffers_and_tuples(target.spec, _case(5, strategy, k))


BAD = [BadRequest(4, "Every", None, "strategy"), BadRequest(4, "segments", 0, "segment_size"),
       BadRequest(4, "segments", 5, "segment_size"), BadRequest(1, "segments", -1, "segment_size")]


@pytest.mark.parametrize("req", BAD, ids=["unknown-name", "k0", "k-above-N", "k-negative"])
def test_bad_request_is_a_clear_error(req, target):
    checks.check_bad_request(target.spec, req)
