"""Verdicts of mutant and control runs that timing must not decide.  A Gluon run's child
process is killed as hung only for time it spends running, not compiling, since a call of
the implementation last started: a cold Triton cache or a loaded GPU must not read as a
hang, and a kernel that never finishes must still be caught (``conformance.laws.attention.rejection``).  A failure Hypothesis could not
replay (a race) is still a rejection (``conformance.lawbook.first_failure_line``)."""

from __future__ import annotations

import subprocess
import sys

from conformance.laws.attention import rejection


def _child(body: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time\n{body}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_long_compile_is_not_a_hang():
    proc = _child("print('COMPILING', flush=True); time.sleep(2.5); print('COMPILED', flush=True); "
                  "print('VERDICT:', flush=True)")
    lines, hung, _ = rejection.watch_for_progress(proc, limit_s=1.0, compile_allowance_s=60.0)
    assert not hung and lines == ["VERDICT:"]


def test_a_run_silent_past_the_limit_is_a_hang():
    proc = _child("print('COMPILING', flush=True); print('COMPILED', flush=True); time.sleep(30)")
    lines, hung, _ = rejection.watch_for_progress(proc, limit_s=1.0, compile_allowance_s=60.0)
    assert hung and proc.returncode is not None


def test_running_time_adds_up_across_compiles():
    # 0.7 s + 0.7 s of running around a compile: past a 1 s limit in all, though neither stretch is
    proc = _child("time.sleep(0.7); print('COMPILING', flush=True); print('COMPILED', flush=True); time.sleep(30)")
    _, hung, _ = rejection.watch_for_progress(proc, limit_s=1.0, compile_allowance_s=60.0)
    assert hung


def test_a_slow_run_that_keeps_making_progress_is_not_a_hang():
    # 2.4 s of running in all, past a 1 s limit, but a call starts every 0.4 s
    proc = _child("for _ in range(6):\n    time.sleep(0.4)\n    print('PROGRESS', flush=True)\nprint('VERDICT:', flush=True)")
    lines, hung, _ = rejection.watch_for_progress(proc, limit_s=1.0, compile_allowance_s=60.0)
    assert not hung and lines == ["VERDICT:"]


def test_a_run_silent_past_the_limit_after_progress_is_a_hang():
    proc = _child("print('PROGRESS', flush=True); time.sleep(30)")
    _, hung, _ = rejection.watch_for_progress(proc, limit_s=1.0, compile_allowance_s=60.0)
    assert hung


def test_compiling_past_the_allowance_is_a_hang_too():
    proc = _child("print('COMPILING', flush=True); time.sleep(30)")
    _, hung, _ = rejection.watch_for_progress(proc, limit_s=60.0, compile_allowance_s=1.0)
    assert hung


def test_the_childs_stderr_comes_back_for_a_crash_report():
    proc = _child("import sys; sys.stderr.write('boom\\n'); sys.exit(3)")
    lines, hung, stderr = rejection.watch_for_progress(proc, limit_s=10.0, compile_allowance_s=10.0)
    assert not hung and lines == [] and "boom" in stderr and proc.returncode == 3


def test_the_child_program_is_valid_python_with_the_compile_hooks():
    code = rejection._CHILD.format(law="some_law", target="impl", examples=3, flavour="gluon")
    compile(code, "<child>", "exec")
    assert "jit_cache_hook" in code and "jit_post_compile_hook" in code and "PROGRESS" in code


def test_a_failure_hypothesis_could_not_replay_is_still_a_rejection():
    # A race (a reduction not waited on) fails one run and passes the replay: Hypothesis raises
    # FlakyFailure, which is the law finding the target wrong, not the target passing.
    from hypothesis.errors import FlakyFailure

    from conformance.lawbook import first_failure_line

    def racy():
        raise FlakyFailure("Hypothesis failed to reproduce", [AssertionError("rank 0 w: |err| = 1e-3\nmore")])

    assert first_failure_line(racy) == "flaky: rank 0 w: |err| = 1e-3"
