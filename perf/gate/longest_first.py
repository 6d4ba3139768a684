"""A pytest plugin for the GPU gate: the longest tests first, for xdist's load scheduling.

    python -m pytest ... -n 16 --dist load --maxschedchunk 1 -p perf.gate.longest_first
    python -m perf.gate.longest_first PROGRESS_DIR [...] > perf/gate/durations.json   (refresh)

A gate stage ends when its last worker does.  In collection order, a stage's longest tests
(a Gluon law's shard at 120 s, a spec case at 122 s) could start minutes in and run alone at
the end: in run 29 the kernels' stage took 229 s for 2528 worker-seconds on 16 workers, and
in run 30 conformance 264 s for 3003.  Here the collection is sorted by each test's seconds in
the last gate run (``durations.json``, from the progress logs; a test not there counts as 0
and keeps its place among those), longest first, so that xdist's load scheduler, handing each
worker one more test as each of its tests ends (``--maxschedchunk 1``), runs close to
longest-processing-time-first.  Its first hand-out is two consecutive tests a worker, and the
second waits behind the first, so the first 2 x workers places pair the i-th longest with the
i-th shortest: on the Gluon tier's laws (60 tests, the longest 332 s of 3421 worker-seconds on
12 workers, 502 s in the collection's order) that models at 332 s, where pairing it with the
(workers + i)-th longest gave 431; on the gate's durations the two pairings model alike.  Run
so on an H200 the tier took 446 s: its longest tests, side by side on one GPU, each took longer
(4735 worker-seconds), which a model of fixed seconds does not see.
Every worker reorders alike (xdist requires identical collections); verdicts do not depend on
the order.  ``simulate_load`` models that scheduler: on run 29's and 30's durations, in node-id
order (a stand-in for the collection's), it gives 230 and 265 s (the runs took 229 and 264),
and arranged 176 and 188 s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perf.gate import progress_log

DURATIONS = Path(__file__).with_name("durations.json")
MIN_SECONDS = 5.0  # shorter tests are left out of the file: their order hardly moves a stage's end


def arrange(items: list, seconds, workers: int) -> list:
    """``items`` longest first (a stable sort), the first 2 x workers paired for xdist's first
    hand-out of two consecutive tests a worker, the second of which waits behind the first:
    (longest, shortest), (2nd longest, 2nd shortest), ..., then the rest longest first."""
    ranked = sorted(items, key=seconds, reverse=True)
    if workers <= 1 or len(ranked) < 2 * workers:  # fewer: xdist deals them one at a time, round-robin
        return ranked
    head = [item for i in range(workers) for item in (ranked[i], ranked[-1 - i])]
    return head + ranked[workers:len(ranked) - workers]


def simulate_load(seconds: list, workers: int) -> float:
    """The wall time of tests taking ``seconds`` (in collection order) under xdist's load
    scheduling with --maxschedchunk 1: two consecutive tests a worker at first (all of them
    round-robin where fewer than two a worker), then one more to a worker as each of its tests
    ends, so each holds the running test and one queued."""
    import heapq

    pending = list(seconds)
    if len(pending) < 2 * workers:
        queues = [pending[w::workers] for w in range(workers)]
        pending = []
    else:
        queues = [pending[2 * w:2 * w + 2] for w in range(workers)]
        pending = pending[2 * workers:]
    ends = [(queue.pop(0), w) for w, queue in enumerate(queues) if queue]
    heapq.heapify(ends)
    last = 0.0
    while ends:
        now, w = heapq.heappop(ends)
        last = now
        if pending:
            queues[w].append(pending.pop(0))
        if queues[w]:
            heapq.heappush(ends, (now + queues[w].pop(0), w))
    return last


def _workers(config) -> int:
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput["workercount"]) if workerinput else 1


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    try:
        recorded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):  # no file: collection order, as without the plugin
        return
    items[:] = arrange(items, lambda item: recorded.get(item.nodeid, 0.0), _workers(config))


def durations_from(directories) -> dict:
    """{node id: seconds} of every test at least MIN_SECONDS long in the progress logs (the
    longest where a test ran more than once), longest first."""
    seconds: dict = {}
    for entry in (row for directory in directories for row in progress_log.read(directory)):
        if entry.get("when") == "call" and entry.get("seconds", 0) >= MIN_SECONDS:
            seconds[entry["test"]] = max(seconds.get(entry["test"], 0.0), entry["seconds"])
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m perf.gate.longest_first PROGRESS_DIR [...] > perf/gate/durations.json")
    print(json.dumps(durations_from(sys.argv[1:]), indent=0))
