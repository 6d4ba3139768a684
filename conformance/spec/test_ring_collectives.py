"""Ring collectives: fixed spec cases against ``--target`` (capability rows of the report).

Contract cases: each collective on W = 1..4 for a size W divides, one it does not, one
smaller than W (empty chunks), integer and floating dtypes; results against
torch.distributed's collectives, and messages and bytes within the ring's bounds (at most
the ring's count, only with ring neighbours, at most the formula plus W - 1 elements of
padding a message; ``conformance.laws.ring_collectives.laws`` gives the sources).  Then the
extras: messages and bytes equal to impl's formulas exactly, a subgroup, ranks whose shapes
differ, and calls that would hang on NCCL (W = 2: one peer both ways).
"""

import pytest

from conformance.laws.ring_collectives import checks
from conformance.laws.ring_collectives.strategies import OPS, RingCase

pytestmark = pytest.mark.distributed

SIZES = {"divisible": (12,), "ragged-2d": (5, 3), "smaller-than-W": (1, 2)}
CASES = [(w, size, "int64") for w in (1, 2, 3, 4) for size in SIZES] + [(w, "ragged-2d", "float32") for w in (2, 3, 4)] + [
    (4, "ragged-2d", "bfloat16"), (3, "divisible", "float64")]


@pytest.mark.parametrize("w, size, dtype", CASES, ids=[f"W{w}-{s}-{d}" for w, s, d in CASES])
@pytest.mark.parametrize("op", OPS)
def test_contract_result_equals_torch_distributed(op, w, size, dtype, target):
    checks.check_values(target.spec, RingCase(op, w, SIZES[size], dtype, seed=7 + w))


MESSAGE_CASES = [(2, "divisible"), (3, "ragged-2d"), (4, "smaller-than-W")]


@pytest.mark.parametrize("w, size", MESSAGE_CASES)
@pytest.mark.parametrize("op", OPS)
def test_contract_messages_and_bytes_stay_within_the_ring_bounds(op, w, size, target):
    checks.check_message_bounds(target.spec, RingCase(op, w, SIZES[size], "float32", seed=3))


@pytest.mark.parametrize("w, size", MESSAGE_CASES)
@pytest.mark.parametrize("op", OPS)
def test_messages_and_bytes_equal_the_ring_formulas(op, w, size, target):
    checks.check_messages_exactly(target.spec, RingCase(op, w, SIZES[size], "float32", seed=3))


@pytest.mark.parametrize("members", [(1, 3), (0, 2, 3)], ids=["ranks-1-3", "ranks-0-2-3"])
def test_subgroup_of_four_ranks(members, target):
    case = RingCase("all", 4, (5, 2), "int64", seed=5, members=members)
    checks.check_values(target.spec, case)
    checks.check_message_bounds(target.spec, case)


@pytest.mark.parametrize("shapes", [((2, 3), (3, 2)), ((2, 3), (2, 4)), ((4,), (4,), (2, 2))],
                         ids=["transposed", "longer", "same-size-other-rank"])
@pytest.mark.parametrize("op", OPS)
def test_mismatched_shapes_are_a_clear_error_on_every_rank(op, shapes, target):
    checks.check_mismatch(target.spec, RingCase(op, len(shapes), shapes[0], "float32", seed=1, shapes=shapes))


@pytest.mark.parametrize("w", [2, 3], ids=["W2-one-peer", "W3-two-peers"])
def test_point_to_point_calls_cannot_hang_on_nccl(w, target):
    checks.check_no_nccl_hang(target.spec, RingCase("all", w, (4096,), "float32", seed=2))
