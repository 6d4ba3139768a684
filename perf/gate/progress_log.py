"""A pytest plugin for the GPU gate: one JSON line per finished test, written as it ends.

    python -m pytest ... -p perf.gate.progress_log      (GATE_PROGRESS=dir, default gate-out/)

Each line: node id, outcome, seconds in the test's call, and what Triton compiled during it
(kernels compiled, kernels found in the cache, compile seconds from Triton's compilation
listener), what the test recorded with ``record_property`` (a kept mutant's verdict: how a
law rejected it), and for a failure its report text.  Written and flushed per test, from every
xdist worker (one file each), so a stage cut by a time limit still names what failed and
where the time went; `python -m perf.gate.progress_log DIR` summarises the files.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

_compiles = {"compiled": 0, "cache_hits": 0, "seconds": 0.0, "kernels": defaultdict(int)}
_file = None


def _listener(*, src, metadata, metadata_group, times, cache_hit):
    if cache_hit:
        _compiles["cache_hits"] += 1
        return
    _compiles["compiled"] += 1
    _compiles["seconds"] += times.total / 1e6  # Triton reports microseconds
    _compiles["kernels"][getattr(src, "name", "?")] += 1


def pytest_configure(config):
    global _file
    try:
        from triton import knobs
        knobs.compilation.listener = _listener
    except Exception:  # no Triton or no listener knob: outcomes and durations still logged
        pass
    out = Path(os.environ.get("GATE_PROGRESS", "gate-out"))
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _file = open(out / f"progress-{worker}.jsonl", "a", buffering=1)


def pytest_runtest_setup(item):
    _compiles.update(compiled=0, cache_hits=0, seconds=0.0, kernels=defaultdict(int))
    item._progress_start = time.perf_counter()


def pytest_runtest_logreport(report):
    if _file is None or not (report.when == "call" or report.failed or report.skipped):
        return
    if getattr(report, "node", None) is not None:  # xdist's controller replaying a worker's report
        return
    line = dict(test=report.nodeid, when=report.when, outcome=report.outcome, seconds=round(report.duration, 2),
                compiled=_compiles["compiled"], cache_hits=_compiles["cache_hits"],
                compile_seconds=round(_compiles["seconds"], 1), kernels=dict(_compiles["kernels"]))
    properties = getattr(report, "user_properties", None)
    if properties:
        line["properties"] = {str(name): str(value)[:500] for name, value in properties}
    if report.failed:
        line["report"] = str(report.longrepr)[-6000:]
    _file.write(json.dumps(line) + "\n")


def read(directory) -> list[dict]:
    """Every line the workers wrote under ``directory`` (a last line cut by a time limit left out)."""
    rows = []
    for path in sorted(Path(directory).glob("progress-*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                rows.append(json.loads(text))
            except ValueError:
                continue
    return rows


def summarise(directory: str) -> str:
    rows = read(directory)
    rows.sort(key=lambda r: -r["seconds"])
    total = sum(r["seconds"] for r in rows)
    compile_s = sum(r["compile_seconds"] for r in rows)
    out = [f"{len(rows)} tests, {total:.0f} s in tests over all workers, of which Triton compiling "
           f"{compile_s:.0f} s ({sum(r['compiled'] for r in rows)} kernels compiled, "
           f"{sum(r['cache_hits'] for r in rows)} found in the cache)",
           "seconds  compile_s  compiled  outcome  test"]
    out += [f"{r['seconds']:7.1f}  {r['compile_seconds']:9.1f}  {r['compiled']:8d}  {r['outcome']:7s}  {r['test']}"
            for r in rows]
    verdicts = [r for r in rows if "verdict" in r.get("properties", {})]
    if verdicts:
        out += ["", "verdicts (how each kept mutant's run ended):"]
        out += [f"  {r['test']}: {r['properties']['verdict']}" for r in sorted(verdicts, key=lambda r: r["test"])]
    for r in rows:
        if r["outcome"] == "failed":
            out += ["", f"FAILED {r['test']} ({r['when']})", r.get("report", "")]
    return "\n".join(out)


if __name__ == "__main__":
    print(summarise(sys.argv[1] if len(sys.argv) > 1 else "gate-out"))
