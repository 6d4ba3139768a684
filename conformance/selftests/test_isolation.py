"""The main job survives the code it checks, and says how each check died.

``python -m conformance`` runs against fixture targets (``conformance/selftests/targets``)
that segfault, exit, abort or hang; every run must end with the report, the dead check's
row FAILS and its line names how it died.  A target that cannot be loaded at all stops at
start-up with one line and a non-zero exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ONE_CHECK = "saves_one_logsumexp_of_query_shape"  # one check a flavour


def main_job(*args: str, timeout: float = 600, probe_timeout: str = "30") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), SUITE_TARGET_PROBE_TIMEOUT=probe_timeout)
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(
    "target, died, limit",
    [
        # One main job per target, each flavour dying its own way; the hang waits out its whole
        # limit, the others die long before theirs.  The limit also covers a check's start (a
        # worker's CUDA start-up on a GPU machine).  At 6 s the aborting flavour's row twice
        # failed to name the abort, under 16 workers; a start past 6 s is the likely cause.
        ("segfaults_or_exits", {"pytorch": "killed by SIGSEGV (segmentation fault)", "triton": "exited with code 3"}, "20"),
        ("aborts_or_hangs", {"pytorch": "killed by SIGABRT (abort)", "triton": "timed out after 15 s"}, "15"),
    ],
)
def test_a_check_that_dies_is_a_failing_row_saying_how(target, died, limit):
    out = main_job("--target", f"conformance.selftests.targets.{target}", "-k", ONE_CHECK, "--check-timeout", limit)
    text = out.stdout + out.stderr
    assert "conformance report" in text, text[-3000:]
    for flavour, words in died.items():
        row = next((ln for ln in text.splitlines()
                    if ln.strip().startswith(f"attention {flavour} forward") and "FAIL " not in ln), "")
        assert "FAILS" in row, text[-3000:]
        failure = next((ln for ln in text.splitlines() if f"{flavour}-{ONE_CHECK}" in ln and words in ln), "")
        said = [ln[:600] for ln in text.splitlines() if f"{flavour}-{ONE_CHECK}" in ln or f"attention {flavour}" in ln]
        assert failure, f"{flavour}: no line names {ONE_CHECK!r} with {words!r}; its lines: {said}"
    assert out.returncode == 1, out.returncode


@pytest.mark.parametrize(
    "spec, words",
    [
        ("/nonexistent/adapters.py", "file not found"),
        ("impl:nothing", "has no attribute 'nothing'"),
        ("no_such_module_anywhere", "cannot import module"),
        ("conformance.selftests.targets.hangs_at_import", "did not finish within 12 s"),
    ],
)
def test_a_target_that_cannot_be_loaded_stops_at_start_up_in_one_line(spec, words):
    # 12 s: the hanging import waits all of it; the others fail at once
    out = main_job("--target", spec, timeout=300, probe_timeout="12")
    assert out.returncode not in (0, 1), out.returncode  # a usage error, not a report
    errors = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("ERROR")]
    assert len(errors) == 1 and words in errors[0], out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr


def test_a_target_file_that_does_not_parse_or_import_is_one_line(tmp_path):
    bad = tmp_path / "adapters.py"
    bad.write_text("def get_ddp(module:\n")
    out = main_job("--target", str(bad), timeout=300)
    assert out.returncode not in (0, 1) and "SyntaxError" in out.stderr and "line 1" in out.stderr, out.stderr[-2000:]
    bad.write_text("import cs336_systems_not_installed\n")
    out = main_job("--target", str(bad), timeout=300)
    assert out.returncode not in (0, 1), out.returncode
    assert "target does not load: ModuleNotFoundError: No module named 'cs336_systems_not_installed'" in out.stderr


def test_a_segfault_of_a_triton_check_under_the_interpreter_names_the_likely_cause(tmp_path, monkeypatch):
    """The interpreter turns an unmasked out-of-bounds tl.load into a host segfault: the
    verdict says so for a Triton check, and only there."""
    import signal

    from conformance.isolation import how_it_died

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton_check = "conformance/spec/test_attention.py::test_cs336_contract[triton-is_causal_defaults_to_false]"
    said = how_it_died(str(tmp_path), "gw0", triton_check, -signal.SIGSEGV)
    assert said.startswith("killed by SIGSEGV (segmentation fault)") and "boundary_check" in said
    pytorch_check = triton_check.replace("triton-", "pytorch-")
    assert "boundary_check" not in how_it_died(str(tmp_path), "gw0", pytorch_check, -signal.SIGSEGV)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "boundary_check" not in how_it_died(str(tmp_path), "gw0", triton_check, -signal.SIGSEGV)


def test_a_crash_says_where_its_check_had_got_to(tmp_path, monkeypatch):
    """A check that notes its steps (which size it is on) has the last one in its verdict;
    a note left by an earlier check is not read as this one's."""
    import signal

    from conformance import isolation

    monkeypatch.setenv(isolation.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(isolation, "_RUNNING", {"nodeid": "spec.py::check_a", "worker": "gw1"})
    isolation.note_step("N=16, d=16")
    assert isolation.how_it_died(str(tmp_path), "gw1", "spec.py::check_a", -signal.SIGABRT).endswith("at N=16, d=16")
    assert "N=16" not in isolation.how_it_died(str(tmp_path), "gw1", "spec.py::check_b", -signal.SIGABRT)


def test_a_signal_named_only_by_faulthandler_reads_as_the_signal(tmp_path):
    """Where the worker's exit status is not seen, faulthandler's "Fatal Python error:
    Aborted" gives the same verdict as the status would."""
    from conformance.isolation import how_it_died

    (tmp_path / "gw3.fault").write_text('Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n'
                                        '  File "/x/target.py", line 7 in apply\n')
    said = how_it_died(str(tmp_path), "gw3", "spec.py::check", None)
    assert said.startswith("killed by SIGABRT (abort)") and "target.py" in said
