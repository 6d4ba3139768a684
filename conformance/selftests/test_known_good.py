"""No false alarms: every known-good target conforms at the contract tier.

Each ``conformance.selftests.known_good.KNOWN_GOOD`` entry is a correct implementation of
another design than impl's.  Its capability's spec and properties files run against it with
``--contract-only``, in a child pytest process, as a student's run would, and the report's
rows for the capability must read "conforms".  A row the machine cannot run ("needs a GPU",
"needs 4 ranks") is a skip with that reason; a row "not offered" is a failure of the table
(the target was listed for a capability it does not offer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.selftests.known_good import KNOWN_GOOD, VARIATIONS

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


def _ids(entry) -> str:
    return f"{entry.capability}-{entry.target.rsplit('.', 1)[-1]}"


@pytest.mark.parametrize("entry", KNOWN_GOOD, ids=[_ids(e) for e in KNOWN_GOOD])
def test_every_known_good_target_conforms_at_the_contract_tier(entry, tmp_path):
    if entry.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip(f"needs a GPU: {entry.target} runs on CUDA only")
    _judge_contract(entry, tmp_path)


def test_a_broken_target_listed_as_known_good_is_refused(tmp_path):
    """The judgement above bites: a kept mutant (the sampler seeded per rank, so ranks
    disagree on the order) listed as if it were known-good reads FAILS at the contract."""
    from conformance.selftests.known_good import KnownGood

    broken = KnownGood("distributed sampler", "conformance.mutants.sampler:seeded_per_rank", "a kept mutant",
                       ("conformance/spec/test_sampler.py",))
    with pytest.raises(AssertionError, match="is correct but FAILS the contract"):
        _judge_contract(broken, tmp_path)


def test_a_target_offering_nothing_listed_as_known_good_is_refused(tmp_path):
    """A known-good entry must offer its capability: one that offers none of it is refused,
    not skipped (a skip is only for rows that could not run on this machine)."""
    from conformance.selftests.known_good import KnownGood

    empty = KnownGood("distributed sampler", "conformance.selftests.targets.slow_mean", "offers no sampler",
                      ("conformance/spec/test_sampler.py",))
    try:
        with pytest.raises(AssertionError, match="offers no distributed sampler"):
            _judge_contract(empty, tmp_path)
    except pytest.skip.Exception as skip:  # a skip here would hide the refusal
        pytest.fail(f"a target offering nothing was skipped, not refused: {skip}")


def _judge_contract(entry, tmp_path) -> None:
    """Run ``entry``'s capability at the contract tier in a child pytest; AssertionError
    unless its rows conform (a skip where nothing could run here)."""
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "pytest", *entry.tests, "--target", entry.target, "--contract-only",
           "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "--hypothesis-profile", "known_good",
           "--conformance-report", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    tail = (proc.stdout + proc.stderr)[-4000:]
    report = out.with_suffix(".json")
    assert report.exists(), f"no report from {' '.join(cmd)} (exit {proc.returncode}):\n{tail}"
    rows = [r for r in json.loads(report.read_text())["capabilities"] if r["capability"].startswith(entry.capability)]
    checked = [r for r in rows if r["contract"]["passed"] or r["contract"]["failed"] or r["contract"]["unreported"]]
    failing = [f"{r['capability']}: {r['detail']}; " + "; ".join(f["message"][:200] for f in r["failures"][:3])
               for r in rows if r["contract"]["failed"] or r["contract"]["unreported"]]
    assert not failing, f"{entry.target} ({entry.design}) is correct but FAILS the contract:\n" + "\n".join(failing)
    if not checked:
        reasons = sorted({reason for r in rows for reason in r["contract"]["skip_reasons"]})
        # Offered nothing: every reason is "not offered".  A row skipped for this machine
        # ("needs 2 GPUs") beside rows of the family the target does not offer is a skip.
        offered_nothing = bool(reasons) and all(r.startswith("not offered") for r in reasons)
        assert not offered_nothing, f"{entry.target} offers no {entry.capability}: {reasons}"
        pytest.skip("; ".join(reasons[:3]) or f"no contract check of {entry.capability} ran")


def test_every_capability_has_two_known_good_targets_besides_impl():
    from conformance.capabilities import FAMILY_MODULES

    families = {f.split()[0] if f.startswith(("attention", "DDP")) else f for f in FAMILY_MODULES}
    count = {family: sum(1 for e in KNOWN_GOOD if e.capability.startswith(family) and e.target != "impl")
             for family in families}
    short = sorted(f"{family} ({n})" for family, n in count.items() if n < 2)
    assert not short, f"capabilities with fewer than two known-good targets besides impl: {short}"
    undocumented = sorted(family for family in families if not VARIATIONS.get(family))
    assert not undocumented, f"capabilities whose legitimate design variations are not listed: {undocumented}"
