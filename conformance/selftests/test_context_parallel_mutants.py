"""The context-parallel laws have teeth: every kept mutant of
``conformance.mutants.context_parallel`` is rejected by each law in its ``caught_by``,
and impl passes the very same runs (the control).  Ring laws draw world sizes >= 2 where
the bug needs them (the law's own cases say so)."""

from __future__ import annotations

import pytest

from conformance.laws.context_parallel.laws import LAWS_BY_NAME, rejection
from conformance.mutants.context_parallel import MUTANTS
from conformance.profiles import examples

pytestmark = pytest.mark.distributed

MUTANT_EXAMPLES = 12


@pytest.mark.parametrize("mutant, law_name", [(m, law) for m in MUTANTS for law in m.caught_by],
                         ids=lambda x: x if isinstance(x, str) else x.name)
def test_mutant_is_rejected_by_the_law_kept_for_it(mutant, law_name):
    verdict = rejection(law_name, mutant.target, examples(MUTANT_EXAMPLES))
    assert verdict is not None, f"mutant {mutant.name!r} ({mutant.bug}) passed the {law_name} law"


@pytest.mark.parametrize("law_name", sorted({law for m in MUTANTS for law in m.caught_by}))
def test_impl_passes_the_same_runs(law_name):
    verdict = rejection(law_name, "impl", examples(MUTANT_EXAMPLES))
    assert verdict is None, f"impl fails the mutant run of the {law_name} law: {verdict}"


def test_every_law_has_a_mutant_it_catches():
    caught = {law for m in MUTANTS for law in m.caught_by}
    assert caught <= set(LAWS_BY_NAME), f"mutants name unknown laws: {sorted(caught - set(LAWS_BY_NAME))}"
    missing = sorted(set(LAWS_BY_NAME) - caught)
    assert not missing, f"laws with no kept mutant to show they can fail: {missing}"
    assert len(MUTANTS) >= 8
