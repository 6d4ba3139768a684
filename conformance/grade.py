"""``python -m conformance.grade REPO [REPO ...] --official OFFICIAL --out DIR``: grade a class.

Each REPO is a student's checkout of CS336 assignment 2 (a folder whose ``tests/adapters.py``
exists); a folder that is not one, but holds some, stands for each of them.  OFFICIAL is a
checkout of the course's own repository (2025 or 2026 release, read from its adapter names;
with its git history, every earlier version of its tests is known too).

Every repository gets, in this order and independently of the others:

- its edited official tests: each file of its ``tests/`` against the course's
  (``conformance.grading.edits``: syntax trees, not text);
- its conformance run, in a process tree of its own, with its packages importable as its
  ``pyproject.toml`` declares them and nothing installed (``conformance.grading.runner``):
  the same checks, profile (``grade``) and ``--hypothesis-seed`` for every repository;
  a repository that does not load, lacks a module, crashes, hangs or runs past
  ``--time-limit`` gets that as its verdict and the run goes on.

Records are kept in ``DIR/records/``: a run that is stopped and started again with the same
settings grades only the repositories it has no record of (``--regrade`` grades all).  A line
per repository says how far the run is.  At the end (and after each repository),
``DIR/grades.json``, ``DIR/grades.csv`` and ``DIR/grades.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from conformance.grading.official import load_official
from conformance.grading.runner import ROOT, Settings, grade_repository, head_commit
from conformance.grading.tables import write_all


def find_repositories(paths: list[str]) -> list[Path]:
    """Each path that is a repository, or else the repositories directly inside it."""
    found = []
    for p in map(Path, paths):
        if (p / "tests" / "adapters.py").is_file():
            found.append(p)
        elif p.is_dir():
            inside = sorted(c for c in p.iterdir() if c.is_dir() and (c / "tests" / "adapters.py").is_file())
            found += inside or [p]  # a folder with none is graded as one (its verdict: no adapters)
        else:
            found.append(p)
    return found


def record_names(repos: list[Path]) -> list[str]:
    """A file name per repository: its folder's name, made unique."""
    names, seen = [], {}
    for repo in repos:
        base = re.sub(r"[^A-Za-z0-9_.+-]", "_", repo.resolve().name) or "repository"
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return names


def _minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m conformance.grade", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repos", nargs="+", metavar="REPO", help="a repository, or a folder of repositories")
    parser.add_argument("--official", required=True, help="a checkout of the course's assignment repository")
    parser.add_argument("--out", required=True, help="folder for grades.json, grades.csv, grades.md and the records")
    parser.add_argument("-k", dest="keyword", default="", help="pytest -k: grade the checks it selects (e.g. a capability)")
    parser.add_argument("--contract-only", action="store_true", help="the course-contract tier alone")
    parser.add_argument("--properties", action="store_true", help="also run the Hypothesis properties (slow)")
    parser.add_argument("--time-limit", type=float, default=1800.0, help="seconds a repository's run may take (default 1800)")
    parser.add_argument("--check-timeout", type=float, default=600.0, help="seconds one check may take (default 600)")
    parser.add_argument("--hypothesis-seed", type=int, default=0, help="the seed of every repository's run (default 0)")
    parser.add_argument("--deps", action="append", default=[], metavar="DIR",
                        help="a folder of third-party packages for every repository (pip install --target DIR ...); repeatable")
    parser.add_argument("--jobs", type=int, default=1, help="repositories graded at once (default 1)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the runs (default: this one)")
    parser.add_argument("--regrade", action="store_true", help="grade every repository again, records or not")
    parser.epilog = "Arguments after -- go to every run as they would to python -m conformance."
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.pytest_args = argv[split + 1:]
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        official = load_official(Path(args.official))
    except (FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    (out / "records").mkdir(parents=True, exist_ok=True)
    settings = Settings(official=official, out=out, time_limit=args.time_limit, check_timeout=args.check_timeout,
                        keyword=args.keyword, contract_only=args.contract_only, properties=args.properties,
                        seed=args.hypothesis_seed, deps=args.deps, python=args.python, extra=args.pytest_args)
    repos = [r for r in find_repositories(args.repos) if r.resolve() != official.root]  # the course's own is no submission
    names = record_names(repos)
    run = {
        "command": "python -m conformance.grade " + shlex.join(argv),
        "official": {"path": str(official.root), "commit": official.commit, "label": official.label,
                     "release": official.release, "versions": len(official.versions)},
        "settings": dict(settings.checks(), time_limit=args.time_limit, check_timeout=args.check_timeout,
                         deps=[str(Path(d).resolve()) for d in args.deps], jobs=args.jobs, python=args.python),
        "suite_commit": head_commit(ROOT),
    }
    records: dict[str, dict] = {}
    todo = []
    for repo, name in zip(repos, names):
        kept = out / "records" / f"{name}.json"
        if kept.is_file() and not args.regrade:
            old = json.loads(kept.read_text())
            if old.get("checks") == settings.checks() and old.get("path") == str(repo.resolve()):
                records[name] = old
                continue
        todo.append((repo, name))
    print(f"grading {len(todo)} of {len(repos)} repositories ({len(repos) - len(todo)} kept from an earlier run) "
          f"into {out}; official tests: {official.label} ({official.release or 'release unknown'})", flush=True)
    start = time.monotonic()
    lock = threading.Lock()
    done_now = []

    def finish(name: str, record: dict) -> None:
        with lock:
            (out / "records" / f"{name}.json.tmp").write_text(json.dumps(record, indent=2))
            (out / "records" / f"{name}.json.tmp").replace(out / "records" / f"{name}.json")
            records[name] = record
            done_now.append(record["wall_s"])
            elapsed = time.monotonic() - start
            left = len(todo) - len(done_now)
            estimate = elapsed / len(done_now) * left
            weak = sum(1 for e in record.get("edited_tests", []) if e.get("weakens"))
            verdicts = [row["status"] for row in record.get("capabilities", {}).values()]
            summary = (f"{verdicts.count('conforms')} conform, {verdicts.count('FAILS')} fail, "
                       f"{verdicts.count('not run here')} not run here" if record["status"] == "graded" else record["reason"][:120])
            print(f"[{len(records)}/{len(repos)}] {name}: {record['status']} ({summary}; {weak} weakening test edits) "
                  f"in {_minutes(record['wall_s'])}; elapsed {_minutes(elapsed)}, about {_minutes(estimate)} left", flush=True)
            _write(out, run, records, names, start, len(done_now))

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(grade_repository, repo, name, settings): name for repo, name in todo}
        for future in as_completed(futures):
            name = futures[future]
            try:
                record = future.result()
            except Exception as exc:  # noqa: BLE001 - the grader's own failure on one repository
                record = {"name": name, "path": "", "status": "grader error", "reason": f"{type(exc).__name__}: {exc}",
                          "capabilities": {}, "failures": [], "edited_tests": [], "checks": settings.checks(), "wall_s": 0.0}
            finish(name, record)
    _write(out, run, records, names, start, len(done_now))
    print(f"done in {_minutes(time.monotonic() - start)}: {out / 'grades.md'}, grades.csv, grades.json", flush=True)
    return 0


def _write(out: Path, run: dict, records: dict, names: list, start: float, graded_now: int) -> None:
    ordered = [records[n] for n in names if n in records]
    write_all(out, dict(run, wall_s=round(time.monotonic() - start, 1), graded_now=graded_now,
                        resumed=len(ordered) - graded_now), ordered)


if __name__ == "__main__":
    sys.exit(main())
