"""The conformance report: a table of capability by status, printed at the end of every run.

Statuses, per capability:
    conforms      every check that ran passed (at least one ran)
    FAILS         at least one check failed, or never reported an outcome (its worker crashed,
                  the run stopped); the shrunk counterexample and the replay line follow
    not offered   the target's factory is missing or raises NotImplementedError
    not run here  every check was skipped for this machine (needs a GPU, needs N ranks, ...)

A skipped check is never counted as passed, nor is one that never ran: the tests
collected are compared with the outcomes reported, and an outcome without a capability
label (xdist's report for a crashed worker) is attributed from its node id.  A law whose
time budget ended its draws (``LawBudgetWarning``) passed on the examples that ran: its row
says "cut short by a time budget", and the check is listed with how many ran.
``--conformance-report PATH`` also writes the report as JSON (``PATH.json`` or a PATH
ending in .json) and Markdown (``PATH.md``), for CI artifacts.

Checks are mapped to capabilities by the explicit table of ``conformance.capabilities``
(module, test name, parameter id), in the controller and in xdist workers alike, so a
crashed worker's check is attributed like any other.  Self-checks (the suite's own tests,
impl's internals) are left out of the report: a target's table counts the target's
checks only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import pytest

from conformance.harness import resolve_device
from conformance.capabilities import CONTRACT, SELF, capability_of_nodeid, tier_of_nodeid, unknown_modules

STATUS_ORDER = ("FAILS", "conforms", "not offered", "not run here")

# The exit status of a run whose target had checks collected but none ran to an outcome:
# every capability not offered or not run here.  Not 0: "nothing failed" is not "conforms"
# (a target that wires nothing into its adapters would otherwise pass a CI job).  pytest's
# own 5 ("no tests collected") is the nearest meaning.
NOTHING_CHECKED = 5


@dataclass
class Counts:
    """Outcomes of a set of checks."""

    passed: int = 0
    failed: int = 0
    not_offered: int = 0
    skipped: int = 0
    unreported: int = 0  # collected but never reported: a crashed worker, a stopped run
    skip_reasons: list = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.not_offered + self.skipped + self.unreported

    @property
    def status(self) -> str:
        if self.failed or self.unreported:
            return "FAILS"
        if self.passed:
            return "conforms"
        if self.not_offered:
            return "not offered"
        return "not run here"

    def why(self) -> str:
        if self.status == "FAILS":
            never = f", {self.unreported} never reported" if self.unreported else ""
            return f"{self.failed} failed, {self.passed} passed{never}"
        if self.status == "conforms":
            extra = f", {self.skipped + self.not_offered} skipped" if self.skipped + self.not_offered else ""
            return f"{self.passed} passed{extra}"
        reasons = sorted(set(self.skip_reasons))
        return "; ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else "")


@dataclass
class CapabilityResult:
    """One row: the contract tier's verdict, then the extras beyond it (each its own check)."""

    capability: str
    contract: Counts = field(default_factory=Counts)
    api: Counts = field(default_factory=Counts)
    extras: dict = field(default_factory=dict)  # extra -> Counts
    failures: list = field(default_factory=list)  # {"test", "tier", "message", "counterexample", "replay"}
    cut: list = field(default_factory=list)  # {"test", "message"}: checks whose time budget ended their draws

    def counts(self, tier: str, extra: str = "") -> list:
        if tier == CONTRACT:
            return [self.contract]
        return [self.api, self.extras.setdefault(extra or "other", Counts())]

    # totals, for callers that read a row as one set of checks
    passed = property(lambda self: self.contract.passed + self.api.passed)
    failed = property(lambda self: self.contract.failed + self.api.failed)
    unreported = property(lambda self: self.contract.unreported + self.api.unreported)

    @property
    def status(self) -> str:
        """The contract verdict; without contract checks in this run, the wider checks' verdict."""
        return self.contract.status if self.contract.total else self.api.status

    def beyond(self) -> dict:
        ran = {name: c for name, c in self.extras.items() if c.passed or c.failed or c.unreported}
        missing = sorted(name for name, c in ran.items() if c.status == "FAILS")
        not_offered = sorted(name for name, c in self.extras.items() if c.status == "not offered")
        return {"passed": len(ran) - len(missing), "total": len(ran) + len(not_offered),
                "missing": missing + [f"{n} (not offered)" for n in not_offered]}

    def why(self) -> str:
        b = self.beyond()
        missing = f", missing: {', '.join(b['missing'][:6])}" + (" ..." if len(b["missing"]) > 6 else "") if b["missing"] else ""
        beyond = f"beyond the contract: {b['passed']} of {b['total']}{missing}" if b["total"] else ""
        cut = f"; {len(self.cut)} cut short by a time budget" if self.cut else ""
        if self.contract.total:
            return f"contract: {self.contract.why()}" + (f"; {beyond}" if beyond else "") + cut
        return f"{self.api.why()} (no contract checks in this run" + (f"; {beyond})" if beyond else ")") + cut


def capability_of(item) -> str:
    return capability_of_nodeid(item.nodeid)


_REPLAY = re.compile(r"(@reproduce_failure\([^)]*\))")
_SEED = re.compile(r"(--hypothesis-seed=\S+)")


def _counterexample(text: str) -> str:
    lines = []
    for line in text.splitlines():
        s = line.strip().lstrip("E").strip()
        if s.startswith(("Falsifying example", "AttentionCase(", "case=", "Case(")) or "Case(" in s[:40]:
            lines.append(s)
    return " ".join(dict.fromkeys(lines))[:600]


_BARE_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Failure|Interrupt)$")
_SUITE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _where_raised(report) -> str:
    """Where a message-less exception came from, as "path:line: source": a bare
    ``AssertionError`` from the target's own ``assert`` says nothing a student can act on
    until it says which assert."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is None or not getattr(crash, "path", None):
        return ""
    path, line = str(crash.path), int(crash.lineno)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        source = ""
    shown = os.path.relpath(path, _SUITE_ROOT) if path.startswith(_SUITE_ROOT + os.sep) else path
    return f"{shown}:{line}" + (f": `{source}`" if source else "")


# torch's words for a backward that returned the wrong number of values, and what they mean
_GRADIENT_COUNT = re.compile(r"returned an incorrect number of gradients \(expected (\d+), got 1\)")


def explained(message: str) -> str:
    """``message`` with what torch's terse words mean for the target, where they need it."""
    count = _GRADIENT_COUNT.search(message)
    if count and "one value per input" not in message:
        message += (f" (backward must return one value per input of forward, {count.group(1)} here, None for a "
                    "non-tensor input such as is_causal; a backward that returns nothing, such as an unwritten "
                    "`pass`, counts as one)")
    return message


def with_location(message: str, report) -> str:
    """``message``, or for a bare exception name, that name and where it was raised."""
    if not _BARE_EXCEPTION.match(message):
        return explained(message)
    where = _where_raised(report)
    return f"{message} raised without a message at {where}" if where else message


def _tier_label(tier: str, extra: str) -> str:
    return "contract" if tier == CONTRACT else f"beyond the contract: {extra}"


NEVER_REPORTED = "never reported: the run ended before this check finished (a crashed worker or a stopped run)"


class ConformanceReport:
    """Collects the outcome of every collected test by capability (in the controller).

    Every outcome counts, labelled or not: the report xdist makes for a crashed worker
    carries no capability label, so its capability comes from the node id.  The tests
    collected are compared with the tests that reported an outcome; one that never did
    fails its capability ("never reported"), since a check that did not run has not passed.
    """

    def __init__(self, config):
        self.config = config
        self.results: "OrderedDict[str, CapabilityResult]" = OrderedDict()
        self.collected: "OrderedDict[str, str]" = OrderedDict()  # node id -> capability
        self.reported: set = set()  # node ids with an outcome (passed, failed or skipped)

    def _result(self, capability):
        if capability not in self.results:
            self.results[capability] = CapabilityResult(capability)
        return self.results[capability]

    def _capability(self, report) -> str:
        return self.collected.get(report.nodeid) or capability_of_nodeid(report.nodeid)

    # -- what was collected: here without xdist, from each worker with it ---------------

    def _collect(self, nodeids):
        for nodeid in nodeids:
            if nodeid not in self.collected and unknown_modules([nodeid]) == []:
                capability = capability_of_nodeid(nodeid)
                if capability != SELF:
                    self.collected[nodeid] = capability

    def pytest_collection_finish(self, session):
        self._collect(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self._collect(ids)

    def pytest_runtest_logreport(self, report):
        if unknown_modules([report.nodeid]) or capability_of_nodeid(report.nodeid) == SELF:
            return  # a self-check: the test run shows it, a target's report does not
        if report.when == "call" or report.failed or report.skipped:
            self.reported.add(report.nodeid)  # a failed setup/teardown or a crash ("???") counts too
        res = self._result(self._capability(report))
        tier, extra = tier_of_nodeid(report.nodeid)
        counts = res.counts(tier, extra)
        if report.when == "call" and report.passed:
            for c in counts:
                c.passed += 1
        elif report.failed:
            text = report.longreprtext or ""
            # xdist heads a worker's report with "[gw0] linux -- Python ..."; the cause follows
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not re.match(r"\[gw\d+\] ", ln)]
            first = next((ln for ln in lines if ln.startswith("E ")), lines[0] if lines else "")
            if "The above exception was the direct cause" in text or "During handling of the above exception" in text:
                # a chained failure prints its causes first: the verdict is the last exception's
                # (importlib.metadata's PackageNotFoundError comes after its StopIteration)
                crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
                final = (getattr(crash, "message", "") or "").strip().splitlines()
                first = final[0] if final else first
            blob = _REPLAY.search(text)
            for c in counts:
                c.failed += 1
            res.failures.append(
                {
                    "test": report.nodeid,
                    "tier": _tier_label(tier, extra),
                    "message": with_location(first.lstrip("E").strip(), report)[:600],
                    "counterexample": _counterexample(text),
                    "replay": self.replay_command(report.nodeid),
                    "blob": blob.group(1) if blob else "",
                }
            )
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            for c in counts:
                if reason.startswith("not offered"):
                    c.not_offered += 1
                else:
                    c.skipped += 1
                c.skip_reasons.append(reason)

    def pytest_warning_recorded(self, warning_message, when, nodeid, location):
        """A law whose time budget ended its draws passed on fewer examples than asked: its
        row says so, and the check is listed with how many ran (here and from xdist workers)."""
        if getattr(warning_message.category, "__name__", "") != "LawBudgetWarning" or not nodeid:
            return
        if unknown_modules([nodeid]) or capability_of_nodeid(nodeid) == SELF:
            return
        message = str(warning_message.message).splitlines()[0]
        self._result(self._capability(SimpleNamespace(nodeid=nodeid))).cut.append({"test": nodeid, "message": message})

    def replay_command(self, nodeid: str) -> str:
        """One line that re-runs the check; Hypothesis's database replays the shrunk example."""
        parts = ["python -m pytest", shlex.quote(nodeid), "-p no:xdist"]
        target = self.config.getoption("--target", None)
        if target:
            parts.append(f"--target {shlex.quote(target)}")
        device = self.config.getoption("--device", None)
        if device and device != "auto":
            parts.append(f"--device {device}")
        return " ".join(parts)

    def count_unreported(self):
        """Fail, by capability, every collected test that never reported an outcome (once)."""
        for nodeid, cap in self.collected.items():
            if nodeid in self.reported:
                continue
            self.reported.add(nodeid)
            res = self._result(cap)
            tier, extra = tier_of_nodeid(nodeid)
            for c in res.counts(tier, extra):
                c.unreported += 1
            res.failures.append({"test": nodeid, "tier": _tier_label(tier, extra), "message": NEVER_REPORTED, "counterexample": "",
                                 "replay": self.replay_command(nodeid), "blob": ""})

    # -- output ---------------------------------------------------------------------

    def rows(self):
        return sorted(self.results.values(), key=lambda r: r.capability)

    def nothing_checked(self) -> bool:
        """The target had checks, and not one of them passed or failed (or died)."""
        self.count_unreported()
        rows = self.rows()
        return bool(rows) and not any(r.passed or r.failed or r.unreported for r in rows)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if exitstatus == 0 and self.nothing_checked():
            session.exitstatus = NOTHING_CHECKED

    def unchecked(self) -> list[tuple[str, str]]:
        """(capability, why) for each capability of the protocol with no row in this run."""
        from pathlib import Path

        from conformance.capabilities import has_checks
        from conformance.target import CAPABILITY_FACTORIES

        root = Path(__file__).resolve().parents[1]
        exists = lambda m: (root / (m.replace(".", "/") + ".py")).exists()  # noqa: E731
        missing = []
        for family in CAPABILITY_FACTORIES:
            if any(r.capability == family or r.capability.startswith(family + " ") for r in self.rows()):
                continue
            if has_checks(family, exists):
                missing.append((family, "not checked in this run (no check of it was selected)"))
            else:
                missing.append((family, "no checks yet: the suite does not check this capability yet"))
        return missing

    def target_note(self) -> str | None:
        """A target may say how it departs from the protocol (e.g. an adapter computing L itself)."""
        try:
            from conformance.target import load_target

            return getattr(load_target(self.config.getoption("--target", None)).obj, "NOTE", None)
        except Exception:  # noqa: BLE001 - the report never fails a run
            return None

    def as_markdown(self) -> str:
        self.count_unreported()
        target = self.config.getoption("--target", None) or "impl"
        out = [f"# Conformance report: target `{target}`", ""]
        if self.target_note():
            out += [f"Note: {self.target_note()}", ""]
        out += ["| capability | status | detail |", "|---|---|---|"]
        for r in self.rows():
            out.append(f"| {r.capability} | {r.status} | {r.why()} |")
        for family, why in self.unchecked():
            out.append(f"| {family} | {'no checks yet' if why.startswith('no checks') else 'not checked'} | {why} |")
        for family, note in self.notes():
            out += ["", f"Note on {family}: {note}"]
        cut = [r for r in self.rows() if r.cut]
        if cut:
            out += ["", "## Cut short by a time budget (passed on the examples that ran)"]
            out += [f"- **{r.capability}** `{c['test']}`: {c['message']}" for r in cut for c in r.cut]
        fails = [r for r in self.rows() if r.failures]
        if fails:
            out += ["", "## Failures"]
            for r in fails:
                for f in r.failures[:5]:
                    out.append(f"- **{r.capability}** ({f['tier']}) `{f['test']}`: {f['message']}")
                    if f["counterexample"]:
                        out.append(f"  - counterexample: `{f['counterexample']}`")
                    if f["replay"]:
                        out.append(f"  - replay: `{f['replay']}`")
        return "\n".join(out) + "\n"

    def notes(self) -> list[tuple[str, str]]:
        """(family, note) for each note that bears on a row of this run."""
        from conformance.capabilities import NOTES, TRITON_ON_THE_CPU

        def ran(family):  # rows of the family with a check that passed or failed (not offered: no note)
            return [r for r in self.rows() if (r.capability == family or r.capability.startswith(family + " "))
                    and (r.passed or r.failed)]

        out = [(family, note) for family, note in NOTES.items() if ran(family)]
        if ran("attention triton") and resolve_device() == "cpu":
            out.append(("attention triton", TRITON_ON_THE_CPU))
        return out

    def as_json(self) -> dict:
        self.count_unreported()
        return {
            "target": self.config.getoption("--target", None) or "impl",
            "note": self.target_note(),
            "notes": {family: note for family, note in self.notes()},
            "collected": len(self.collected),
            "never_reported": sum(r.unreported for r in self.rows()),
            "capabilities": [
                {
                    "capability": r.capability, "status": r.status, "detail": r.why(),
                    "passed": r.passed, "failed": r.failed, "unreported": r.unreported,
                    "contract": dict(asdict(r.contract), status=r.contract.status if r.contract.total else "none in this run"),
                    "beyond_the_contract": r.beyond(),
                    "failures": r.failures,
                    "cut_by_budget": r.cut,
                }
                for r in self.rows()
            ]
            + [{"capability": family, "status": "no checks yet" if why.startswith("no checks") else "not checked", "detail": why}
               for family, why in self.unchecked()],
        }

    def pytest_terminal_summary(self, terminalreporter):
        if self.config.option.collectonly:
            return
        self.count_unreported()
        if not self.results and not self.collected:
            return
        tr = terminalreporter
        tr.section("conformance report")
        target = self.config.getoption("--target", None) or "impl"
        tr.write_line(f"target: {target}")
        note = self.target_note()
        if note:
            tr.write_line(f"note: {note}")
        unchecked = self.unchecked()
        width = max(len(name) for name in [r.capability for r in self.rows()] + [f for f, _ in unchecked])
        for r in self.rows():
            markup = {"FAILS": {"red": True, "bold": True}, "conforms": {"green": True}}.get(r.status, {"yellow": True})
            tr.write(f"  {r.capability:<{width}}  ")
            tr.write(f"{r.status:<13}", **markup)
            tr.write_line(f"  {r.why()}")
        for family, why in unchecked:
            tr.write(f"  {family:<{width}}  ")
            tr.write(f"{'no checks yet' if why.startswith('no checks') else 'not checked':<13}", yellow=True)
            tr.write_line(f"  {why}")
        for family, note in self.notes():
            tr.write_line(f"  note on {family}: {note}")
        if self.nothing_checked():
            tr.write_line(
                f"  nothing was checked: every capability of the target is not offered or not run here "
                f"(exit status {NOTHING_CHECKED}, not 0)",
                yellow=True,
                bold=True,
            )
        unreported = sum(r.unreported for r in self.rows())
        if unreported:
            tr.write_line(
                f"  {unreported} of {len(self.collected)} collected checks never reported an outcome "
                "(a crashed worker or a stopped run); their capabilities read FAILS",
                red=True,
                bold=True,
            )
        for r in self.rows():
            for c in r.cut[:3]:
                tr.write_line(f"  CUT  {r.capability}: {c['message']}", yellow=True)
        for r in self.rows():
            for f in r.failures[:3]:
                tr.write_line(f"  FAIL {r.capability} ({f['tier']}): {f['message']}")
                tr.write_line(f"       check: {f['test']}")
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
    group = parser.getgroup("conformance")
    group.addoption("--conformance-report", default=None, help="also write the conformance report as JSON and Markdown to PATH")
    group.addoption("--contract-only", action="store_true", help="run the course-contract tier alone (fast)")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) reports
        config.pluginmanager.register(ConformanceReport(config), "conformance-report")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Every collected test module must be in the capability table (in workers too)."""
    missing = unknown_modules(item.nodeid for item in items)
    if missing:
        raise pytest.UsageError(
            "not in the capability table (conformance/capabilities.py): " + ", ".join(missing)
            + "; add each module with the rule that names its capability"
        )
    if config.getoption("--contract-only", False):
        keep = [i for i in items if capability_of_nodeid(i.nodeid) == SELF or tier_of_nodeid(i.nodeid)[0] == CONTRACT]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
