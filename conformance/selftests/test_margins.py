"""conformance/margins.py: every verdict the oracle gives in a test is kept as error / bound, the
worst per test written and tabled worst first, so a survey of correct code shows which laws
come near their bounds."""

from __future__ import annotations

import json
import os
import textwrap

import torch

from conformance import margins, oracle

pytest_plugins = ["pytester"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _verdict(error, bound, name="t"):
    return oracle.Verdict(name, error, bound, 0.0, torch.float32, None, 0)


def test_the_worst_ratio_of_a_test_is_kept_and_tabled_worst_first(monkeypatch):
    monkeypatch.setattr(margins, "_WORST", {})
    margins.record("a", _verdict(1.0, 4.0, "x"))
    margins.record("a", _verdict(3.0, 4.0, "y"))
    margins.record("a", _verdict(1.0, 4.0, "z"))
    margins.record("b", _verdict(9.0, 10.0, "w"))
    margins.record("c", _verdict(1.0, 0.0))  # no bound: nothing to compare
    margins.record(None, _verdict(5.0, 1.0))  # outside a test
    assert margins._WORST["a"][:2] == (0.75, "y") and set(margins._WORST) == {"a", "b"}
    rows = margins.table(margins._WORST).splitlines()[2:]
    assert rows[0].startswith("| 0.900 | b |") and rows[1].startswith("| 0.750 | a | y |")


def test_a_run_with_the_plugin_writes_each_tests_worst_verdict(pytester, monkeypatch):
    pytester.makepyfile(test_close=textwrap.dedent("""
        import torch
        from conformance import oracle

        def test_near():
            ref = torch.ones(4, dtype=torch.float64)
            eager = torch.ones(4) + 1e-6
            oracle.assert_close("near", torch.ones(4) + 3e-6, ref, eager)

        def test_far_failing():
            ref = torch.ones(4, dtype=torch.float64)
            oracle.assert_close("far", torch.ones(4) + 1.0, ref, torch.ones(4))
    """))
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = pytester.path / "m"
    result = pytester.runpytest_subprocess("-p", "conformance.margins", "--margins-out", str(out), "-p", "no:cacheprovider",
                                           "-p", "no:xdist")
    assert result.ret == 1  # the far one fails; its verdict is kept all the same
    worst = json.loads((out / "margins-main.json").read_text())
    near, far = worst["test_close.py::test_near"], worst["test_close.py::test_far_failing"]
    assert 0 < near[0] < 1 and near[1] == "near" and far[0] > 1
    assert (out / "margins.md").read_text().splitlines()[2].startswith("| ")
