"""The suite has teeth: every kept attention mutant is rejected by the law that exists for it.

For each mutant in ``conformance.mutants.attention`` the laws (and spec checks) it names
in ``caught_by`` are run against it, with a bounded number of examples and no shrinking;
each must fail.  A mutant that slips through a law it was kept for fails this test.
Also: the mutants' shared implementation with every bug switched off passes them all, so
the rejections are caused by the bugs, not by the harness.
"""

import pytest
from hypothesis import Phase

from conformance import attention_spec
from conformance.mutants.attention import MUTANT_LIST, buggy_flash
from conformance.profiles import examples
from properties.attention_laws import LAWS_BY_NAME, check_law

# Enough examples that each bug's triggering shapes are drawn; no shrinking, we only need a verdict.
MUTANT_SETTINGS = dict(phases=[Phase.explicit, Phase.generate], database=None)


def _rejects(check_name, attn, device):
    """Return the failure message if the check rejects attn, else None."""
    try:
        if check_name.startswith("spec:"):
            attention_spec.SPEC_CHECKS[check_name[5:]](attn, device)
        else:
            check_law(LAWS_BY_NAME[check_name], attn, device, "pytorch", max_examples=examples(40), **MUTANT_SETTINGS)
    except AssertionError as exc:
        return str(exc).splitlines()[0]
    except Exception as exc:  # a crash also rejects, but say so
        return f"crashed: {type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize(
    "mutant_name, check_name",
    [(m.name, c) for m in MUTANT_LIST for c in m.caught_by],
)
def test_mutant_is_rejected(mutant_name, check_name, device):
    from conformance.mutants.attention import MUTANTS

    attn = MUTANTS[mutant_name].target().get_flashattention_autograd_function_pytorch()
    verdict = _rejects(check_name, attn, device)
    assert verdict is not None, f"mutant {mutant_name!r} ({MUTANTS[mutant_name].bug}) passed {check_name}"


@pytest.mark.parametrize("check_name", sorted({c for m in MUTANT_LIST for c in m.caught_by}))
def test_mutant_scaffold_without_bugs_passes(check_name, device):
    verdict = _rejects(check_name, buggy_flash(frozenset()), device)
    assert verdict is None, f"the bug-free mutant scaffold fails {check_name}: {verdict}"


def test_every_law_has_a_mutant_it_catches():
    caught = {c for m in MUTANT_LIST for c in m.caught_by}
    missing = [name for name in LAWS_BY_NAME if name not in caught]
    assert not missing, f"laws with no kept mutant to show they can fail: {missing}"
    assert len(MUTANT_LIST) >= 10
