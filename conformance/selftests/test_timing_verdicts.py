"""Verdicts of mutant and control runs that timing must not decide.  A Gluon run's child
process is killed as hung only for time it spends running, not compiling, since its last
progress (a call of the implementation starting, a float64 reference starting or done): a
cold Triton cache, a loaded GPU or a law that judges after all its calls must not read as a
hang, and a kernel that never finishes must still be caught
(``conformance.laws.attention.rejection``).  Nor is its setup counted (imports and the target's
load, up to its "READY" line), or a C++ extension's build or load (announced as a compile).  A failure Hypothesis could not replay (a race) is
still a rejection (``conformance.lawbook.first_failure_line``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conformance.laws.attention import rejection


def _child(body: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time\n{body}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# (what it shows, the child's body, limit_s, compile_allowance_s, killed as hung)
WATCHED_RUNS = [
    ("a long compile is not a hang",
     "print('COMPILING', flush=True); time.sleep(2.5); print('COMPILED', flush=True); print('VERDICT:', flush=True)",
     1.0, 60.0, False),
    ("a run silent past the limit is a hang",
     "print('COMPILING', flush=True); print('COMPILED', flush=True); time.sleep(30)", 1.0, 60.0, True),
    # 0.7 s + 0.7 s of running around a compile: past a 1 s limit in all, though neither stretch is
    ("running time adds up across compiles",
     "time.sleep(0.7); print('COMPILING', flush=True); print('COMPILED', flush=True); time.sleep(30)", 1.0, 60.0, True),
    # 3.2 s of running in all, past a 2 s limit, but a call starts every 0.4 s
    ("a slow run that keeps making progress is not a hang",
     "for _ in range(8):\n    time.sleep(0.4)\n    print('PROGRESS', flush=True)\nprint('VERDICT:', flush=True)",
     2.0, 60.0, False),
    ("a run silent past the limit after progress is a hang", "print('PROGRESS', flush=True); time.sleep(30)",
     1.0, 60.0, True),
    ("compiling past the allowance is a hang too", "print('COMPILING', flush=True); time.sleep(30)", 60.0, 1.0, True),
]
# (what it shows, the child's body, limit_s, compile_allowance_s, killed as hung): watched with setup=True
SETUP_RUNS = [
    ("a slow setup before READY is not a hang",
     "time.sleep(2.5); print('READY', flush=True); print('VERDICT:', flush=True)", 1.0, 60.0, False),
    ("after READY the clock runs", "print('READY', flush=True); time.sleep(30)", 1.0, 60.0, True),
    ("progress before READY does not start the clock",
     "print('PROGRESS', flush=True); time.sleep(2.5); print('READY', flush=True); print('VERDICT:', flush=True)",
     1.0, 60.0, False),
    ("a setup past the allowance is a hang", "time.sleep(30)", 60.0, 1.0, True),
]


@pytest.mark.parametrize("body, limit_s, allowance_s, hung, setup",
                         [r[1:] + (False,) for r in WATCHED_RUNS] + [r[1:] + (True,) for r in SETUP_RUNS],
                         ids=[r[0].replace(" ", "_") for r in WATCHED_RUNS + SETUP_RUNS])
def test_a_child_is_killed_as_hung_only_for_running_time_without_progress(body, limit_s, allowance_s, hung, setup):
    proc = _child(body)
    lines, killed, _ = rejection.watch_for_progress(proc, limit_s=limit_s, compile_allowance_s=allowance_s,
                                                    setup=setup)
    assert killed == hung
    if hung:
        assert proc.returncode is not None
    else:
        assert lines == ["VERDICT:"]


def test_without_setup_the_clock_runs_from_the_start():
    # the setup's allowance is the gluon child's (setup=True): elsewhere READY is a line like any
    proc = _child("time.sleep(2.5); print('READY', flush=True); print('VERDICT:', flush=True)")
    lines, killed, _ = rejection.watch_for_progress(proc, limit_s=1.0, compile_allowance_s=60.0)
    assert killed


def test_a_gluon_childs_setup_is_not_counted_as_a_hang(monkeypatch):
    # The child's imports and its target's load (READY ends them) run no kernel of the target: a
    # loaded machine's slow start is not a hang (a correct control read "hung" at a 40 s limit).
    monkeypatch.setattr(rejection, "HANG_LIMIT_S", 1.0)
    monkeypatch.setattr(rejection, "_CHILD", "import time\ntime.sleep(2.5)\nprint('READY', flush=True)\n"
                                             "print('VERDICT:', flush=True)")
    assert rejection._rejection_in_child("some_law", "impl", 3, "gluon") is None
    monkeypatch.setattr(rejection, "_CHILD", "import time\nprint('READY', flush=True)\ntime.sleep(30)")
    assert rejection._rejection_in_child("some_law", "impl", 3, "gluon").startswith("hung:")


def test_a_cpp_extension_build_is_announced_as_a_compile(monkeypatch, capsys):
    # A target that builds or loads a C++ extension in its first call (impl's launcher does): on a
    # loaded machine its processes wait in turn on the build's lock, which is compiling, not a hang.
    from torch.utils import cpp_extension

    def build(name, **kwargs):
        print("building", name, flush=True)
        if kwargs.get("fail"):
            raise RuntimeError("no compiler")
        return "module"

    monkeypatch.setattr(cpp_extension, "load", build)
    monkeypatch.setattr(cpp_extension, "load_inline", build)
    rejection.announce_extension_builds()
    rejection.announce_extension_builds()  # once only: a second call wraps nothing again
    assert cpp_extension.load("ext") == "module"
    with pytest.raises(RuntimeError, match="no compiler"):
        cpp_extension.load_inline("other", fail=True)
    assert capsys.readouterr().out.split() == ["COMPILING", "building", "ext", "COMPILED",
                                               "COMPILING", "building", "other", "COMPILED"]


def test_the_childs_stderr_comes_back_for_a_crash_report():
    proc = _child("import sys; sys.stderr.write('boom\\n'); sys.exit(3)")
    lines, hung, stderr = rejection.watch_for_progress(proc, limit_s=10.0, compile_allowance_s=10.0)
    assert not hung and lines == [] and "boom" in stderr and proc.returncode == 3


def test_the_child_program_is_valid_python_with_the_compile_hooks():
    code = rejection._CHILD.format(law="some_law", target="impl", examples=3, flavour="gluon")
    compile(code, "<child>", "exec")
    assert "jit_cache_hook" in code and "jit_post_compile_hook" in code and "PROGRESS" in code
    assert "announce_extension_builds()" in code


def test_a_failure_hypothesis_could_not_replay_is_still_a_rejection():
    # A race (a reduction not waited on) fails one run and passes the replay: Hypothesis raises
    # FlakyFailure, which is the law finding the target wrong, not the target passing.
    from hypothesis.errors import FlakyFailure

    from conformance.lawbook import first_failure_line

    def racy():
        raise FlakyFailure("Hypothesis failed to reproduce", [AssertionError("rank 0 w: |err| = 1e-3\nmore")])

    assert first_failure_line(racy) == "flaky: rank 0 w: |err| = 1e-3"


def test_a_budget_cut_in_the_child_is_warned_in_the_parent(monkeypatch):
    # A law whose time budget ran out with every example passing has not shown the mutant; the
    # child's cut must reach the mutant tests (which skip on it) instead of reading as a pass.
    from conformance.lawbook import LawBudgetWarning

    monkeypatch.setattr(rejection, "_CHILD", "print('BUDGET_CUT:some_law: 3 example(s) ran', flush=True)\n"
                                             "print('VERDICT:', flush=True)")
    with pytest.warns(LawBudgetWarning, match="3 example"):
        assert rejection._rejection_in_child("some_law", "impl", 40, "gluon") is None


def test_the_child_program_reports_a_real_budget_cut(monkeypatch):
    # The child program itself, on a law that cannot finish 10**4 examples in a 1 s budget.
    monkeypatch.setenv("SUITE_LAW_BUDGET_S", "1")
    code = rejection._CHILD.format(law="constant_values_give_constant_output", target=rejection.CONTROL,
                                   examples=10**4, flavour="pytorch")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert any(line.startswith(rejection.BUDGET_CUT) for line in lines), done.stdout[-2000:] + done.stderr[-2000:]
    assert lines[-1] == "VERDICT:"
    assert lines.count(rejection.READY) == 1 and lines.index(rejection.READY) < lines.index("PROGRESS")


def test_a_law_that_judges_after_its_calls_is_not_hung_by_its_references():
    # results_do_not_depend_on_earlier_calls makes all its calls (the case and its neighbours),
    # then computes a float64 reference for each: counted from the calls alone, that stretch is
    # as long as all the references together.  Here each reference is held 0.5 s and the limit
    # is 2.5 s (counted from the imports' end): the law's references in a row are past it, any
    # one of them is not.
    slowed = ("from conformance.laws.attention import laws as _slowed\n_plain = _slowed.references\n"
              "def _held(*args, **kwargs):\n    time.sleep(0.5)\n    return _plain(*args, **kwargs)\n"
              "_slowed.references = _held\nprint('PROGRESS', flush=True)\n")
    code = rejection._CHILD.format(law="results_do_not_depend_on_earlier_calls", target=rejection.CONTROL,
                                   examples=1, flavour="pytorch")
    proc = _child(slowed + code)
    lines, hung, stderr = rejection.watch_for_progress(proc, limit_s=2.5, compile_allowance_s=60.0)
    assert not hung, "the child was killed as hung while it computed its references"
    assert lines[-1] == "VERDICT:", stderr[-2000:]
