"""Hypothesis profiles, registered in one place.

- ``ci``: bounded so that the whole CPU suite stays well inside CI's time, while every
  property still draws enough examples to reject every kept mutant.
- ``dev``: the default; more examples, for a developer's run.
- ``gate``: the GPU gate's kernel laws (perf/gate/gpu_gate.sh), both flavours (Triton and
  Gluon): 64 examples a law, what 16 cores of one H100 or H200 machine check inside the
  gate's 10 minutes (perf/GATE.md: at 100 the two flavours' laws took the kernels' stage to
  248 s and the gate past 575 s).
- ``thorough``: many examples, for a nightly run.
- ``known_good``: the contract tier on each known-good target in CI
  (``conformance/selftests/test_known_good.py``): a few derandomised examples a law, since
  a correct target is asked only whether a law pins impl's design; developers run those
  targets under ``ci`` or ``dev`` when a law changes.
- ``grade``: ``python -m conformance.grade`` (a class of repositories): ci's budget, no
  example database, with the grader's fixed ``--hypothesis-seed``, so that every repository
  gets the same draws and two graders get the same table.

Select with ``pytest --hypothesis-profile NAME``.  Every profile prints the
``@reproduce_failure`` blob of a failing example; the seed is printed by Hypothesis's
pytest plugin (``--hypothesis-seed`` replays a run).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,  # kernels compile on first use; wall-clock deadlines would be noise
    print_blob=True,
    # One failure per law: the first bug found, shrunk.  A second "distinct" failure met
    # while shrinking (a timeout on a smaller case, a crash) would bury the real message.
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

PROFILES = {
    "ci": dict(max_examples=12, **_COMMON),
    "dev": dict(max_examples=30, **_COMMON),
    "gate": dict(max_examples=64, **_COMMON),
    "thorough": dict(max_examples=200, **_COMMON),
    "known_good": dict(max_examples=4, derandomize=True, database=None, **_COMMON),
    # ci's budget, with no example database: no repository's run replays an example
    # another repository (or an earlier run) failed, so each row depends on the code
    # graded, the suite and --hypothesis-seed alone
    "grade": dict(max_examples=12, database=None, **_COMMON),
}


def register_profiles() -> None:
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, **kwargs)


def examples(n_ci: int) -> int:
    """Scale an example count chosen for the ci profile to the active profile."""
    active = settings().max_examples
    return max(1, round(n_ci * active / PROFILES["ci"]["max_examples"]))


def sharded_examples(shard: tuple[int, int], total: int | None = None) -> int:
    """Examples for one shard ``(index, shards)`` of a law run as several test items
    (``pytest --shards S``): its share of ``total`` (default: the active profile's
    max_examples), at least one.  Each shard is its own Hypothesis test and draws
    independently, so S shards together try about as many cases as one unsharded run."""
    _, shards = shard
    total = settings().max_examples if total is None else total
    return max(1, -(-total // shards))


register_profiles()
