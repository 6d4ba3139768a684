"""The records of a class as ``grades.json``, ``grades.csv`` and ``grades.md``.

``grades.json`` holds everything (one record per repository, and how the run was made);
``grades.csv`` one row per repository and one column per capability, its contract verdict
and the extras passed out of those run; ``grades.md`` the same table, the edited official
tests, and per repository its failures with the lines that replay them.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

from conformance.target import CAPABILITY_FACTORIES

FAILURES_SHOWN = 12  # per repository in grades.md; every one is in grades.json
FAMILIES = list(CAPABILITY_FACTORIES)


def _family_index(capability: str) -> int:
    for i, family in enumerate(FAMILIES):
        if capability == family or capability.startswith(family + " "):
            return i
    return len(FAMILIES)


def capability_columns(records: list) -> list[str]:
    names = {c for r in records for c in r.get("capabilities", {})}
    return sorted(names, key=lambda c: (_family_index(c), c))


def cell(record: dict, capability: str) -> str:
    """The contract verdict of one capability, and the extras passed of those run."""
    if record.get("status") != "graded":
        return ""
    row = record.get("capabilities", {}).get(capability)
    if row is None:
        return "not checked"
    extras = f" ({row['extras_passed']}/{row['extras_total']} extras)" if row.get("extras_total") else ""
    return row["status"] + extras


def edit_counts(record: dict) -> tuple[int, int]:
    edits = record.get("edited_tests", [])
    weakening = sum(1 for e in edits if e.get("weakens"))
    return weakening, len(edits) - weakening


COMMON = 3  # repositories making one identical edit: more likely a course release than a student


def common_edits(records: list) -> dict:
    """(file, test, kind) -> repositories, for each identical weakening edit in COMMON or more."""
    count = {}
    for r in records:
        for key in {(e["file"], e["test"], e["kind"], e["before"], e["after"]) for e in r.get("edited_tests", []) if e.get("weakens")}:
            count[key] = count.get(key, 0) + 1
    return {k[:3]: n for k, n in count.items() if n >= COMMON}


def write_json(path: Path, run: dict, records: list) -> None:
    path.write_text(json.dumps(dict(run, repositories=records), indent=2) + "\n")


def write_csv(path: Path, records: list) -> None:
    columns = capability_columns(records)
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["repository", "release", "commit", "status", "reason", *columns,
                      "edited tests (weakening)", "edited tests (other)", "wall s"])
        for r in records:
            weak, other = edit_counts(r)
            out.writerow([r["name"], r.get("release") or "", r.get("commit", "")[:12], r.get("status", ""),
                          r.get("reason", ""), *(cell(r, c) for c in columns), weak, other, r.get("wall_s", "")])


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    text = " ".join(str(text).split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _short_cell(text: str) -> str:
    return {"FAILS": "**FAILS**", "not checked": "·"}.get(text.split(" (")[0], text.split(" (")[0]) + (
        " " + text.split(" (")[1].split(" extras")[0] if " extras)" in text else "")


def offered_columns(records: list) -> tuple[list[str], list[str]]:
    """(columns some graded repository offers, columns none does): a protocol capability
    beyond the course (tensor parallelism, ...) that no repository wires in says nothing
    about a class; grades.csv keeps it, grades.md names it once."""
    columns = capability_columns(records)
    offered = [c for c in columns if any(cell(r, c) and not cell(r, c).startswith(("not offered", "not checked"))
                                         for r in records)]
    return offered, [c for c in columns if c not in offered]


def _commits(run: dict, records: list) -> str:
    """The suite commit the records were graded at; several where the suite moved between them."""
    seen = {}
    for r in records:
        key = (r.get("suite_commit") or "unknown")[:12]
        seen[key] = seen.get(key, 0) + 1
    if len(seen) <= 1:
        return next(iter(seen), (run.get("suite_commit") or "unknown")[:12])
    return "(it moved during the run) " + ", ".join(f"{c} ({n})" for c, n in seen.items())


def markdown(run: dict, records: list) -> str:
    columns, unoffered = offered_columns(records)
    s = run["settings"]
    out = ["# Grades", "",
           f"Command: {_code(run['command'])}  ",
           f"Official tests: {_code(run['official']['path'])}, newest version {run['official']['label']} "
           f"({run['official']['release'] or 'release unknown'}); each file is judged against the nearest of "
           f"{run['official']['versions']} official versions.  ",
           f"Checks: the main job (`python -m conformance`), Hypothesis profile `{s['profile']}`, "
           f"`--hypothesis-seed={s['seed']}`" + (f", `-k {_md(s['keyword'])}`" if s["keyword"] else "")
           + (", contract tier only" if s["contract_only"] else "") + (", with the properties" if s["properties"] else "")
           + f"; time limit {s['time_limit']:g} s a repository, {s['check_timeout']:g} s a check.  ",
           f"Suite commit {_commits(run, records)}; {len(records)} repositories, "
           f"wall time of this run {run.get('wall_s', 0):.0f} s (graded now: {run.get('graded_now', 0)}, "
           f"kept from an earlier run: {run.get('resumed', 0)}); the records' own runs took "
           f"{sum(r.get('wall_s', 0) for r in records):.0f} s in all.", ""]
    out += ["A cell is the capability's contract verdict, then the extras beyond the contract passed of those run "
            "(`3/7`); `·` not checked in this run.  \"edited\" counts the course's tests the repository changed: "
            "those that can let a wrong solution pass, then the others.", ""]
    if unoffered:
        out += [f"Not offered by any repository here (left out of the table, kept in grades.csv): {', '.join(unoffered)}.", ""]
    out.append("| repository | release | status | " + " | ".join(columns) + " | edited |")
    out.append("|---" * (len(columns) + 4) + "|")
    for r in records:
        weak, other = edit_counts(r)
        status = r["status"] if r["status"] == "graded" else f"**{r['status']}**"
        out.append(f"| {_md(r['name'])} | {r.get('release') or '?'} | {status} | "
                   + " | ".join(_short_cell(cell(r, c)) if cell(r, c) else "" for c in columns)
                   + f" | {weak} / {other} |")
    edited = [r for r in records if r.get("edited_tests")]
    out += ["", "## Edited official tests", ""]
    if not edited:
        out.append("No repository changed a course test.")
    for (file, test, kind), n in common_edits(records).items():
        out += [f"The same change ({kind}, `{file}` {_code(test) if test else ''}) is in {n} repositories: a course "
                "release newer than `--official` may have made it; grade against the newest checkout.", ""]
    for r in edited:
        out.append(f"### {_md(r['name'])}")
        for e in sorted(r["edited_tests"], key=lambda e: not e.get("weakens")):
            where = f"{e['file']}:{e['line']}" if e.get("line") else e["file"]
            mark = "**" if e.get("weakens") else ""
            out.append(f"- `{where}` {_code(e['test']) if e['test'] else '(module)'}: {mark}{e['kind']}{mark} "
                       f"(against {e.get('official', '')}): {_code(e['before'])} → {_code(e['after'])}")
        out.append("")
    out += ["## Per repository", ""]
    for r in records:
        out.append(f"### {_md(r['name'])}")
        out.append(f"{r.get('release') or 'release unknown'}, commit {r.get('commit', '')[:12] or 'unknown'}, "
                   f"{r['status']}" + (f": {_md(r['reason'])}" if r.get("reason") else "") + f" ({r.get('wall_s', 0):.0f} s)")
        for note in r.get("notes", []):
            out.append(f"- note: {_md(note)}")
        failures = r.get("failures", [])
        if failures:
            out.append(f"- replays run from the suite's root with `PYTHONPATH={shlex.quote(':'.join(r.get('python_path', [])))}`")
        for f in failures[:FAILURES_SHOWN]:
            replay = f.get("replay", "")
            if replay:
                replay += f" --hypothesis-profile {s['profile']} --hypothesis-seed={s['seed']}"
            out.append(f"- **{_md(f['capability'])}** ({_md(f['tier'])}) `{f['test']}`: {_md(f['message'])[:400]}")
            if f.get("counterexample"):
                out.append(f"  - counterexample: {_code(f['counterexample'][:300])}")
            if replay:
                out.append(f"  - replay: {_code(replay)}")
        if len(failures) > FAILURES_SHOWN:
            out.append(f"- and {len(failures) - FAILURES_SHOWN} more failures: grades.json and {r.get('report', 'the report')}")
        out.append("")
    return "\n".join(out) + "\n"


def write_all(out: Path, run: dict, records: list) -> None:
    write_json(out / "grades.json", run, records)
    write_csv(out / "grades.csv", records)
    (out / "grades.md").write_text(markdown(run, records))
