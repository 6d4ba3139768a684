"""A Gluon run's child process is killed as hung only for time it spends running, not
compiling: a cold Triton cache on a loaded machine must not read as a hang, and a kernel
that never finishes must still be caught (``conformance.laws.attention.rejection``)."""

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
    assert "jit_cache_hook" in code and "jit_post_compile_hook" in code
