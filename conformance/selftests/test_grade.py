"""``python -m conformance.grade``: a class graded in one command.

The fixture repositories (``conformance/selftests/targets/grading/``): ``clean`` (the course's
tests reformatted, its package and its path dependency reading their own installed metadata),
``edited`` (course tests weakened in six ways, a fixture and two adapters changed),
``crashes_at_import`` and ``missing_dependency``, against a small ``official`` checkout.

The comparison of tests is pure Python and checked finding by finding; the runs are checked
once, end to end, on the one cheap capability the fixtures wire in (the distributed
sampler's contract cases), then resumed; a run past its time limit once.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.grading import edits as E
from conformance.grading.edits import compare_checks, repository_edits
from conformance.grading.official import load_official
from conformance.grading.project import read_layout, write_metadata
from conformance.grading.releases import release_of_adapters

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "conformance" / "selftests" / "targets" / "grading"
OFFICIAL = FIXTURES / "official"
REPOS = ["clean", "edited", "crashes_at_import", "missing_dependency"]
SAMPLER = "sampler and contract"  # the cheap selection every run here grades


@pytest.fixture(scope="module")
def official():
    return load_official(OFFICIAL)


# --- edited official tests ---------------------------------------------------------------------

def test_reformatted_official_tests_are_no_edit(official):
    """Layout, comments, a docstring and a reworded assertion message change no check."""
    assert (FIXTURES / "clean" / "tests" / "test_fsdp.py").read_text() != (OFFICIAL / "tests" / "test_fsdp.py").read_text()
    edits, versions = repository_edits(FIXTURES / "clean", official, "2026")
    assert edits == []
    assert set(versions) == {"tests/__init__.py", "tests/adapters.py", "tests/conftest.py", "tests/test_fsdp.py"}


def test_each_edit_is_named_by_file_test_kind_before_and_after(official):
    edits, _ = repository_edits(FIXTURES / "edited", official, "2026")
    found = {(e.file, e.test, e.kind): e for e in edits}
    expected = {
        ("tests/test_fsdp.py", "_check_against_reference", E.EXACT_TO_TOLERANCE): ("torch.equal(p, q)", "torch.allclose(p, q, atol=1e-05)"),
        ("tests/test_fsdp.py", "_check_against_reference", E.TOLERANCE_WIDENED): ("atol=1e-06", "atol=0.001"),
        ("tests/test_fsdp.py", "test_fsdp_correctness", E.CASES_REMOVED): ("torch.bfloat16", "(removed)"),
        ("tests/test_fsdp.py", "test_fsdp_gradient_sync", E.SKIP_ADDED): ("(none)", "pytest.mark.skip(reason='flaky on my laptop')"),
        ("tests/test_fsdp.py", "test_fsdp_gradient_sync", E.ASSERTION_REMOVED): ("assert model is not None", "(removed)"),
        ("tests/test_fsdp.py", "test_fsdp_gather_full_params", E.TEST_DELETED): ("def test_fsdp_gather_full_params", "(none)"),
        ("tests/conftest.py", "generator", E.FIXTURE_CHANGED): ("g.manual_seed(0)", "g.manual_seed(1234)"),
        ("tests/adapters.py", "get_fsdp", E.ADAPTER_SIGNATURE): ("get_fsdp(module, compute_dtype=None)", "get_fsdp(module)"),
        ("tests/adapters.py", "get_sharded_optimizer", E.ADAPTER_MISSING): ("get_sharded_optimizer(params, optimizer_cls, **kwargs)", "(none)"),
    }
    assert set(found) == set(expected), sorted(set(found) ^ set(expected))
    for key, (before, after) in expected.items():
        assert before in found[key].before and after in found[key].after, found[key]
    assert {k for k, e in found.items() if e.weakens} == {k for k in expected if k[0] == "tests/test_fsdp.py"}
    assert found[("tests/test_fsdp.py", "_check_against_reference", E.TOLERANCE_WIDENED)].line == 10  # the student's line
    assert all(e.official == "the checkout 1.0.0" for e in edits)


@pytest.mark.parametrize(
    "before, after, kind",
    [
        ("assert torch.equal(a, b)", "assert torch.allclose(a, b)", E.EXACT_TO_TOLERANCE),
        ("assert x == y", "assert x == pytest.approx(y)", E.EXACT_TO_TOLERANCE),
        ("assert torch.allclose(a, b)", "assert torch.allclose(a, b, atol=1e-4)", E.TOLERANCE_WIDENED),  # default atol 1e-8
        ("np.testing.assert_allclose(a, b, 1e-7)", "np.testing.assert_allclose(a, b, 1e-3)", E.TOLERANCE_WIDENED),
        ("torch.testing.assert_close(a, b)", "torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)", E.TOLERANCE_WIDENED),
        ("assert (a - b).abs().max() < 1e-6", "assert (a - b).abs().max() < 1e-2", E.TOLERANCE_WIDENED),
        ("assert torch.allclose(a, b, atol=1e-4)", "assert torch.allclose(a, b, atol=1e-6)", E.ASSERTION_TIGHTENED),
        ("assert torch.allclose(a, b, atol=1e-4)", "assert torch.equal(a, b)", E.ASSERTION_TIGHTENED),
        ("assert a.shape == b.shape", "assert a.dtype == b.dtype", E.ASSERTION_CHANGED),
    ],
)
def test_a_changed_check_is_classified(before, after, kind):
    import ast

    b, a = (E.checks_of(ast.parse(src))[0] for src in (before, after))
    assert compare_checks(b, a) == kind


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(cwd), *args], check=True, capture_output=True)


def test_a_file_equal_to_an_older_official_version_is_no_edit(tmp_path):
    """The course relaxed its own FSDP check (26.1.2): a student on either side edited nothing;
    one who widened the tolerance further is judged against the nearest official version."""
    course = tmp_path / "course"
    shutil_copy(OFFICIAL, course)
    _git(course, "init", "-q")
    _git(course, "add", ".")
    _git(course, "commit", "-q", "-m", "strict")
    test = course / "tests" / "test_fsdp.py"
    strict = test.read_text()
    test.write_text(strict.replace("assert torch.equal(p, q)", "assert torch.allclose(p, q, atol=1e-6, rtol=1e-4)"))
    _git(course, "commit", "-q", "-am", "relax equality")
    official = load_official(course)
    assert [v.label.split(" ", 1)[1] for v in official.versions] == ["(relax equality)", "(strict)"]

    student = tmp_path / "student"
    shutil_copy(FIXTURES / "clean", student)
    (student / "tests" / "test_fsdp.py").write_text(strict)
    edits, versions = repository_edits(student, official, "2026")
    assert edits == [] and versions["tests/test_fsdp.py"].endswith("(strict)")
    (student / "tests" / "test_fsdp.py").write_text(test.read_text().replace("rtol=1e-4)", "rtol=1e-2)"))
    edits, _ = repository_edits(student, official, "2026")
    assert [(e.kind, e.official.split(" ", 1)[1]) for e in edits] == [(E.TOLERANCE_WIDENED, "(relax equality)")]


def shutil_copy(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))


def test_the_release_is_read_from_the_adapter_names():
    assert release_of_adapters("def get_ddp_bucketed(m, s): ...\ndef get_fsdp(m): ...") == "2025"
    assert release_of_adapters("def get_ddp(m): ...\ndef get_sharded_optimizer(p, c): ...") == "2026"
    assert release_of_adapters("def get_sharded_optimizer(p, c): ...") is None
    assert load_official(OFFICIAL).release == "2026"


# --- packages as pyproject.toml declares them ----------------------------------------------------

def test_path_sources_resolve_and_metadata_is_written_for_each_project(tmp_path):
    layout = read_layout(FIXTURES / "clean")
    assert [(p.name, p.version, p.package) for p in layout.projects] == [
        ("grading-fixture-clean", "0.3.0", "clean_systems"), ("fixture-basics", "2.0.0", "fixture_basics")]
    assert layout.python_path() == [str(FIXTURES / "clean"), str(FIXTURES / "clean" / "fixture-basics")]
    write_metadata(layout, tmp_path / "site")
    found = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(tmp_path / "site")])}
    assert found == {"grading-fixture-clean": "0.3.0", "fixture-basics": "2.0.0"}


def test_a_path_source_outside_the_repository_uses_a_folder_of_the_same_name(tmp_path):
    repo = tmp_path / "repo"
    (repo / "cs336-basics" / "cs336_basics").mkdir(parents=True)
    (repo / "cs336-basics" / "cs336_basics" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text('[project]\nname = "cs336-systems"\n[tool.uv.sources]\n'
                                         'cs336-basics = { path = "../assignment1-basics", editable = true }\n')
    layout = read_layout(repo)
    assert layout.projects[1].import_root == (repo / "cs336-basics").resolve()
    assert "outside the repository; used ./cs336-basics instead" in layout.notes[0]


# --- one cause, one verdict ------------------------------------------------------------------------

def test_a_package_reading_metadata_it_lacks_reads_not_run_here_in_every_row():
    """Without the grader's metadata, the clean fixture's package raises PackageNotFoundError
    when a factory first imports it: in the attention fixture's set-up as in a sampler check,
    the row reads "not run here" naming the metadata, never FAILS with StopIteration."""
    repo = FIXTURES / "clean"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(repo), str(repo / "fixture-basics")]))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/spec/test_attention.py", "conformance/spec/test_sampler.py",
         "--target", str(repo / "tests" / "adapters.py"), "-k", f"(pytorch and cs336_noncausal) or ({SAMPLER})",
         "-p", "no:cacheprovider", "-p", "no:xdist", "-q"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    ).stdout
    rows = [ln for ln in out.splitlines() if ln.strip().startswith(("attention pytorch", "distributed sampler"))]
    assert len(rows) >= 2 and not any("FAILS" in r or "StopIteration" in r for r in rows), out[-3000:]
    assert all("not run here" in r and "installed metadata of 'grading-fixture-clean'" in r for r in rows), rows


# --- the grader end to end ---------------------------------------------------------------------------

def _grade(out: Path, *args: str, repos=REPOS, timeout=900) -> str:
    cmd = [sys.executable, "-m", "conformance.grade", *(str(FIXTURES / r) for r in repos), "--official", str(OFFICIAL),
           "--out", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_a_class_is_graded_and_a_crash_or_a_missing_module_stops_no_other_repository(tmp_path):
    out = tmp_path / "grades"
    log = _grade(out, "-k", SAMPLER, "--jobs", "2", "--", "--no-isolation")
    assert log.count("] ") == 4 and "about" in log and "elapsed" in log, log  # a progress line per repository
    grades = json.loads((out / "grades.json").read_text())
    by_name = {r["name"]: r for r in grades["repositories"]}
    assert [r["name"] for r in grades["repositories"]] == REPOS
    assert grades["settings"]["profile"] == "grade" and grades["settings"]["seed"] == 0

    clean, edited = by_name["clean"], by_name["edited"]
    assert clean["status"] == "graded" and clean["capabilities"]["distributed sampler"]["status"] == "conforms", clean
    assert clean["edited_tests"] == [] and clean["release"] == "2026"
    assert set(clean["metadata"]) == {"grading-fixture-clean 0.3.0", "fixture-basics 2.0.0"}
    assert edited["status"] == "graded" and sum(e["weakens"] for e in edited["edited_tests"]) == 6
    crash, missing = by_name["crashes_at_import"], by_name["missing_dependency"]
    assert crash["status"] == "does not load" and "RuntimeError: crashing_systems" in crash["reason"], crash
    assert missing["status"] == "missing dependency" and "grading_fixture_absent_package" in missing["reason"], missing

    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert [r["repository"] for r in rows] == REPOS and rows[0]["distributed sampler"] == "conforms"
    assert rows[1]["edited tests (weakening)"] == "6" and rows[2]["status"] == "does not load"
    md = (out / "grades.md").read_text()
    assert "| clean | 2026 | graded | conforms |" in md
    assert "**exact comparison made a tolerance**" in md and "assert torch.allclose(p, q, atol=1e-05)" in md

    # an interrupted run resumes: records kept, nothing graded again
    start = time.monotonic()
    log = _grade(out, "-k", SAMPLER, "--jobs", "2", "--", "--no-isolation")
    assert "grading 0 of 4 repositories (4 kept from an earlier run)" in log, log
    assert time.monotonic() - start < 60
    assert json.loads((out / "grades.json").read_text())["resumed"] == 4


def test_a_run_past_its_time_limit_is_that_repositorys_verdict(tmp_path):
    start = time.monotonic()
    _grade(tmp_path, "-k", SAMPLER, "--time-limit", "2", repos=["clean"])
    record = json.loads((tmp_path / "records" / "clean.json").read_text())
    assert record["status"] == "timed out" and "--time-limit 2 s" in record["reason"], record
    assert time.monotonic() - start < 120


def test_the_table_leaves_out_what_no_repository_offers_and_flags_one_edit_in_many_repositories():
    """An identical weakening edit in three repositories is more likely a course release the
    --official checkout lacks (26.1.2 relaxed FSDP's checks) than three students: the table says so."""
    from conformance.grading.tables import markdown

    edit = {"file": "tests/test_fsdp.py", "test": "_check", "kind": E.EXACT_TO_TOLERANCE, "before": "assert torch.equal(a, b)",
            "after": "assert torch.allclose(a, b)", "line": 3, "official": "v1", "weakens": True}
    rows = {"FSDP": {"status": "conforms", "extras_passed": 1, "extras_total": 2},
            "tensor parallel": {"status": "not offered", "extras_passed": 0, "extras_total": 0}}
    records = [{"name": f"r{i}", "status": "graded", "release": "2026", "capabilities": rows, "edited_tests": [edit],
                "failures": [], "wall_s": 1.0, "suite_commit": "abc"} for i in range(3)]
    run = {"command": "python -m conformance.grade ...", "suite_commit": "abc",
           "official": {"path": "/c", "label": "v1", "release": "2026", "versions": 1},
           "settings": {"profile": "grade", "seed": 0, "keyword": "", "contract_only": True, "properties": False,
                        "time_limit": 60, "check_timeout": 30}}
    md = markdown(run, records)
    assert "| r0 | 2026 | graded | conforms 1/2 | 1 / 0 |" in md
    assert "Not offered by any repository here (left out of the table, kept in grades.csv): tensor parallel." in md
    assert "is in 3 repositories: a course release newer than `--official` may have made it" in md
