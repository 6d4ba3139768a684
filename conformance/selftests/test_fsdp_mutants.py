"""The FSDP laws have teeth: every kept mutant is rejected by the laws it names, and impl
passes the same runs (the control).  A bug that needs two ranks to show is skipped, not
passed, where only one rank can run."""

import pytest

from conformance.harness import available_world_sizes, pinned_world_size
from conformance.laws.fsdp.laws import LAWS_BY_NAME, rejection
from conformance.mutants.fsdp import MUTANTS
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


def _ranks(device) -> int:
    return pinned_world_size() or max(available_world_sizes(device))


@pytest.mark.parametrize("mutant, law_name", [(m, law) for m in MUTANTS for law in m.caught_by], ids=lambda x: getattr(x, "name", x))
def test_mutant_is_rejected(mutant, law_name, device):
    verdict = rejection(law_name, mutant.target, examples(12))
    if verdict is None and _ranks(device) < 2:
        pytest.skip(f"needs 2 ranks: {mutant.name} cannot show at world size 1")
    assert verdict is not None, f"mutant {mutant.name!r} ({mutant.bug}) passed {law_name}"


@pytest.mark.parametrize("law_name", sorted({law for m in MUTANTS for law in m.caught_by}))
def test_impl_passes_the_runs_that_reject_the_mutants(law_name):
    assert rejection(law_name, "impl", examples(12)) is None


def test_every_law_has_a_mutant_it_rejects():
    caught = {law for m in MUTANTS for law in m.caught_by}
    assert set(LAWS_BY_NAME) <= caught, f"laws without a mutant: {sorted(set(LAWS_BY_NAME) - caught)}"
