"""The sharded-optimizer laws have teeth: every kept mutant is rejected by the laws it names.

For each mutant in ``conformance.mutants.sharded_optimizer`` the laws in its ``caught_by``
run against it with a bounded number of examples, no shrinking and a fixed derandomised
seed (a verdict, not a minimal example); each must fail.  A mutant that passes every law
fails ``test_no_mutant_passes_every_law``.  Every law has at least one mutant it catches.
"""

import pytest
from hypothesis import Phase

from conformance.harness import available_world_sizes, pinned_world_size
from conformance.mutants.sharded_optimizer import MUTANT_LIST, MUTANTS
from conformance.profiles import examples
from properties.sharded_optimizer_laws import LAWS_BY_NAME, check_law

pytestmark = pytest.mark.distributed

MUTANT_SETTINGS = dict(phases=[Phase.explicit, Phase.generate], database=None, derandomize=True)


def _rejects(mutant_name: str, law_name: str, device) -> str | None:
    """The first line of the law's failure on the mutant, or None if the mutant passed."""
    spec = f"conformance.mutants.sharded_optimizer:{mutant_name}"
    try:
        check_law(LAWS_BY_NAME[law_name], spec, device, max_examples=examples(10), **MUTANT_SETTINGS)
    except AssertionError as exc:  # RankFailure and RankTimeout are AssertionErrors too
        return str(exc).splitlines()[0]
    return None


def _skip_if_one_rank(device, what: str) -> None:
    """A sharding bug needs two ranks to show: with one rank every parameter is owned
    locally and the sharded optimizer is the unsharded one.  Where only one rank can run
    (one GPU, or --world-size 1), a surviving mutant is not run here rather than failed."""
    ranks = pinned_world_size() or max(available_world_sizes(device))
    if ranks < 2:
        pytest.skip(f"needs 2 ranks (2 GPUs on CUDA): {what} survives at world size 1, where sharding changes nothing ({ranks} rank available)")


@pytest.mark.parametrize("mutant_name, law_name", [(m.name, law) for m in MUTANT_LIST for law in m.caught_by])
def test_mutant_is_rejected(mutant_name, law_name, device):
    verdict = _rejects(mutant_name, law_name, device)
    if verdict is None:
        _skip_if_one_rank(device, f"mutant {mutant_name!r}")
    assert verdict is not None, f"mutant {mutant_name!r} ({MUTANTS[mutant_name].bug}) passed {law_name}"


def test_no_mutant_passes_every_law(device):
    """Run every law against every mutant until one rejects it; fail if none does."""
    survivors = []
    for mutant in MUTANT_LIST:
        laws = list(mutant.caught_by) + [name for name in LAWS_BY_NAME if name not in mutant.caught_by]
        if not any(_rejects(mutant.name, law, device) is not None for law in laws):
            survivors.append(f"{mutant.name} ({mutant.bug})")
    if survivors:
        _skip_if_one_rank(device, f"{len(survivors)} mutant(s)")
    assert not survivors, f"mutants that pass every sharded-optimizer law: {survivors}"


def test_every_law_has_a_mutant_it_catches():
    caught = {law for m in MUTANT_LIST for law in m.caught_by}
    missing = [name for name in LAWS_BY_NAME if name not in caught]
    assert not missing, f"laws with no kept mutant to show they can fail: {missing}"
    assert len(MUTANT_LIST) >= 6
