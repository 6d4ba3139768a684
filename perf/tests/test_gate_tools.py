"""The GPU gate's helpers, checked on the CPU: the warm-up's kernel set and the progress log."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch

from conformance.laws.attention.strategies import budget_for
from perf.gate import progress_log
from perf.gate.warm_triton_cache import combinations, gluon_cases


def test_warm_up_covers_every_head_dim_dtype_and_mask_the_gpu_laws_draw():
    budget = budget_for("triton", torch.device("cuda"))
    todo = combinations()
    drawn = {(d, dtype, causal) for _, _, d, dtype, causal, _ in todo}
    wanted = {(d, str(t).split(".")[-1], c) for d in budget.head_dims for t in budget.dtypes for c in (True, False)}
    assert drawn == wanted
    assert {layout for *_, layout in todo} == {"contiguous", "strided", "transposed", "misaligned"}
    assert {n for _, n, *_ in todo} == {128, 129}  # keys a tile multiple, and not
    assert len(todo) == len(set(todo))


def test_warm_up_covers_the_gluon_budget_and_the_boundary_cases_its_laws_run_first():
    from conformance.laws.attention.strategies import MANY_ITEMS_BATCH, SPLIT_KEYS_LEN, boundary_cases

    budget = budget_for("gluon", torch.device("cuda"))
    cases = gluon_cases()
    assert {(c.d, c.dtype, c.is_causal) for c in cases} == {
        (d, t, causal) for d in budget.head_dims for t in budget.dtypes for causal in (True, False)}
    assert {c.layout for c in cases} >= {"contiguous", "strided", "transposed", "misaligned", "mixed"}
    assert all(c in cases for c in boundary_cases(budget, "gluon"))
    assert any(c.batch == MANY_ITEMS_BATCH and c.n_q == SPLIT_KEYS_LEN for c in cases)  # persistent grids
    assert any(math.prod(c.batch) == 1 and c.n_k == SPLIT_KEYS_LEN for c in cases)  # a split-KV grid


def _report(nodeid, outcome, when="call", longrepr=None, properties=()):
    return SimpleNamespace(nodeid=nodeid, outcome=outcome, when=when, duration=1.25, longrepr=longrepr,
                           failed=outcome == "failed", skipped=outcome == "skipped", user_properties=list(properties))


def test_progress_log_writes_each_test_as_it_ends_and_names_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_PROGRESS", str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    from triton import knobs

    monkeypatch.setattr(knobs.compilation, "listener", knobs.compilation.listener)  # restored after
    progress_log.pytest_configure(None)
    try:
        progress_log.pytest_runtest_setup(SimpleNamespace())
        progress_log._listener(src=SimpleNamespace(name="_flash_fwd_kernel"), metadata={}, metadata_group={},
                               times=SimpleNamespace(total=2_500_000), cache_hit=False)
        progress_log.pytest_runtest_logreport(_report("t.py::test_a", "passed",
                                                      properties=[("verdict", "hung: no call started")]))
        progress_log.pytest_runtest_setup(SimpleNamespace())
        progress_log.pytest_runtest_logreport(_report("t.py::test_b", "failed", longrepr="AssertionError: O off"))
        progress_log.pytest_runtest_logreport(_report("t.py::test_b", "passed", when="teardown"))  # not a line
    finally:
        progress_log._file.close()
        progress_log._file = None
    lines = [json.loads(s) for s in (tmp_path / "progress-gw7.jsonl").read_text().splitlines()]
    assert [(r["test"], r["outcome"], r["compiled"]) for r in lines] == [("t.py::test_a", "passed", 1), ("t.py::test_b", "failed", 0)]
    assert lines[0]["compile_seconds"] == 2.5 and lines[0]["kernels"] == {"_flash_fwd_kernel": 1}
    with open(tmp_path / "progress-gw7.jsonl", "a") as f:
        f.write('{"test": "t.py::test_c", "when": "ca')  # a line cut by the stage's time limit
    summary = progress_log.summarise(str(tmp_path))
    assert "2 tests" in summary and "FAILED t.py::test_b" in summary and "AssertionError: O off" in summary
    assert lines[0]["properties"] == {"verdict": "hung: no call started"} and "properties" not in lines[1]
    assert "  t.py::test_a: hung: no call started" in summary.splitlines()
