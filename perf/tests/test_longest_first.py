"""The gate's test order (perf/gate/longest_first.py): longest first, paired for xdist's first
hand-out, and a model of xdist's load scheduling that says what the order buys."""

from __future__ import annotations

import json
import types

from perf.gate import longest_first
from perf.gate.longest_first import arrange, simulate_load


def test_arrange_puts_the_longest_first_and_pairs_the_first_hand_out():
    seconds = {f"t{i}": s for i, s in enumerate([1, 9, 3, 8, 2, 7, 0, 6, 5, 4])}
    order = arrange(list(seconds), seconds.get, 2)
    assert sorted(order) == sorted(seconds)  # a permutation
    # two workers: the first hand-out is (longest, shortest) to one and (2nd, 2nd shortest) to the other
    assert [seconds[t] for t in order] == [9, 0, 8, 1, 7, 6, 5, 4, 3, 2]
    assert [seconds[t] for t in arrange(list(seconds), seconds.get, 1)] == sorted(seconds.values(), reverse=True)


def test_tests_without_a_recorded_time_keep_their_order_after_the_recorded_ones():
    seconds = {"a": 0.0, "b": 5.0, "c": 0.0, "d": 0.0}
    assert arrange(["a", "b", "c", "d"], seconds.get, 1) == ["b", "a", "c", "d"]


def test_the_load_scheduling_model_on_cases_worked_by_hand():
    # two workers, first hand-out two each: (10, 1) and (1, 1); the second worker takes what is left
    assert simulate_load([10, 1, 1, 1, 1, 1], 2) == 11
    # the two long tests handed to one worker at first: 10; paired apart: 5 + 1 + 1 + ... = 8
    assert simulate_load([5, 5, 1, 1, 1, 1, 1, 1], 2) == 10
    assert simulate_load(arrange([5, 5, 1, 1, 1, 1, 1, 1], float, 2), 2) == 8
    assert simulate_load([3, 2], 4) == 3  # fewer than two a worker: one each


def test_a_long_test_waits_behind_no_other_long_one_at_the_first_hand_out():
    # three long tests on two workers (25 s: at best 13): the longest's queued partner is a short
    # one, where pairing it with the third longest ran them back to back
    seconds = [10, 6, 5, 1, 1, 1, 1]
    assert simulate_load([10, 5, 6, 1, 1, 1, 1], 2) == 15  # (1st, 3rd) and (2nd, 4th)
    assert simulate_load(arrange(seconds, float, 2), 2) == 13


def test_the_plugin_reorders_a_workers_collection_by_the_recorded_seconds(tmp_path, monkeypatch):
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"long": 50.0, "mid": 20.0, "short": 6.0}))
    monkeypatch.setattr(longest_first, "DURATIONS", durations)
    items = [types.SimpleNamespace(nodeid=n) for n in ("new", "short", "mid", "long")]
    config = types.SimpleNamespace(workerinput={"workercount": 1})
    longest_first.pytest_collection_modifyitems(None, config, items)
    assert [i.nodeid for i in items] == ["long", "mid", "short", "new"]
    durations.unlink()  # no file: the collection's own order
    longest_first.pytest_collection_modifyitems(None, config, items)
    assert [i.nodeid for i in items] == ["long", "mid", "short", "new"]


def test_durations_are_read_from_progress_logs(tmp_path):
    lines = [dict(test="a", when="call", seconds=12.0), dict(test="a", when="call", seconds=30.0),
             dict(test="b", when="call", seconds=1.0), dict(test="c", when="setup", seconds=9.0)]
    (tmp_path / "progress-gw0.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{cut")
    assert longest_first.durations_from([tmp_path]) == {"a": 30.0}
