"""The suite has teeth: every kept mutant is rejected by each law named for it.

A kept mutant (``conformance.lawbook.Mutant``) is a target with one decision changed from
a correct implementation, and ``caught_by`` names the laws (or ``spec:<case>`` spec cases)
that must reject it.  For every (mutant, law) pair the law runs against the mutant with a
bounded number of examples and no shrinking; a mutant that passes fails this test.  The
control: the unbroken implementation passes the same runs (up to the profile's number of
examples; one example where the control is impl, whose full runs are the properties and
spec tests'), so a rejection is the bug's doing, not a broken pool or a law that fails
everything.  And every law of every capability has at least one mutant it is shown to reject.

Each capability's laws package runs its own laws (``rejection(law_name, target_spec,
max_examples, flavour)``), with its own example budget (``DEFAULT_EXAMPLES``), control
target (``CONTROL``); ``KEPT`` says how many ranks its bugs need to show (a survivor where
fewer can run, one GPU or ``--world-size 1``, is "not run here", not failed).
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from pathlib import Path

import pytest
from hypothesis import settings

from conformance.harness import available_world_sizes, pinned_world_size, resolve_device
from conformance.lawbook import LawBudgetWarning
from conformance.profiles import examples

ROOT = Path(__file__).resolve().parents[2]

# mutants module -> (the module that runs its capability's laws, the module that lists them,
#                    the ranks its bugs need to show: a survivor where fewer run is "not run")
KEPT = {
    "conformance.mutants.attention": ("conformance.laws.attention.rejection", "conformance.laws.attention.laws", 1),
    "conformance.mutants.ddp": ("conformance.laws.ddp.rejection", "conformance.laws.ddp.laws", 2),
    "conformance.mutants.sharded_optimizer": ("conformance.laws.zero.rejection", "conformance.laws.zero.laws", 2),
    "conformance.mutants.fsdp": ("conformance.laws.fsdp.laws", "conformance.laws.fsdp.laws", 2),
    "conformance.mutants.context_parallel": ("conformance.laws.context_parallel.laws", "conformance.laws.context_parallel.laws", 2),
    "conformance.mutants.tensor_parallel": ("conformance.laws.tensor_parallel.laws", "conformance.laws.tensor_parallel.laws", 2),
    "conformance.mutants.pipeline": ("conformance.laws.pipeline.laws", "conformance.laws.pipeline.laws", 1),
    "conformance.mutants.checkpointing": ("conformance.laws.checkpointing.laws", "conformance.laws.checkpointing.laws", 1),
    "conformance.mutants.ring_collectives": ("conformance.laws.ring_collectives.laws", "conformance.laws.ring_collectives.laws", 2),
    "conformance.mutants.grad_scaler": ("conformance.laws.grad_scaler.laws", "conformance.laws.grad_scaler.laws", 2),
    "conformance.mutants.sampler": ("conformance.laws.sampler.laws", "conformance.laws.sampler.laws", 2),
    "conformance.mutants.composed": ("conformance.laws.composed.laws", "conformance.laws.composed.laws", 4),
}
# Mutants sharing a scaffold of their own (a re-implementation with bug switches) have that
# scaffold, every switch right, as a second control; so does a mutant whose bug lives behind a
# switch that is off by default (the call graphs), with the switch on: mutants module -> (name
# prefix, target).
SCAFFOLD_CONTROLS = {"conformance.mutants.tensor_parallel": ("ce_", "conformance.mutants.tensor_parallel:ce_right"),
                     "conformance.mutants.attention": ("graph_", "conformance.mutants.attention:correct_with_call_graphs")}
MIN_MUTANTS = {"attention": 10, "DDP": 8, "sharded optimizer": 6, "FSDP": 8, "context parallel": 8,
               "tensor parallel": 6, "pipeline parallel": 6, "activation checkpointing": 5, "ring collectives": 4,
               "gradient scaler": 6, "distributed sampler": 3, "composed parallelism": 4}


def _exists(module: str) -> bool:
    return (ROOT / (module.replace(".", "/") + ".py")).exists()


def kept_modules():
    """The mutants modules present in this tree (a capability not built yet has none)."""
    return [m for m in KEPT if _exists(m)]


def _mutants():
    return [mutant for module in kept_modules() for mutant in importlib.import_module(module).MUTANTS]


def _runner(mutant_module: str):
    return importlib.import_module(KEPT[mutant_module][0])


def _module_of(mutant) -> str:
    for module in kept_modules():
        if mutant in importlib.import_module(module).MUTANTS:
            return module
    raise LookupError(mutant.name)


def _run(runner, law: str, target_spec: str, flavour: str, at_most: int | None = None) -> str | None:
    per_law = getattr(runner, "mutant_examples", None)
    budget = examples(per_law(law) if per_law else getattr(runner, "DEFAULT_EXAMPLES", 12))
    if at_most is not None:
        budget = min(budget, at_most)
    if flavour:
        return runner.rejection(law, target_spec, budget, flavour=flavour)
    return runner.rejection(law, target_spec, budget)


# Mutants that need more ranks than the rest of their module's: mutant name -> ranks.
MUTANT_RANKS = {"one_group_for_both_directions": 2,  # a deadlock between two pipeline stages
                "activations_sent_in_float32": 2,  # a buffer between two stages
                "hybrid_replicas_not_reduced": 4,  # two replica groups of the default shard group of 2
                "shards_by_world_rank": 3,  # a tensor-parallel group of ranks that are not 0..k-1
                "peers_addressed_by_group_rank": 3,  # a pipeline over such a group
                "all_gather_sent_to_every_rank": 3,  # at two ranks the only other rank is the ring neighbour
                "group_ignored": 3}  # the scaler's two groups of other ranks


def _skip_unless_enough_ranks(module: str, what: str, name: str | None = None) -> None:
    """A bug that needs N ranks to show survives where fewer can run: not run, not failed."""
    needs = max(KEPT[module][2], MUTANT_RANKS.get(name, 0))
    ranks = pinned_world_size() or max(available_world_sizes(resolve_device()))
    if ranks < needs:
        pytest.skip(f"needs {needs} ranks: {what} cannot show with {ranks} rank(s) here")


PAIRS = [pytest.param(m, law, id=f"{m.capability}-{m.name}-{law}") for m in _mutants() for law in m.caught_by]


@pytest.mark.parametrize("mutant, law", PAIRS)
def test_every_kept_mutant_is_rejected_by_each_law_named_for_it(mutant, law, record_property):
    module = _module_of(mutant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LawBudgetWarning)
        verdict = _run(_runner(module), law, mutant.target, mutant.flavour)
    # how the run ended, for the gate's progress log: which check, or a hang or crash, rejected it
    record_property("verdict", "passed" if verdict is None else verdict.splitlines()[0][:300])
    if verdict is None:
        _skip_unless_enough_ranks(module, f"mutant {mutant.name!r}", mutant.name)
        cut = [w for w in caught if issubclass(w.category, LawBudgetWarning)]
        if cut:  # the examples it had room for drew no trigger: not shown here, not passed
            pytest.skip(f"mutant {mutant.name!r} not decided here by {law}: {str(cut[0].message).splitlines()[0]}")
    if verdict is not None and verdict.startswith("undecided:"):
        # The law's time budget ran out mid-case: no verdict, so no rejection either.
        pytest.skip(f"mutant {mutant.name!r}: the {law} law was {verdict.splitlines()[0]}")
    assert verdict is not None, f"mutant {mutant.name!r} ({mutant.bug}) passed the {law} law"


def _controls():
    runs = set()
    for module in kept_modules():
        runner = _runner(module)
        for m in importlib.import_module(module).MUTANTS:
            for law in m.caught_by:
                runs.add((module, law, m.flavour, getattr(runner, "CONTROL", "impl")))
                prefix, scaffold = SCAFFOLD_CONTROLS.get(module, (None, None))
                if prefix and m.name.startswith(prefix):
                    runs.add((module, law, m.flavour, scaffold))
    return sorted(runs)


CONTROLS = _controls()
# Examples of a control run on impl, which the properties and spec tests check in full.
IMPL_CONTROL_EXAMPLES = 1


@pytest.mark.parametrize("module, law, flavour, control", CONTROLS,
                         ids=[f"{m.rsplit('.', 1)[-1]}-{law}-{fl or 'any'}-{c.rsplit(':', 1)[-1]}" for m, law, fl, c in CONTROLS])
def test_the_unbroken_implementation_passes_the_same_runs(module, law, flavour, control):
    # The same law, settings and draws, up to the profile's example count: a mutant's larger
    # budget is there to draw its bug's trigger and ends at the first failure; a control,
    # which must pass, would pay all of it (attention's 40 examples a law).  Where the
    # control is impl, the properties and spec tests already run this law on impl with the
    # profile's whole budget; here it need only show that the rejection path passes it.
    runner = _runner(module)
    at_most = settings().max_examples if control != "impl" else min(settings().max_examples, IMPL_CONTROL_EXAMPLES)
    verdict = _run(runner, law, control, flavour, at_most=at_most)
    if verdict is not None and verdict.startswith("undecided:"):
        # The law's time budget ran out mid-case (a loaded machine, many ranks): no verdict on
        # the control either way, so its pass is not shown here -- skipped, not passed.
        pytest.skip(f"{control} (unbroken): the {law} run kept for {module} was {verdict.splitlines()[0]}")
    assert verdict is None, f"{control} (unbroken) fails the {law} run kept for {module}: {verdict}"


@pytest.mark.parametrize("module", kept_modules())
def test_every_law_has_a_kept_mutant_it_rejects(module):
    mutants = importlib.import_module(module).MUTANTS
    laws_module = importlib.import_module(KEPT[module][1])
    caught = {law for m in mutants for law in m.caught_by}
    names = set(getattr(laws_module, "LAWS_BY_NAME", {law.name: law for law in laws_module.LAWS}))
    assert {law for law in caught if not law.startswith("spec:")} <= names, f"mutants name unknown laws: {sorted(caught - names)}"
    missing = sorted(names - caught)
    assert not missing, f"laws with no kept mutant to show they can fail: {missing}"
    capability = mutants[0].capability
    assert len(mutants) >= MIN_MUTANTS.get(capability, 4), f"{capability}: only {len(mutants)} kept mutants"
    assert all(m.capability == capability for m in mutants)


def _run_by_the_suite_on_impl(module: str, law: str, tests: str) -> bool:
    """Whether a collected properties or spec test runs ``law``: its name, or its check
    function's, in the test's id or source (``tests``).  That is the full run on impl a
    one-example control stands beside."""
    name = law.removeprefix("spec:")
    entry = getattr(importlib.import_module(KEPT[module][1]), "LAWS_BY_NAME", {}).get(name)
    check = getattr(getattr(entry, "check", None), "__name__", None)
    return name in tests or (check is not None and check in tests)


def test_every_law_with_a_one_example_control_runs_in_full_in_the_properties_or_spec_tests(request):
    folders = ("properties/", "conformance/spec/")
    items = [item for item in request.session.items if item.nodeid.startswith(folders)]
    if not all(any(item.nodeid.startswith(f) for item in items) for f in folders):
        pytest.skip("needs the properties and spec tests collected in the same run (as `pytest` alone does)")
    text = "\n".join(item.nodeid + "\n" + inspect.getsource(item.function) for item in items)
    impl_controls = sorted({(m, law) for m, law, _, control in CONTROLS if control == "impl"})
    missing = [(m, law) for m, law in impl_controls if not _run_by_the_suite_on_impl(m, law, text)]
    assert impl_controls and not missing, (
        f"controls cut to {IMPL_CONTROL_EXAMPLES} example(s) whose law no properties or spec test runs: {missing}")
    assert not _run_by_the_suite_on_impl(impl_controls[0][0], "a_law_no_test_runs", text)


def test_a_mutant_run_checks_its_failing_case_once_and_a_shrinking_run_checks_it_again():
    """Hypothesis replays a failing example to report it; without shrinking (a mutant run)
    the lawbook raises the first failure again from memory, so a hang waits out its watchdog
    once, not twice.  With shrinking every call runs the check."""
    from hypothesis import strategies as st

    from conformance.lawbook import CONTRACT, Law, check_examples, mutant_settings

    calls = []

    def check(subject, case):
        calls.append(case)
        assert case < 0, f"case {case} fails"

    law = Law("every_case_fails", "selftest", CONTRACT, cases=lambda device=None: st.integers(0, 9), check=check)
    with pytest.raises(AssertionError, match="fails"):
        check_examples(law, None, max_examples=5, **mutant_settings())
    assert len(calls) == 1, calls
    calls.clear()
    with pytest.raises(AssertionError, match="fails"):
        check_examples(law, None, max_examples=5, database=None, derandomize=True)
    assert len(calls) >= 2, calls


# Kept mutants whose rejection once rested on the world sizes the derandomised draws held:
# with the world size pinned to 2 (a two-GPU machine) they passed until their mutant runs
# got explicit cases (MUTANT_EXPLICIT in the FSDP and tensor-parallel laws).
PINNED_TWO = [("ce_mean_counts_ignored", "vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits"),
              ("hybrid_replicas_not_reduced", "fsdp_strategies_match_one_process"),
              ("gathered_copies_saved_for_backward", "fsdp_full_shard_frees_after_forward")]


@pytest.mark.parametrize("name, law", PINNED_TWO, ids=[n for n, _ in PINNED_TWO])
def test_draw_dependent_mutants_are_rejected_with_the_world_size_pinned_to_two(name, law, monkeypatch):
    if resolve_device() != "cpu":
        pytest.skip("the pinned run uses CPU ranks (4 of them for the hybrid case); the GPU runs the drawn one")
    mutant = next(m for m in _mutants() if m.name == name)
    assert law in mutant.caught_by
    monkeypatch.setenv("SUITE_WORLD_SIZE", "2")
    verdict = _run(_runner(_module_of(mutant)), law, mutant.target, mutant.flavour)
    assert verdict is not None, f"mutant {name!r} passed the {law} law with the world size pinned to 2"
