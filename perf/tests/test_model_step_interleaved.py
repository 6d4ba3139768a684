"""The interleaved GPT-step script's garbage-collection clock, and the script on the CPU's tiny
model (the numbers mean something on a GPU only; here the harness is kept working)."""

import gc
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "model_step_interleaved.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("model_step_interleaved", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gc_clock_counts_collections_only_while_a_backend_runs(script):
    clock = script.GcClock()
    gc.callbacks.append(clock)
    try:
        gc.collect(0)  # no backend named: not counted
        clock.current = "gluon"
        gc.collect(0)
        gc.collect(2)
        clock.current = "sdpa"
        gc.collect(1)
        clock.current = None
        gc.collect(2)
    finally:
        gc.callbacks.remove(clock)
    counts, seconds = clock.by["gluon"]
    assert counts == [1, 0, 1] and seconds[0] > 0
    assert clock.by["sdpa"][0] == [0, 1, 0]
    assert set(clock.by) == {"gluon", "sdpa"}


def test_the_script_reports_each_backends_gc_time_on_the_cpu(script, tmp_path):
    rows = script.main(["--device", "cpu", "--size", "tiny", "--context", "16", "--compile", "off", "--rounds", "2",
                        "--steps", "1", "--warmup", "1", "--attention", "sdpa", "pytorch", "--out", str(tmp_path)])
    assert [r["attention"] for r in rows] == ["sdpa", "pytorch"]
    for r in rows:
        assert r["gc_ms_per_step"] >= 0 and len(r["gc_collections_per_step"]) == 3
    table = (tmp_path / "model_interleaved.md").read_text()
    assert "Python gc ms a step" in table and "| 16 | pytorch |" in table


def test_each_backend_follows_each_other_backend_in_some_round(script):
    """Three backends: a rotation keeps each behind the same one; the rounds' orders put every
    backend right after every other within six rounds, and two backends alternate."""
    names = ["sdpa", "gluon", "gluon:function"]
    follows = {(order[i - 1], order[i]) for r in range(6) for order in [script.round_order(names, r)]
               for i in range(1, 3)}
    assert follows == {(a, b) for a in names for b in names if a != b}
    assert [script.round_order(["sdpa", "gluon"], r) for r in range(3)] == [["sdpa", "gluon"], ["gluon", "sdpa"],
                                                                             ["sdpa", "gluon"]]


def test_a_function_backend_runs_with_the_cpp_node_off_and_restores_it(script):
    from impl.attention import custom_ops

    was = custom_ops.NATIVE_OPS
    custom_ops.NATIVE_OPS = True
    try:
        with script.attention_route("gluon:function"):
            assert custom_ops.NATIVE_OPS is False
        assert custom_ops.NATIVE_OPS is True
        with script.attention_route("gluon"):
            assert custom_ops.NATIVE_OPS is True
    finally:
        custom_ops.NATIVE_OPS = was
