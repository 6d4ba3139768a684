"""The tensor-parallel laws have teeth: every kept mutant is rejected by each law it is kept for.

A thin loop over ``conformance.mutants.tensor_parallel.MUTANTS``: each (mutant, law) pair
runs the law against the mutant with a bounded number of deterministic examples at world
sizes >= 2 (``laws.rejection``), and fails if the mutant survives.  The control: ``impl``
(and the right flags of the cross-entropy re-implementation the CE mutants share) pass
the very same runs.
"""

from __future__ import annotations

import pytest

from conformance.laws.tensor_parallel import laws
from conformance.mutants.tensor_parallel import MUTANTS
from conformance.profiles import examples

pytestmark = pytest.mark.distributed

PAIRS = [(m, law) for m in MUTANTS for law in m.caught_by]
CONTROLS = sorted({(law, "impl") for m in MUTANTS for law in m.caught_by}
                  | {(law, "conformance.mutants.tensor_parallel:ce_right") for m in MUTANTS for law in m.caught_by if m.name.startswith("ce_")})
MAX_EXAMPLES = 6


@pytest.mark.parametrize("mutant,law", PAIRS, ids=[f"{m.name}-{law}" for m, law in PAIRS])
def test_mutant_is_rejected(mutant, law):
    reason = laws.rejection(law, mutant.target, examples(MAX_EXAMPLES))
    assert reason is not None, f"mutant {mutant.name} ({mutant.bug}) survived {law}"


@pytest.mark.parametrize("law,target", CONTROLS, ids=[f"{t.split(':')[-1]}-{law}" for law, t in CONTROLS])
def test_control_passes_the_same_runs(law, target):
    reason = laws.rejection(law, target, examples(MAX_EXAMPLES))
    assert reason is None, f"{target} fails {law}: {reason}"
