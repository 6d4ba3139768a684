"""The DDP laws have teeth: every kept mutant is rejected by each law it is kept for.

For each mutant of ``conformance.mutants.ddp`` and each law (or ``spec:`` case of
``conformance.ddp_spec``) in its ``caught_by``, the law
runs against the mutant (as a target spec, so the ranks load it) with a bounded number
of examples drawn deterministically, world sizes >= 2 (most bugs are invisible on one
rank) and no shrinking: we only need a verdict.  A mutant that passes a law kept for it
fails this test.  The control: impl's unmodified wrappers pass the very same runs.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings
from hypothesis.errors import FlakyFailure

from conformance import ddp_spec
from conformance.mutants.ddp import MUTANT_LIST, MUTANTS
from conformance.test_ddp_spec import BUCKET_SIZES_MB
from conformance.profiles import examples
from conformance.target import NotOffered
from properties import ddp_laws as laws

pytestmark = pytest.mark.distributed

MUTANT_SETTINGS = dict(phases=[Phase.explicit, Phase.generate], database=None, derandomize=True, report_multiple_bugs=False)


@pytest.fixture(autouse=True)
def _two_ranks():
    if laws.max_world_size() < 2:
        pytest.skip("needs 2 GPUs: most DDP bugs are invisible on one rank")


def rejection(law_name: str, target_spec: str, flavour: str, max_examples: int) -> str | None:
    """The first line of the law's (or spec case's) failure against the target, or None."""
    if law_name.startswith("spec:"):
        try:
            for bucket_size_mb in BUCKET_SIZES_MB[flavour]:
                ddp_spec.run_case(law_name.removeprefix("spec:"), target_spec, flavour, bucket_size_mb)
        except AssertionError as exc:
            return str(exc).strip().splitlines()[0]
        return None
    law, cases = laws.LAWS[law_name]

    @settings(max_examples=max_examples, **MUTANT_SETTINGS)
    @given(case=cases(min_world=2))
    def run(case):
        law(target_spec, flavour, case)

    try:
        run()
    except NotOffered:
        raise
    except AssertionError as exc:  # includes RankFailure and RankTimeout
        return str(exc).strip().splitlines()[0]
    except FlakyFailure as exc:  # failed on its first call, passed on replay: still a rejection
        return "flaky rejection: " + str(exc.exceptions[0]).strip().splitlines()[0]
    return None


@pytest.mark.parametrize("mutant_name, law_name", [(m.name, law) for m in MUTANT_LIST for law in m.caught_by])
def test_mutant_is_rejected_by_the_law_kept_for_it(mutant_name, law_name):
    mutant = MUTANTS[mutant_name]
    verdict = rejection(law_name, mutant.spec, mutant.flavour, examples(12))
    assert verdict is not None, f"mutant {mutant_name!r} ({mutant.bug}) passed the {law_name} law"


@pytest.mark.parametrize("law_name, flavour", sorted({(law, m.flavour) for m in MUTANT_LIST for law in m.caught_by if law in laws.LAWS}))
def test_unbroken_wrappers_pass_the_same_runs(law_name, flavour):
    """The control: impl's own wrappers pass exactly the runs the mutants fail, so a
    rejection is the bug's doing (not a broken pool or a law that fails everything).
    (The spec cases' control is conformance/test_ddp_spec.py.)"""
    verdict = rejection(law_name, "impl", flavour, examples(12))
    assert verdict is None, f"impl's {flavour} wrapper fails the mutant run of the {law_name} law: {verdict}"


def test_every_law_has_a_mutant_it_catches():
    caught = {law for m in MUTANT_LIST for law in m.caught_by}
    missing = sorted((set(laws.LAWS) | {f"spec:{c}" for c in ddp_spec.CASES}) - caught)
    assert not missing, f"laws with no kept mutant to show they can fail: {missing}"
    assert len(MUTANT_LIST) >= 8
