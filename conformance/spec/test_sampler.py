"""Distributed sampler: fixed spec cases against ``--target`` (capability rows of the report).

No course handout defines the sampler; the contract cases hold torch's DistributedSampler
contract (``conformance.laws.sampler.checks`` quotes it) at chosen sizes: divisible and
ragged N, N < R, N = 0, drop_last, shuffled and unshuffled orders, several epochs.  Extras:
torch's own partition and padding (which its documentation leaves free) at the same sizes
and on ten items over three ranks, and uneven batches under join on 2 ranks (one rank with
none at all, and 3 against 1).
"""

import pytest

from conformance.laws.sampler import checks
from conformance.laws.sampler.laws import check_uneven
from conformance.laws.sampler.strategies import SamplerCase, UnevenCase

pytestmark = pytest.mark.distributed

SIZES = [(10, 2), (10, 3), (7, 4), (3, 5), (0, 2), (1, 1), (17, 8), (100, 7)]


@pytest.mark.parametrize("n, r", SIZES, ids=[f"N{n}-R{r}" for n, r in SIZES])
@pytest.mark.parametrize("drop_last", [False, True], ids=["pad", "drop"])
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "unshuffled"])
def test_contract_cover_and_len_at_fixed_sizes(shuffle, drop_last, n, r, target):
    case = SamplerCase(n, r, shuffle, seed=1234, epoch=3, drop_last=drop_last)
    checks.check_cover(target.spec, case)
    checks.check_len(target.spec, case)
    if not shuffle:
        checks.check_unshuffled(target.spec, case)


def test_torch_partition_and_padding_at_fixed_sizes(target):
    for n, r in SIZES:
        for drop_last in (False, True):
            for shuffle in (True, False):
                case = SamplerCase(n, r, shuffle, seed=1234, epoch=3, drop_last=drop_last)
                checks.check_torch_padding(target.spec, case)
                if not shuffle:
                    checks.check_strided(target.spec, case)


@pytest.mark.parametrize("n, r", [(12, 2), (50, 3), (101, 4)])
def test_contract_epochs_0_to_4_give_five_different_orders_and_repeat_on_rebuild(n, r, target):
    orders = []
    for epoch in range(5):
        case = SamplerCase(n, r, True, seed=7, epoch=epoch, drop_last=False)
        checks.check_epochs(target.spec, case)
        orders.append(tuple(checks.interleave(checks.shares(target.spec, case))))
    assert len(set(orders)) == 5, "two of five epochs gave the same order"


def test_torch_pads_ten_items_on_three_ranks_with_the_first_two_of_the_order(target):
    case = SamplerCase(10, 3, False, seed=0, epoch=0, drop_last=False)
    assert checks.shares(target.spec, case) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    dropped = SamplerCase(10, 3, False, seed=0, epoch=0, drop_last=True)
    assert checks.shares(target.spec, dropped) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


@pytest.mark.parametrize("batches", [(3, 1), (0, 2)], ids=["3-vs-1", "none-vs-2"])
def test_uneven_batches_under_join_at_2_ranks(batches, target):
    check_uneven(target.spec, UnevenCase(2, batches, width=3, rows=2, lr=0.25, seed=5))
