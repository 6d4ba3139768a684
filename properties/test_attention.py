"""FlashAttention laws, checked against the target's PyTorch and Triton implementations.

Every law in ``conformance.laws.attention.laws.LAWS`` runs under Hypothesis for each flavour
the target offers; a flavour it lacks is reported "not offered".  On the CPU the Triton
flavour runs under the interpreter (fp32 and fp16; bf16 needs a GPU).
"""

import math
import time

import pytest
import torch
from hypothesis import settings

from conformance.laws.attention.hopper import gluon_not_run_reason
from conformance.verdicts import EnvironmentRefusal
from conformance.lawbook import LawBudgetWarning
from conformance.laws.attention.laws import CONTRACT_LAWS, LAWS, check_law
from conformance.profiles import sharded_examples

FLAVOURS = ("pytorch", "triton", "gluon")


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    return request.param


@pytest.fixture
def attn(target, flavour, device):
    fn = target.attention(flavour)
    if flavour == "gluon" and (reason := gluon_not_run_reason(device)):
        pytest.skip(EnvironmentRefusal(reason).reason)  # a Hopper GPU only: elsewhere "not run here"
    return fn


@pytest.mark.parametrize("law", CONTRACT_LAWS, ids=lambda law: law.name)
def test_contract_law(law, attn, flavour, device, shard):
    """The course's shapes, dtypes and flags only: a wider case can never stop these."""
    if law.flavours and flavour not in law.flavours:
        pytest.skip(f"law {law.name} applies to the {'/'.join(law.flavours)} flavour only")
    check_law(law, attn, device, flavour, max_examples=sharded_examples(shard))


# Every example of these laws runs five to seven calls forward and backward (the case and one
# neighbour of each kind; the case five times): a sixth of the profile's examples try about as
# many calls as one other law's.
SIXTH_EXAMPLES = {"results_do_not_depend_on_earlier_calls", "fresh_values_at_recycled_addresses_give_fresh_results"}


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.name)
def test_attention_law(law, attn, flavour, device, shard):
    if law.flavours and flavour not in law.flavours:
        pytest.skip(f"law {law.name} applies to the {'/'.join(law.flavours)} flavour only")
    total = settings().max_examples
    if law.name in SIXTH_EXAMPLES:
        total = max(1, total // 6)
    check_law(law, attn, device, flavour, max_examples=sharded_examples(shard, total))


def test_bf16_is_checked_where_it_can_run(device):
    """bf16 is drawn for every flavour wherever it can run (a green run that skipped bf16
    would be a false green): the PyTorch flavour everywhere, the Triton flavour on a GPU
    (the interpreter's bf16 tl.dot is broken, triton issue 11584)."""
    from conformance.laws.attention.strategies import budget_for

    assert torch.bfloat16 in budget_for("pytorch", device).dtypes
    if device.type == "cuda":
        assert torch.bfloat16 in budget_for("triton", device).dtypes
        assert torch.bfloat16 in budget_for("gluon", device).dtypes  # its tier runs on Hopper only


@pytest.mark.parametrize("flavour", ["pytorch", "triton", "gluon"])
def test_gpu_budgets_try_a_causal_head_of_a_thousand_keys_first(flavour):
    """On a GPU every wider law tries one head of ~1000 causal keys before its draws: a grid of
    a few query tiles, which split-KV kernels cut into key splits whose partial sums are then
    merged.  Drawn at random such a case came too seldom: on an H200, a kept mutant that counts
    a discarded split's sums passed every draw the law's time budget had room for."""
    from conformance.laws.attention.strategies import boundary_cases, budget_for

    cases = boundary_cases(budget_for(flavour, torch.device("cuda")))
    assert any(c.is_causal and math.prod(c.batch) == 1 and min(c.n_q, c.n_k) >= 1000 for c in cases)


@pytest.mark.parametrize("flavour", ["triton", "gluon"])
def test_gpu_budgets_try_more_query_tiles_than_twice_any_gpus_sms_first(flavour):
    """On a GPU every wider law of a kernel flavour also tries grids of more 128-row query tiles
    than twice the SMs of any GPU (148 on a B200), causal and not, in 16-bit: each program of a
    persistent kernel walks several work items, and tiles picked by the grid's size are the
    full-GPU ones.  The contract's shapes (at most 4 x 1024 rows) and the random draws (at most 8 x 1100) never get
    there on an H100's 132 SMs: a kept mutant that frees Q's buffer early shows only there, and
    the Triton flavour's 16-bit causal table config (the leaderboard's) ran in no law."""
    from conformance.laws.attention.strategies import boundary_cases, budget_for

    cases = boundary_cases(budget_for(flavour, torch.device("cuda")), flavour)
    many = [c for c in cases if math.prod(c.batch) * math.ceil(c.n_q / 128) > 2 * 148]
    assert {c.is_causal for c in many} == {True, False}
    assert all(c.dtype in (torch.bfloat16, torch.float16) for c in many)
    assert {c.poisoned for c in many} == {True, False}  # deterministic mode's backward and the user's
    # kernels specialise on the head dim and the mask together: the Gluon flavour's three-consumer
    # forward, which only grids of this size reach, compiles four ways
    assert {(c.d, c.is_causal) for c in many} == {(64, True), (64, False), (128, True), (128, False)}


def _is_the_familys_longest_case(case, budget, flavour) -> bool:
    from conformance.laws.attention.strategies import CONTRACT_HEAD_DIMS, CONTRACT_LENGTHS, contract_lengths

    longest = max(contract_lengths(budget, flavour, False))
    return ((case.batch, case.n_q, case.n_k, case.d, case.scale, case.value_scale, case.layout)
            == ((1,), longest, longest, 64, None, 1.0, "contiguous")
            and longest in CONTRACT_LENGTHS and 64 in CONTRACT_HEAD_DIMS and case.dtype in budget.dtypes)


@pytest.mark.parametrize("flavour", ["pytorch", "triton"])
def test_contract_laws_try_their_familys_longest_causal_case_first(flavour):
    """Each contract law tries one case of its own family before its draws: one batch element at
    the longest contract length the budget runs, causal for a kernel flavour (the PyTorch
    flavour's contract has no mask), d 64.  Drawn at random, a causal grid long enough to give
    a split-KV kernel splits with no keys of their own came so seldom that on an H200 the kept
    mutant ``discarded_split_counted`` passed the contract forward law in one tier run of three.
    The case is a member of the family (nothing the handout does not ask); the long laws, whose
    few draws are all long, take none."""
    from dataclasses import replace

    from conformance.laws.attention.strategies import budget_for
    from conformance.verdicts import NeedsHardware

    budget = budget_for(flavour, torch.device("cpu"))
    for law in CONTRACT_LAWS:
        if law.flavours and flavour not in law.flavours:
            continue
        ran = []
        check = lambda attn, case, device: ran.append(case)  # noqa: E731
        try:
            check_law(replace(law, check=check), None, "cpu", flavour, max_examples=1)
        except NeedsHardware:  # a long law the interpreter cannot run
            continue
        if law.needs:  # the long laws
            assert not any(c.seed == 5000 and not c.poisoned for c in ran), (law.name, ran[:1])  # no corner case
            continue
        assert _is_the_familys_longest_case(ran[0], budget, flavour), (law.name, ran[0])
        assert ran[0].is_causal == (flavour != "pytorch"), law.name


@pytest.mark.parametrize("flavour", ["triton", "gluon"])
def test_gpu_contract_laws_try_a_causal_head_of_a_thousand_keys_first(flavour):
    """On a GPU the kernel flavours' corner is causal at N 1024: 8 key tiles of 128, a grid a
    split-KV forward cuts (the kept Gluon mutant of a keyless split's sums shows there)."""
    from conformance.laws.attention.strategies import budget_for, contract_corner_cases

    budget = budget_for(flavour, torch.device("cuda"))
    (case,) = contract_corner_cases(budget, flavour)
    assert _is_the_familys_longest_case(case, budget, flavour) and case.is_causal and case.n_q == 1024
    assert contract_corner_cases(budget, flavour, long=True) == []


@pytest.mark.parametrize("flavour", ["pytorch", "triton"])
def test_wider_laws_try_the_boundary_cases_first_cheapest_first(flavour, monkeypatch):
    """The boundary cases run before any draw and in their list's order, cheapest first, so a
    budget that runs out cuts the dearest.  Hypothesis runs the explicit example added last
    first: added in list order they ran dearest first, and on an H200 the law that calls
    seven times a case spent its budget on the 40-head case alone and never tried a tile's
    edge.  Here a law whose every example takes 0.6 s of a 1 s budget runs one: the first."""
    from dataclasses import replace

    from conformance.laws.attention.strategies import boundary_cases, budget_for, case_work

    ran = []

    def check(attn, case, device):
        ran.append(case)
        time.sleep(0.6)

    wider = next(law for law in LAWS if law.name == "forward_matches_float64_reference")
    monkeypatch.setenv("SUITE_LAW_BUDGET_S", "1")
    cut_after_the_first = rf"^forward_matches_float64_reference\[{flavour}\]: 1 example\(s\) \(1 of its \d+ fixed cases\)"
    with pytest.warns(LawBudgetWarning, match=cut_after_the_first):
        check_law(replace(wider, check=check), None, "cpu", flavour, max_examples=1)
    fixed = boundary_cases(budget_for(flavour, torch.device("cpu")), flavour)
    assert ran == fixed[:1], (ran, fixed[0])
    for device in ("cpu", "cuda"):
        work = [case_work(c) for c in boundary_cases(budget_for(flavour, torch.device(device)), flavour)]
        assert work == sorted(work), (device, work)
    ran.clear()
    monkeypatch.setenv("SUITE_LAW_BUDGET_S", "60")
    check_law(replace(wider, check=lambda attn, case, device: ran.append(case)), None, "cpu", flavour, max_examples=1)
    assert ran[: len(fixed)] == fixed
