"""A law's clock leaves kernel compilation out of its estimate of the next example.

On a fresh GPU machine the first example that meets a kernel variant compiles it (seconds a
variant, tens for a set of Gluon ones) and the next, served from Triton's cache, does not.
With compilation counted in, twice the first example's time filled an H200's 60 s budget,
and laws ran one example.  ``conformance.compile_clock`` counts Triton's compilations
through its listener; the clock (``conformance.lawbook``) subtracts them.
"""

from __future__ import annotations

import time
import warnings
from types import SimpleNamespace

import pytest
from hypothesis import strategies as st

from conformance import compile_clock
from conformance.lawbook import CONTRACT, Law, LawBudgetWarning, check_examples

knobs = pytest.importorskip("triton").knobs


@pytest.fixture
def fresh_clock(monkeypatch):
    """The module's count from zero, with the listener it finds being a recorder of ours."""
    heard = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **event: heard.append(event))  # restored after
    monkeypatch.setattr(compile_clock, "_SECONDS", [0.0])
    monkeypatch.setattr(compile_clock, "_INSTALLED", [False])
    assert compile_clock.install()
    return heard


def _compiled(seconds: float, cache_hit: bool = False) -> None:
    """Triton's compiler telling its listener of one compilation (times in microseconds)."""
    third = int(seconds * 1e6 / 3)
    times = knobs.CompileTimes(ir_initialization=third, lowering_stages=[("ttir", third), ("cubin", third)],
                               store_results=0)
    knobs.compilation.listener(src=SimpleNamespace(name="k"), metadata={}, metadata_group={}, times=times,
                               cache_hit=cache_hit)


def test_compilations_are_counted_and_cache_hits_are_not(fresh_clock):
    _compiled(1.5)
    _compiled(9.0, cache_hit=True)
    assert compile_clock.compile_seconds() == pytest.approx(1.5, abs=1e-5)


def test_the_listener_found_still_hears_every_event(fresh_clock):
    _compiled(0.3)
    _compiled(0.3, cache_hit=True)
    assert [e["cache_hit"] for e in fresh_clock] == [False, True]


def test_the_next_example_is_admitted_when_the_first_was_slow_only_by_compiling(fresh_clock):
    """Budget 1 s; the first example takes 0.45 s, 0.4 of it 'compiling'; the rest 0.05 s.
    Counted in, 2 x 0.45 > the 0.55 s left and the law stops after one example."""
    ran = []

    def check(subject, case):
        if not ran:
            _compiled(0.4)
            time.sleep(0.45)
        else:
            time.sleep(0.05)
        ran.append(case)

    law = Law("sleeps_and_compiles_once", "selftest", CONTRACT, lambda device=None: st.integers(0, 10**6), check)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_examples(law, None, budget_s=1.0, max_examples=50, derandomize=True, database=None, deadline=None)
    told = [str(w.message) for w in caught if issubclass(w.category, LawBudgetWarning)]
    assert len(ran) >= 4, (len(ran), told)
    assert told and "compiling and pool starts left out" in told[0], told


def test_times_of_another_shape_never_break_a_compilation(fresh_clock):
    """The listener runs inside Triton's compiler, for the target's kernels: times it cannot read
    leave the count as it is, and the compilation goes on."""
    knobs.compilation.listener(src=SimpleNamespace(name="k"), metadata={}, metadata_group={},
                               times=SimpleNamespace(seconds=5), cache_hit=False)
    assert compile_clock.compile_seconds() == 0.0
    assert [e["cache_hit"] for e in fresh_clock] == [False]
