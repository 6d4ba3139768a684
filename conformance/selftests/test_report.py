"""The conformance report never says "conforms" for a check that did not run.

Two ways a check can fail to run without a failing outcome of its own: its xdist worker
crashes (the Triton interpreter segfaulting), or the run stops before it (workers not
replaced, ``-x``).  xdist's report for a crashed worker carries no capability label, and
a test that never ran sends no report at all.  Both must read FAILS.
"""

from __future__ import annotations

import os
import sys
import textwrap
from types import SimpleNamespace

import pytest

from conformance.capabilities import SELF, capability_of_nodeid
from conformance.report import NEVER_REPORTED, NOTHING_CHECKED, ConformanceReport

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CAUSAL = [f"properties/test_attention.py::test_attention_law[triton-causal_{x}]" for x in "abc"]


def _report(nodeid, outcome, when="call", labelled=True, longrepr=None):
    """A test report as xdist hands it to the controller (a crashed worker's has no properties)."""
    props = [("worker", "gw0")] if labelled else []
    return pytest.TestReport(nodeid, (nodeid, None, nodeid), {}, outcome, longrepr, when, user_properties=props)


def _controller():
    config = SimpleNamespace(getoption=lambda name, default=None: default, option=SimpleNamespace(collectonly=False))
    return ConformanceReport(config)


def _row(report, capability):
    return next(r for r in report.as_json()["capabilities"] if r["capability"] == capability)


@pytest.mark.parametrize(
    "nodeid, capability",
    [
        ("properties/test_attention.py::test_attention_law[triton-causal_output_ignores_future_keys]", "attention triton causal"),
        ("properties/test_attention.py::test_attention_law[pytorch-float64_gradcheck]", "attention pytorch backward"),
        ("conformance/spec/test_attention.py::test_cs336_contract[pytorch-cs336_noncausal_forward_backward]", "attention pytorch backward"),
        ("conformance/selftests/test_report.py::test_a_node_id_alone_names_its_capability", SELF),
        ("properties/test_triton_configs.py::test_every_config_computes_the_same_attention", SELF),
        ("properties/test_ddp.py::test_buckets_partition_x[impl-naive]", SELF),
        ("conformance/spec/test_ddp.py::test_spec_case[bucketed-toy_training]", "DDP bucketed"),
        ("conformance/selftests/test_ddp_spec_self.py::test_impl_bucketed_rejects_a_bad_bucket_size[0-ValueError-positive]", SELF),
        ("properties/test_sharded_optimizer.py::test_greedy_assignment_depends_only_on_sizes", SELF),
        ("properties/test_sharded_optimizer.py::test_sharded_optimizer_law[per_rank_state_dict_round_trips]", "sharded optimizer"),
    ],
)
def test_a_node_id_alone_names_its_capability(nodeid, capability):
    assert capability_of_nodeid(nodeid) == capability


def test_a_module_outside_the_table_is_an_error_not_another_row():
    """Moving a check's file cannot move it to another row: its new module is unknown."""
    with pytest.raises(KeyError, match="not in the capability table"):
        capability_of_nodeid("properties/moved/test_attention.py::test_attention_law[triton-causal_x]")


def test_collecting_a_module_outside_the_table_stops_the_run(pytester, monkeypatch):
    """A check moved to another file in a copy of the tree: the run stops at collection
    naming the module, rather than report it under a capability read from its path."""
    pytester.makepyfile(test_attention_moved="def test_law():\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = pytester.runpytest_subprocess("-p", "conformance.report", "-p", "no:cacheprovider", "-p", "no:xdist")
    assert result.ret != 0
    assert "not in the capability table" in result.stderr.str() + result.stdout.str()
    assert "test_attention_moved" in result.stderr.str() + result.stdout.str()


def test_self_checks_never_enter_a_targets_report():
    report = _controller()
    ids = ["conformance/selftests/test_harness.py::test_x", "properties/test_ddp.py::test_y[impl-naive]"]
    report.pytest_xdist_node_collection_finished(node=None, ids=ids)
    for nodeid in ids:
        report.pytest_runtest_logreport(_report(nodeid, "passed"))
    rows = [r for r in report.as_json()["capabilities"] if r["status"] not in ("not checked", "no checks yet")]
    assert rows == [] and report.as_json()["collected"] == 0


def test_a_crashed_worker_report_without_a_label_fails_its_capability():
    report = _controller()
    report.pytest_xdist_node_collection_finished(node=None, ids=CAUSAL[:2])
    report.pytest_runtest_logreport(_report(CAUSAL[0], "passed"))
    crash = f"worker 'gw0' crashed while running {CAUSAL[1]!r}"
    report.pytest_runtest_logreport(_report(CAUSAL[1], "failed", when="???", labelled=False, longrepr=crash))
    row = _row(report, "attention triton causal")
    assert row["status"] == "FAILS", row
    assert row["failed"] == 1 and row["passed"] == 1
    assert "crashed" in row["failures"][0]["message"]


def test_a_collected_check_that_never_reported_fails_its_capability():
    report = _controller()
    report.pytest_xdist_node_collection_finished(node=None, ids=CAUSAL)
    for nodeid in CAUSAL[:2]:
        report.pytest_runtest_logreport(_report(nodeid, "passed"))
    out = report.as_json()
    row = _row(report, "attention triton causal")
    assert row["status"] == "FAILS" and row["unreported"] == 1, row
    assert "never reported" in row["detail"]
    (failure,) = row["failures"]
    assert failure["test"] == CAUSAL[2] and failure["message"] == NEVER_REPORTED and failure["tier"] == "beyond the contract: causal c"
    assert failure["replay"].startswith(f"python -m pytest '{CAUSAL[2]}'")
    assert out["collected"] == 3 and out["never_reported"] == 1
    report.as_json()  # counting again does not count twice
    assert _row(report, "attention triton causal")["unreported"] == 1


def test_a_capability_whose_checks_all_reported_still_conforms():
    report = _controller()
    report.pytest_xdist_node_collection_finished(node=None, ids=CAUSAL)
    for nodeid in CAUSAL:
        report.pytest_runtest_logreport(_report(nodeid, "passed"))
    assert _row(report, "attention triton causal")["status"] == "conforms"


REGISTER_INNER = """
from conformance import capabilities
capabilities.register("test_attention_inner", capabilities.attention)
"""

INNER = """
    import os
    import pytest

    @pytest.mark.parametrize("law", ["causal_a", "causal_b", "causal_c"])
    @pytest.mark.parametrize("flavour", ["triton"])
    def test_law(flavour, law):
        if law == "causal_b":
            os._exit(1)  # the worker dies mid-test, as when the Triton interpreter segfaults
"""


def test_a_run_whose_worker_crashes_reports_fails_not_conforms(pytester, monkeypatch):
    """End to end under xdist: one check passes, one crashes its worker, one never runs."""
    pytester.makepyfile(test_attention_inner=textwrap.dedent(INNER))
    pytester.makeconftest(REGISTER_INNER)
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = pytester.runpytest_subprocess(
        "-p", "conformance.report", "-p", "xdist", "-n", "1", "--max-worker-restart=0", "-p", "no:cacheprovider",
    )
    out = result.stdout.str()
    line = next((ln for ln in out.splitlines() if "attention triton causal" in ln and "FAIL " not in ln), "")
    assert "FAILS" in line and "1 failed, 1 passed, 1 never reported" in line, out[-3000:]
    assert "conforms" not in line
    assert "1 of 3 collected checks never reported" in out, out[-3000:]
    assert "FAIL attention triton causal (beyond the contract: causal b): worker 'gw0' crashed while running" in out, out[-3000:]


@pytest.mark.skipif(sys.platform == "win32", reason="os._exit semantics")
def test_a_run_stopped_early_reports_the_checks_it_never_ran(pytester, monkeypatch):
    """Without xdist: -x stops at the first failure; the checks after it are not conforming."""
    pytester.makepyfile(
        test_attention_inner=textwrap.dedent(
            """
            import pytest

            def test_pytorch_forward_fails():
                assert False

            @pytest.mark.parametrize("law", ["causal_a", "causal_b"])
            @pytest.mark.parametrize("flavour", ["triton"])
            def test_law(flavour, law):
                pass
            """
        )
    )
    pytester.makeconftest(REGISTER_INNER)
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = pytester.runpytest_subprocess("-p", "conformance.report", "-x", "-p", "no:cacheprovider", "-p", "no:xdist")
    out = result.stdout.str()
    line = next((ln for ln in out.splitlines() if "attention triton causal" in ln and "FAIL " not in ln), "")
    assert "FAILS" in line and "2 never reported" in line, out[-3000:]


def test_a_target_with_nothing_offered_or_run_here_does_not_exit_0(pytester, monkeypatch):
    """Every check skipped as not offered or not run here: nothing failed, but nothing
    conforms either; a CI job that reads the exit status must not pass such a target."""
    pytester.makepyfile(
        test_attention_inner=textwrap.dedent(
            """
            import pytest

            @pytest.mark.parametrize("law", ["causal_a", "causal_b"])
            @pytest.mark.parametrize("flavour", ["triton"])
            def test_law(flavour, law):
                if law == "causal_a":
                    pytest.skip("not offered: get_flashattention_autograd_function_triton raises NotImplementedError")
                pytest.skip("needs a GPU: this machine has 0")
            """
        )
    )
    pytester.makeconftest(REGISTER_INNER)
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = pytester.runpytest_subprocess("-p", "conformance.report", "-p", "no:cacheprovider", "-p", "no:xdist")
    out = result.stdout.str()
    assert result.ret == NOTHING_CHECKED, (result.ret, out[-3000:])
    assert f"nothing was checked: every capability of the target is not offered or not run here (exit status {NOTHING_CHECKED}" in out, out[-3000:]


def test_every_capability_of_the_protocol_has_a_row_even_without_checks():
    report = _controller()
    report.pytest_xdist_node_collection_finished(node=None, ids=CAUSAL[:1])
    report.pytest_runtest_logreport(_report(CAUSAL[0], "passed"))
    rows = {r["capability"]: r for r in report.as_json()["capabilities"]}
    from conformance.target import CAPABILITY_FACTORIES

    for family in CAPABILITY_FACTORIES:
        assert family in rows or any(name.startswith(family + " ") for name in rows), family
    assert rows["attention pytorch"]["status"] == "not checked"


def test_the_contract_verdict_leads_and_a_failing_extra_only_lowers_the_count():
    report = _controller()
    contract = "conformance/spec/test_attention.py::test_cs336_contract[pytorch-cs336_noncausal_forward_backward]"
    extras = [f"conformance/spec/test_attention.py::test_api_contract[pytorch-{x}_backward]" for x in ("four_d", "scale")]
    report.pytest_xdist_node_collection_finished(node=None, ids=[contract] + extras)
    report.pytest_runtest_logreport(_report(contract, "passed"))
    report.pytest_runtest_logreport(_report(extras[0], "passed"))
    report.pytest_runtest_logreport(_report(extras[1], "failed", longrepr="E   AssertionError: wrong scale"))
    row = _row(report, "attention pytorch backward")
    assert row["status"] == "conforms", row
    assert row["beyond_the_contract"] == {"passed": 1, "total": 2, "missing": ["scale backward"]}
    assert "contract: 1 passed; beyond the contract: 1 of 2, missing: scale backward" == row["detail"]
    assert row["failures"][0]["tier"] == "beyond the contract: scale backward"
    report.pytest_runtest_logreport(_report(contract.replace("noncausal", "x"), "failed", longrepr="E   AssertionError: O"))
    assert _row(report, "attention pytorch backward")["status"] == "FAILS"


def test_a_bare_assertion_from_the_targets_code_says_which_assert(tmp_path):
    """A message-less AssertionError (a student's own shape check) reads as the assert that
    failed, with its file and line: "AssertionError" alone gives a student nothing to act on."""
    source = tmp_path / "student_attention.py"
    source.write_text("def forward(q):\n    assert q.shape[-2] % 16 == 0\n")

    class Longrepr:  # what pytest hands over for a failure raised at source:2
        reprcrash = SimpleNamespace(path=str(source), lineno=2, message="AssertionError")

        def toterminal(self, tw):
            tw.line("E   AssertionError")

    report = _controller()
    nodeid = "conformance/spec/test_attention.py::test_api_contract[pytorch-four_dim_inputs]"
    report.pytest_runtest_logreport(_report(nodeid, "failed", longrepr=Longrepr()))
    message = _row(report, "attention pytorch forward")["failures"][0]["message"]
    assert message == f"AssertionError raised without a message at {source}:2: `assert q.shape[-2] % 16 == 0`"


def test_a_backward_returning_the_wrong_number_of_values_is_explained():
    """torch's "returned an incorrect number of gradients (expected 4, got 1)" is what an
    unwritten ``backward`` (``pass``) gives: the verdict says what backward must return."""
    nodeid = "conformance/spec/test_attention.py::test_cs336_contract[triton-cs336_noncausal_forward_backward]"
    words = "RuntimeError: function AttnBackward returned an incorrect number of gradients (expected 4, got 1)"
    report = _controller()
    report.pytest_runtest_logreport(_report(nodeid, "failed", longrepr=f"E   {words}"))
    message = _row(report, "attention triton backward")["failures"][0]["message"]
    assert message.startswith(words) and "one value per input of forward, 4 here" in message and "`pass`" in message


def test_a_triton_row_judged_on_the_cpu_says_what_ran(monkeypatch):
    """On a CPU machine a Triton class may hand CPU tensors to a PyTorch fallback: the
    report says the verdict is about the code that ran, and says nothing of it on a GPU."""
    nodeid = "conformance/spec/test_attention.py::test_cs336_contract[triton-cs336_noncausal_forward_backward]"
    for device, expected in (("cpu", True), ("cuda", False)):
        monkeypatch.setenv("SUITE_DEVICE", device)
        report = _controller()
        report.pytest_runtest_logreport(_report(nodeid, "passed"))
        notes = dict(report.notes())
        assert ("attention triton" in notes) == expected, notes
        if expected:
            assert "fallback" in notes["attention triton"] and "attention triton" in report.as_json()["notes"]


def test_a_capability_note_is_shown_only_where_its_checks_ran():
    """The FSDP note explains a verdict; for a target that offers no FSDP there is none."""
    nodeid = "conformance/spec/test_fsdp.py::test_cs336_toy_model[partition]"
    report = _controller()
    report.pytest_runtest_logreport(_report(nodeid, "skipped", longrepr=(__file__, 1, "Skipped: not offered: get_fsdp is missing")))
    assert _row(report, "FSDP")["status"] == "not offered"
    assert "FSDP" not in dict(report.notes())
    report.pytest_runtest_logreport(_report(nodeid.replace("partition", "trajectory"), "passed"))
    assert "FSDP" in dict(report.notes())


CUT_INNER = """
    import warnings
    import pytest
    from conformance.lawbook import LawBudgetWarning

    @pytest.mark.parametrize("law", ["causal_a", "causal_b"])
    @pytest.mark.parametrize("flavour", ["triton"])
    def test_law(flavour, law):
        if law == "causal_b":
            warnings.warn(LawBudgetWarning("causal_b[triton]: 1 example(s) ran and passed before its time budget of "
                                           "60 s ran out; set SUITE_LAW_BUDGET_S to draw more"))
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "xdist"])
def test_a_law_cut_short_by_its_time_budget_is_named_in_the_report(pytester, monkeypatch, xdist):
    """A law that stopped drawing when its budget ran out passed on fewer examples than asked:
    the row still conforms, and says how many checks were cut and how to draw more."""
    pytester.makepyfile(test_attention_inner=textwrap.dedent(CUT_INNER))
    pytester.makeconftest(REGISTER_INNER)
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    workers = ["-p", "xdist", "-n", "1"] if xdist else ["-p", "no:xdist"]
    result = pytester.runpytest_subprocess("-p", "conformance.report", *workers, "-p", "no:cacheprovider",
                                           "--conformance-report", str(pytester.path / "out" / "report"))
    out = result.stdout.str()
    line = next((ln for ln in out.splitlines() if "attention triton causal" in ln and "CUT " not in ln), "")
    assert "conforms" in line and "2 passed" in line and "1 cut short by a time budget" in line, out[-3000:]
    assert "CUT  attention triton causal: causal_b[triton]: 1 example(s) ran" in out, out[-3000:]
    markdown = (pytester.path / "out" / "report.md").read_text()
    assert "## Cut short by a time budget" in markdown and "SUITE_LAW_BUDGET_S" in markdown, markdown
