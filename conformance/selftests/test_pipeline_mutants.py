"""The pipeline laws have teeth: every kept mutant is rejected by each law it names, and
the unbroken ``impl`` passes the same runs (the control).

A thin loop over ``conformance.mutants.pipeline.MUTANTS`` calling the laws' ``rejection``
runner (bounded examples, derandomised, no shrinking).  Bugs that need two ranks to show
(none of the schedule bugs; all executor bugs show on one rank) run on the drawn world
sizes 1..4.
"""

import pytest

from conformance.laws.pipeline.laws import DISTRIBUTED, LAWS_BY_NAME, rejection
from conformance.mutants.pipeline import MUTANTS
from conformance.profiles import examples

pytestmark = pytest.mark.distributed

RUNS = sorted({(m.name, m.target, law) for m in MUTANTS for law in m.caught_by})


def _budget(law: str) -> int:
    """Pure schedule laws are cheap; a law on ranks costs a pipeline step per example."""
    return examples(4) if law in DISTRIBUTED else examples(12)


@pytest.mark.parametrize("name, spec, law", RUNS, ids=[f"{n}-{law}" for n, _, law in RUNS])
def test_mutant_is_rejected_by_its_law(name, spec, law):
    verdict = rejection(law, spec, _budget(law))
    assert verdict is not None, f"mutant {name!r} passed {law}"


@pytest.mark.parametrize("law", sorted({law for _, _, law in RUNS}))
def test_impl_passes_the_same_runs(law):
    verdict = rejection(law, "impl", _budget(law))
    assert verdict is None, f"impl fails {law}: {verdict}"


def test_every_law_has_a_mutant_it_catches():
    caught = {law for m in MUTANTS for law in m.caught_by}
    missing = sorted(set(LAWS_BY_NAME) - caught)
    assert not missing, f"pipeline laws with no kept mutant to show they can fail: {missing}"
    assert len(MUTANTS) >= 6
