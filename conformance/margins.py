"""How close correct code comes to the oracle's bounds: a pytest plugin.

    python -m pytest properties/test_tensor_parallel.py -p conformance.margins --margins-out DIR \\
        [--hypothesis-profile dev] [-n 2]

Every verdict ``oracle.judge`` gives in a test, passing or not, is kept as error / bound; per
test the worst is written to ``DIR/margins-<worker>.json`` and, at the end, all of them to
``DIR/margins.md``, worst first.  Run on a correct target, a law whose worst ratio nears 1 is a
false alarm waiting for the draw that crosses it: the tensor-parallel GPT laws reached 1.046 in
30 CPU draws (a correct model failed) until their eager yardstick took runs from nudged
parameters, and then at most 0.29 in 60.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance import oracle

_WORST: dict = {}  # test id -> (ratio, tensor name, error, bound, eager error)
_CURRENT: list = [None]


def record(test: str, verdict: oracle.Verdict) -> None:
    """Keep ``verdict`` as the test's worst if its error / bound is the largest seen."""
    if test is None or not verdict.bound > 0 or verdict.error != verdict.error:
        return
    ratio = verdict.error / verdict.bound
    if ratio > _WORST.get(test, (-1.0,))[0]:
        _WORST[test] = (ratio, verdict.name, verdict.error, verdict.bound, verdict.eager_error)


def table(worst: dict) -> str:
    lines = ["| worst error / bound | test | tensor | error | bound | eager error |", "|---:|---|---|---:|---:|---:|"]
    for test, (ratio, name, error, bound, eager) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {ratio:.3f} | {test} | {name} | {error:.2e} | {bound:.2e} | {eager:.2e} |")
    return "\n".join(lines) + "\n"


def pytest_addoption(parser):
    parser.addoption("--margins-out", default="perf-out/margins", help="where conformance.margins writes")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller: no worker's file of an earlier run is merged
        for path in Path(config.getoption("--margins-out")).glob("margins-*.json"):
            path.unlink()
    judge = oracle.judge

    def judged(*args, **kwargs):
        verdict = judge(*args, **kwargs)
        record(_CURRENT[0], verdict)
        return verdict

    oracle.judge = judged  # assert_close looks judge up in the module, so it is seen too


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _CURRENT[0] = item.nodeid
    try:
        return (yield)
    finally:
        _CURRENT[0] = None


def pytest_sessionfinish(session):
    out = Path(session.config.getoption("--margins-out"))
    out.mkdir(parents=True, exist_ok=True)
    # the worker id from xdist's own config (an environment variable would be inherited by a
    # pytest run started inside a worker)
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    (out / f"margins-{worker}.json").write_text(json.dumps(_WORST))
    if worker == "main":  # the controller (or a run without xdist): every worker has written
        worst = {}
        for path in sorted(out.glob("margins-*.json")):
            worst.update({k: tuple(v) for k, v in json.loads(path.read_text()).items()})
        (out / "margins.md").write_text(table(worst))
