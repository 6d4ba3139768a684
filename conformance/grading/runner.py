"""One repository's grade: its conformance run in a process tree of its own, read into a record.

The child is the main job, ``python -m conformance --target REPO/tests/adapters.py``, run
from the suite's root with a ``PYTHONPATH`` built for this repository alone (its metadata
folder, its package roots, the grader's ``--deps`` folders, the suite), in a session of its
own: past the time limit the whole group (pytest, its worker, rank processes) is killed,
and after a normal exit any process it left behind is too.  What the child says becomes the
record: the report's rows where it wrote one; otherwise the one line that says why not
(the target does not load, a module is missing, it hangs or dies at import, the time ran
out, the run itself failed).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from conformance.grading.edits import repository_edits
from conformance.grading.official import Official, head_commit
from conformance.grading.project import read_layout, write_metadata
from conformance.grading.releases import release_of_adapters

ROOT = Path(__file__).resolve().parents[2]

GRADED = "graded"
NO_ADAPTERS = "no tests/adapters.py"
DOES_NOT_LOAD = "does not load"
MISSING_DEPENDENCY = "missing dependency"
HANGS_AT_IMPORT = "hangs at import"
CRASHES_AT_IMPORT = "crashes at import"
TIMED_OUT = "timed out"
RUN_FAILED = "run failed"


@dataclass
class Settings:
    """What every repository is graded with: the same checks, seed and profile for all."""

    official: Official
    out: Path
    time_limit: float = 1800.0
    check_timeout: float = 600.0
    keyword: str = ""
    contract_only: bool = False
    properties: bool = False
    profile: str = "grade"
    seed: int = 0
    deps: list = field(default_factory=list)
    python: str = sys.executable
    extra: list = field(default_factory=list)  # further pytest arguments, as given

    def checks(self) -> dict:
        """The settings that decide which checks run and how: a record made with others is
        graded again when a run resumes."""
        return {"keyword": self.keyword, "contract_only": self.contract_only, "properties": self.properties,
                "profile": self.profile, "seed": self.seed, "extra": list(self.extra)}

    def conformance_args(self) -> list[str]:
        args = ["--hypothesis-profile", self.profile, f"--hypothesis-seed={self.seed}",
                "--check-timeout", f"{self.check_timeout:g}"]
        if self.keyword:
            args += ["-k", self.keyword]
        if self.contract_only:
            args.append("--contract-only")
        if self.properties:
            args.append("properties")
        return args + list(self.extra)


def repository_commit(repo: Path) -> str:
    """HEAD of the repository's own git checkout ("" for a folder inside another checkout)."""
    return head_commit(repo)


def _kill_group(proc: subprocess.Popen) -> None:
    """Every process of the child's session: its own group, created for it alone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)  # let rank processes see their parent go before the group is killed


def _last_lines(log: str, n: int = 6) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-600:]


_MISSING = re.compile(r"No module named '([^']+)'|ModuleNotFoundError: ([^\s;]+)")


def why_not_graded(log: str, returncode: int) -> tuple[str, str]:
    """(status, reason) of a run that wrote no report, from what it printed."""
    line = next((ln.strip() for ln in log.splitlines() if "--target " in ln and (
        "does not load" in ln or "importing it" in ln)), "")
    reason = re.sub(r"^(ERROR: |pytest\.UsageError: |UsageError: )", "", line)
    reason = re.sub(r"^--target \S+: ", "", reason)
    if "did not finish within" in line:
        return HANGS_AT_IMPORT, reason
    if "importing it killed" in line or "importing it exited" in line:
        return CRASHES_AT_IMPORT, reason
    if "does not load" in line:
        missing = _MISSING.search(line)
        if missing and "ModuleNotFoundError" in line:
            return MISSING_DEPENDENCY, reason
        return DOES_NOT_LOAD, reason
    return RUN_FAILED, f"exit status {returncode}, no report written; last lines: {_last_lines(log)}"


def read_report(path: Path) -> tuple[dict, list]:
    """(capability -> row, failures) of a conformance report's JSON."""
    report = json.loads(path.read_text())
    rows, failures = {}, []
    for row in report.get("capabilities", []):
        if "contract" not in row:
            continue  # "not checked" / "no checks yet": the same for every repository
        beyond = row.get("beyond_the_contract", {})
        rows[row["capability"]] = {
            "status": row["status"],
            "contract": row["contract"].get("status", ""),
            "detail": row.get("detail", ""),
            "extras_passed": beyond.get("passed", 0),
            "extras_total": beyond.get("total", 0),
            "extras_missing": beyond.get("missing", []),
        }
        for f in row.get("failures", []):
            failures.append({"capability": row["capability"], "tier": f.get("tier", ""), "test": f.get("test", ""),
                             "message": f.get("message", ""), "counterexample": f.get("counterexample", ""),
                             "replay": f.get("replay", "")})
    return rows, failures


def grade_repository(repo: Path, name: str, settings: Settings) -> dict:
    """The record of one repository (never raises for anything the repository does)."""
    start = time.monotonic()
    repo = repo.resolve()
    adapters = repo / "tests" / "adapters.py"
    record = {"name": name, "path": str(repo), "commit": repository_commit(repo), "release": None,
              "status": "", "reason": "", "capabilities": {}, "failures": [], "edited_tests": [],
              "official_versions": {}, "notes": [], "checks": settings.checks(), "suite_commit": head_commit(ROOT)}
    if not adapters.is_file():
        record.update(status=NO_ADAPTERS, reason=f"{adapters} does not exist", wall_s=round(time.monotonic() - start, 1))
        return record
    record["release"] = release_of_adapters(adapters.read_text(errors="replace"))
    try:
        edits, versions = repository_edits(repo, settings.official, record["release"])
        record["edited_tests"] = [e.as_dict() for e in edits]
        record["official_versions"] = versions
    except Exception as exc:  # noqa: BLE001 - a file the comparison cannot read is a note, not a lost grade
        record["notes"].append(f"the edited-tests comparison failed: {type(exc).__name__}: {exc}")

    layout = read_layout(repo)
    record["notes"] += layout.notes
    site = settings.out / "env" / name
    record["metadata"] = write_metadata(layout, site)
    python_path = [str(site.resolve())] + layout.python_path() + [str(Path(d).resolve()) for d in settings.deps] + [str(ROOT)]
    record["python_path"] = python_path
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SUITE_TARGET", "SUITE_ISOLATION_DIR")}
    env.update(PYTHONPATH=os.pathsep.join(python_path), OPENBLAS_NUM_THREADS="1",
               SUITE_TARGET_PROBE_TIMEOUT=f"{min(180.0, settings.time_limit):g}")
    report = settings.out / "reports" / name
    for stale in (report.with_suffix(".json"), report.with_suffix(".md")):
        stale.unlink(missing_ok=True)
    command = [settings.python, "-m", "conformance", "--target", str(adapters), "--conformance-report", str(report)]
    command += settings.conformance_args()
    record["command"] = f"cd {shlex.quote(str(ROOT))} && PYTHONPATH={shlex.quote(env['PYTHONPATH'])} " + shlex.join(command)
    log_path = settings.out / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=settings.time_limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc)  # after a timeout, the run; after an exit, anything it left behind
        proc.wait()
    text = log_path.read_text(errors="replace")
    record["exit_status"] = proc.returncode
    record["log"] = str(log_path)
    json_report = report.with_suffix(".json")
    if timed_out:
        record.update(status=TIMED_OUT, reason=f"the run did not finish within --time-limit {settings.time_limit:g} s "
                                                f"(killed with its process group); last lines: {_last_lines(text, 3)}")
    elif json_report.is_file():
        rows, failures = read_report(json_report)
        record.update(status=GRADED, capabilities=rows, failures=failures, report=str(json_report))
        if not rows:
            record["reason"] = "no check of the selection ran on this repository"
    elif proc.returncode == 5 and "no tests ran" in text:  # pytest's "nothing collected"
        record.update(status=GRADED, reason="no check of the selection ran on this repository")
    else:
        status, reason = why_not_graded(text, proc.returncode)
        record.update(status=status, reason=reason)
    record["wall_s"] = round(time.monotonic() - start, 1)
    return record
