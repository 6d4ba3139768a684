"""The conformance report: a table of capability by status, printed at the end of every run.

Statuses, per capability:
    conforms      every check that ran passed (at least one ran)
    FAILS         at least one check failed; the shrunk counterexample and the replay line follow
    not offered   the target's factory is missing or raises NotImplementedError
    not run here  every check was skipped for this machine (needs a GPU, needs N ranks, ...)

A skipped check is never counted as passed.  ``--conformance-report PATH`` also writes
the report as JSON (``PATH.json`` or a PATH ending in .json) and Markdown (``PATH.md``),
for CI artifacts.

Checks are mapped to capabilities by the ``capability`` marker when a test carries one,
otherwise by the rules in ``capability_of`` (test file, the attention flavour and the law
name).  Tests that check the suite itself (mutants, harness) are listed as "suite".
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import pytest

BACKWARD_LAWS = ("gradients", "gradcheck", "backward")
STATUS_ORDER = ("FAILS", "conforms", "not offered", "not run here")


@dataclass
class CapabilityResult:
    capability: str
    passed: int = 0
    failed: int = 0
    not_offered: int = 0
    skipped: int = 0
    skip_reasons: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # {"test", "message", "counterexample", "replay"}

    @property
    def status(self) -> str:
        if self.failed:
            return "FAILS"
        if self.passed:
            return "conforms"
        if self.not_offered:
            return "not offered"
        return "not run here"

    def why(self) -> str:
        if self.status == "FAILS":
            return f"{self.failed} failed, {self.passed} passed"
        if self.status == "conforms":
            extra = f", {self.skipped + self.not_offered} skipped" if self.skipped + self.not_offered else ""
            return f"{self.passed} passed{extra}"
        reasons = sorted(set(self.skip_reasons))
        return "; ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else "")


def capability_of(item) -> str:
    marker = item.get_closest_marker("capability")
    if marker and marker.args:
        return str(marker.args[0])
    path = item.nodeid.split("::")[0]
    name = item.nodeid.split("::")[-1]
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "mutant" in path or "test_harness" in path or path.startswith("perf/"):
        return "suite: " + os.path.basename(path).removesuffix(".py").removeprefix("test_")
    if "attention" in path or "triton" in path:
        flavour = params.get("flavour", "triton" if "triton" in name else "pytorch")
        law = getattr(params.get("law"), "name", "") or getattr(params.get("check"), "__name__", "") or name
        if "causal" in law and "non" not in law:
            part = "causal"
        elif any(word in law for word in BACKWARD_LAWS):
            part = "backward"
        else:
            part = "forward"
        return f"attention {flavour} {part}"
    if "sharded_optimizer" in path or "zero" in path:
        return "sharded optimizer"
    if "ddp" in path:
        flavour = params.get("flavour") or params.get("wrapper") or params.get("ddp_flavour")
        flavour = getattr(flavour, "name", flavour)
        return f"DDP {flavour}" if flavour else "DDP"
    if "fsdp" in path:
        return "FSDP"
    return "other: " + os.path.basename(path).removesuffix(".py")


_REPLAY = re.compile(r"(@reproduce_failure\([^)]*\))")
_SEED = re.compile(r"(--hypothesis-seed=\S+)")


def _counterexample(text: str) -> str:
    lines = []
    for line in text.splitlines():
        s = line.strip().lstrip("E").strip()
        if s.startswith(("Falsifying example", "AttentionCase(", "case=", "Case(")) or "Case(" in s[:40]:
            lines.append(s)
    return " ".join(dict.fromkeys(lines))[:600]


class ConformanceReport:
    def __init__(self, config):
        self.config = config
        self.results: "OrderedDict[str, CapabilityResult]" = OrderedDict()

    def _result(self, capability):
        if capability not in self.results:
            self.results[capability] = CapabilityResult(capability)
        return self.results[capability]

    def pytest_runtest_logreport(self, report):
        cap = dict(report.user_properties).get("capability")
        if cap is None:
            return
        res = self._result(cap)
        if report.when == "call" and report.passed:
            res.passed += 1
        elif report.failed:
            text = report.longreprtext or ""
            first = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("E ")), "")
            replay = _REPLAY.search(text)
            seed = _SEED.search(text)
            res.failed += 1
            res.failures.append(
                {
                    "test": report.nodeid,
                    "message": first.lstrip("E").strip()[:400],
                    "counterexample": _counterexample(text),
                    "replay": " ".join(x.group(1) for x in (replay, seed) if x),
                }
            )
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            if reason.startswith("not offered"):
                res.not_offered += 1
            else:
                res.skipped += 1
            res.skip_reasons.append(reason)

    # -- output ---------------------------------------------------------------------

    def rows(self):
        def key(r):
            return (r.capability.startswith("suite"), r.capability)

        return sorted(self.results.values(), key=key)

    def target_note(self) -> str | None:
        """A target may say how it departs from the protocol (e.g. an adapter computing L itself)."""
        try:
            from conformance.target import load_target

            return getattr(load_target(self.config.getoption("--target")).obj, "NOTE", None)
        except Exception:  # noqa: BLE001 - the report never fails a run
            return None

    def as_markdown(self) -> str:
        target = self.config.getoption("--target") or "impl"
        out = [f"# Conformance report: target `{target}`", ""]
        if self.target_note():
            out += [f"Note: {self.target_note()}", ""]
        out += ["| capability | status | detail |", "|---|---|---|"]
        for r in self.rows():
            out.append(f"| {r.capability} | {r.status} | {r.why()} |")
        fails = [r for r in self.rows() if r.failures]
        if fails:
            out += ["", "## Failures"]
            for r in fails:
                for f in r.failures[:5]:
                    out.append(f"- **{r.capability}** `{f['test']}`: {f['message']}")
                    if f["counterexample"]:
                        out.append(f"  - counterexample: `{f['counterexample']}`")
                    if f["replay"]:
                        out.append(f"  - replay: `{f['replay']}`")
        return "\n".join(out) + "\n"

    def as_json(self) -> dict:
        return {
            "target": self.config.getoption("--target") or "impl",
            "note": self.target_note(),
            "capabilities": [dict(asdict(r), status=r.status, detail=r.why()) for r in self.rows()],
        }

    def pytest_terminal_summary(self, terminalreporter):
        if not self.results:
            return
        tr = terminalreporter
        tr.section("conformance report")
        target = self.config.getoption("--target") or "impl"
        tr.write_line(f"target: {target}")
        note = self.target_note()
        if note:
            tr.write_line(f"note: {note}")
        width = max(len(r.capability) for r in self.rows())
        for r in self.rows():
            markup = {"FAILS": {"red": True, "bold": True}, "conforms": {"green": True}}.get(r.status, {"yellow": True})
            tr.write(f"  {r.capability:<{width}}  ")
            tr.write(f"{r.status:<13}", **markup)
            tr.write_line(f"  {r.why()}")
        for r in self.rows():
            for f in r.failures[:3]:
                tr.write_line(f"  FAIL {r.capability}: {f['message']}")
                if f["counterexample"]:
                    tr.write_line(f"       counterexample: {f['counterexample']}")
                if f["replay"]:
                    tr.write_line(f"       replay: {f['replay']}")
        path = self.config.getoption("--conformance-report")
        if path:
            base = re.sub(r"\.(json|md)$", "", path)
            targets = [path] if path.endswith((".json", ".md")) else [base + ".json", base + ".md"]
            for p in targets:
                os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
                with open(p, "w") as fh:
                    if p.endswith(".json"):
                        json.dump(self.as_json(), fh, indent=2)
                    else:
                        fh.write(self.as_markdown())
                tr.write_line(f"conformance report written to {p}")


def pytest_addoption(parser):
    parser.getgroup("conformance").addoption(
        "--conformance-report", default=None, help="also write the conformance report as JSON and Markdown to PATH"
    )


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) reports
        config.pluginmanager.register(ConformanceReport(config), "conformance-report")
    config.addinivalue_line("markers", "capability(name): the capability a check belongs to, for the report")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Label every item with its capability (in xdist workers too; the label travels with its reports)."""
    for item in items:
        item.user_properties.append(("capability", capability_of(item)))
