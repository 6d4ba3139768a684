"""The two types every capability's checks are written in: ``Law`` and ``Mutant``.

A ``Law`` is a property every implementation of a capability must have::

    Law(
        name="replicas_are_bit_identical_and_match_one_process",
        capability="DDP",                  # a family of conformance.capabilities
        tier=CONTRACT,                     # or API, with ``extra`` naming the extra
        cases=training_cases,              # (**options) -> a Hypothesis strategy of cases
        check=replicas_match,              # (subject, case) -> None; AssertionError if broken
        needs=("2 ranks",),                # what a run needs to be able to fail it
    )

``subject`` is what the capability's laws are checked against: a target spec (a string
the rank processes load again) for distributed capabilities, an object (an
autograd.Function class) for attention.  ``check`` raises ``AssertionError`` (the oracle's,
the harness's ``RankFailure``/``RankTimeout``) when the implementation breaks the law,
and a verdict (``conformance.verdicts``) when the law cannot be checked on it here.

Tiers.  The contract tier (``CONTRACT``) is exactly what the course handout and its tests
ask: its laws draw contract cases only.  The wider API (``API``) names each extra
(``extra="4-D inputs"``) as a check of its own.  An extra never stops or hides a contract
check: they are separate laws, run as separate tests.

A ``Mutant`` is a kept broken implementation: a target offering one capability with one
decision changed, and the names of the laws that must reject it.  One parametrised
self-test (``conformance/selftests/test_mutants.py``) runs every mutant against every law
named in its ``caught_by`` and fails if the mutant survives; the same runs against the
unbroken implementation must pass (the control).
"""

from __future__ import annotations

import time
import unittest
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

CONTRACT = "contract"
API = "api"
TIERS = (CONTRACT, API)


@dataclass(frozen=True)
class Law:
    name: str
    capability: str
    tier: str
    cases: Callable[..., Any]  # (**options) -> SearchStrategy
    check: Callable[..., None]  # (subject, case) -> None
    needs: tuple[str, ...] = ()
    extra: str = ""  # API tier: the extra, as a report names it ("4-D inputs")
    flavours: tuple[str, ...] = ()  # the flavours it applies to (empty: every flavour)
    doc: str = ""

    def __post_init__(self):
        if self.tier not in TIERS:
            raise ValueError(f"law {self.name}: tier must be one of {TIERS}, got {self.tier!r}")
        if self.tier == API and not self.extra:
            raise ValueError(f"law {self.name}: an API-tier law names its extra")
        if not self.doc and self.check.__doc__:
            object.__setattr__(self, "doc", self.check.__doc__.strip().splitlines()[0])


@dataclass(frozen=True)
class Mutant:
    name: str
    capability: str
    bug: str  # one line: what is broken
    caught_by: tuple[str, ...]  # names of the laws (or spec cases) that must reject it
    target: str  # a target spec that loads the mutant: "conformance.mutants.fsdp:sum_not_mean"
    flavour: str = ""  # for capabilities with flavours (attention, DDP)
    options: dict = field(default_factory=dict)  # anything the capability's runner needs


def by_name(laws) -> dict[str, Law]:
    table = {}
    for law in laws:
        if law.name in table:
            raise ValueError(f"two laws named {law.name!r}")
        table[law.name] = law
    return table


# Settings of a mutant run: the explicit examples then generated ones, reproducible (no
# example database, derandomised), no shrinking (a rejection needs no minimal example).
MUTANT_SETTINGS = dict(phases=("explicit", "generate"), database=None, derandomize=True, deadline=None)


def mutant_settings(**overrides) -> dict:
    """MUTANT_SETTINGS as Hypothesis takes them (its Phase values), with ``overrides``."""
    from hypothesis import Phase

    out = {**MUTANT_SETTINGS, **overrides}
    out["phases"] = [getattr(Phase, p) if isinstance(p, str) else p for p in out["phases"]]
    return out


def first_failure_line(run: Callable[[], None]) -> str | None:
    """Run one law's check; the first line of its failure (an AssertionError: the oracle's,
    a RankFailure, a RankTimeout), or None if it passed.  What the mutant self-test asks of
    every capability's ``rejection``."""
    from hypothesis.errors import FlakyFailure

    try:
        run()
    except AssertionError as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    except FlakyFailure as exc:
        # A failure Hypothesis could not reproduce on its replay (a race that shows on some runs
        # only): the law did find the target failing, so it is a rejection all the same.
        failed = [e for e in exc.exceptions if isinstance(e, AssertionError)]
        if not failed:
            raise
        return "flaky: " + (str(failed[0]).strip().splitlines() or [type(failed[0]).__name__])[0]
    return None


# A law's wall-clock budget (check_examples): 5 s for each example the active profile asks
# for, at least 60 s (ci: 60 s, dev: 150 s); SUITE_LAW_BUDGET_S sets it.  Issue 42: a
# verdict within a minute in CI, whatever the target's design.
MIN_LAW_BUDGET_S = 60.0
LAW_BUDGET_S_PER_EXAMPLE = 5.0


def law_budget_s() -> float:
    """The wall-clock seconds a law may take under the active Hypothesis profile."""
    import os

    from hypothesis import settings

    raw = os.environ.get("SUITE_LAW_BUDGET_S", "")
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if not value > 0:
            raise ValueError(f"SUITE_LAW_BUDGET_S must be a positive number of seconds, got {raw!r}")
        return value
    return max(MIN_LAW_BUDGET_S, LAW_BUDGET_S_PER_EXAMPLE * settings().max_examples)


class LawBudgetWarning(UserWarning):
    """A law stopped drawing examples when its time budget ran out, every one it ran having passed."""


class _OutOfBudget(unittest.SkipTest):
    """Ends a Hypothesis run at once: Hypothesis re-raises a skip, and shrinks anything else."""


def _one_time_seconds() -> float:
    """What an example's wall time may include that the next one's will not: starting a rank
    pool, compiling a kernel variant (Triton's JIT; ``conformance.compile_clock``)."""
    from conformance.compile_clock import compile_seconds
    from conformance.harness import pool_startup_seconds

    return pool_startup_seconds() + compile_seconds()


class _Clock:
    """One law's wall-clock budget over its examples (``harness.time_budget``): how long
    they took, what failed."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.budget = None  # the harness's budget, once the law runs inside it
        self.slowest = 0.0  # seconds of the slowest example, less any pool's start and kernel compilation
        self.ran = 0
        self.first = None  # (exception, case): the first failure
        self.last = None  # the last failure of the first one's kind: the smallest found so far
        self._started = (0.0, 0.0)

    def admit(self) -> None:
        """Raise _OutOfBudget unless the next example fits in what is left: any time left
        for the first, twice the slowest so far after it."""
        if not self.ran:  # the budget counts from the first example: Hypothesis's start and the law's
            self.budget.deadline = time.monotonic() + self.seconds  # set-up before it are not the target's time
        left = self.budget.left()
        if left <= 0 or (self.ran and left < 2 * self.slowest):
            raise _OutOfBudget()
        self._started = (time.monotonic(), _one_time_seconds())

    def took(self) -> None:
        wall, one_time = self._started
        self.ran += 1
        self.slowest = max(self.slowest, time.monotonic() - wall - (_one_time_seconds() - one_time))

    def failed(self, exc: BaseException, case) -> None:
        from conformance.harness import LawBudgetSpent

        if self.first is None:
            self.first = self.last = (exc, case)
        elif type(exc) is type(self.first[0]) and not isinstance(exc, LawBudgetSpent):
            self.last = (exc, case)  # shrinking: a case cut by the budget is not a smaller example


class BudgetedLaw:
    """A law whose ``check`` keeps to a wall-clock budget (issue 42): a verdict in about
    ``seconds``, whatever the target.  Use it where a Hypothesis test calls the law::

        law = BudgetedLaw(law)                  # before the test is defined
        @given(case=law.cases())
        def run(case):
            law.check(subject, case)
        law.run(run)                            # instead of run()

    The budget counts from the first example's start (on a loaded machine Hypothesis's own start
    and the set-up before an example took over a second: a short budget then ran none).  An
    example starts only while the budget has time left for it (twice the slowest so far,
    less what that one paid once: a rank pool's start, compiling a kernel), and every case it
    runs on the ranks is cut to what is left (``harness.time_budget``; the first start of each
    world size's rank pool is not charged).  So the law ends in about its budget:

    - no failure when the budget runs out: the examples that ran all passed; the law passes
      with a ``LawBudgetWarning`` saying how many ran;
    - a failure found: shrinking (and Hypothesis's explain phase) stop when the budget runs
      out, and the failure of the smallest failing example found so far is raised, with a
      note naming its case;
    - a case still running when the budget runs out: ``harness.LawBudgetSpent``, a failure
      ("undecided") saying where each rank was -- never a pass.

    The Hypothesis test's own source is untouched (derandomised draws are seeded by it).
    """

    def __init__(self, law: Law, seconds: float | None = None, case_at: int = 1, fixed: int = 0,
                 label: str | None = None):
        self.law = law
        self.label = label or law.name  # how its messages name it ("forward_matches_float64_reference[triton]")
        self.clock = _Clock(law_budget_s() if seconds is None else seconds)
        self.case_at = case_at  # where the case sits in check's arguments: check(subject, case, ...)
        self.fixed = fixed  # explicit examples Hypothesis runs before its draws (named in the warning)

    def __getattr__(self, name):  # name, tier, needs, cases, ... are the law's
        if name == "law":
            raise AttributeError(name)
        return getattr(self.law, name)

    def check(self, *args, **kwargs) -> None:
        from conformance.verdicts import Verdict

        self.clock.admit()
        try:
            self.law.check(*args, **kwargs)
        except Verdict:
            raise
        except Exception as exc:
            self.clock.failed(exc, args[self.case_at] if len(args) > self.case_at else kwargs.get("case"))
            raise
        finally:
            self.clock.took()

    def run(self, hypothesis_test: Callable[[], None]) -> None:
        from conformance import harness

        clock = self.clock
        try:
            with harness.time_budget(clock.seconds, f"law {self.label}") as clock.budget:
                hypothesis_test()
        except _OutOfBudget:
            if clock.first is not None:
                exc, case = clock.last
                exc.add_note(f"{self.label}: its time budget of {clock.seconds:g} s ran out after {clock.ran} example(s); "
                             f"shrinking stopped at the smallest failing example found so far:\ncase={case!r}")
                raise exc from None
            fixed = f" ({min(clock.ran, self.fixed)} of its {self.fixed} fixed cases)" if self.fixed else ""
            warnings.warn(LawBudgetWarning(
                f"{self.label}: {clock.ran} example(s){fixed} ran and passed before its time budget of {clock.seconds:g} s "
                f"ran out (the slowest took {clock.slowest:.1f} s, compiling and pool starts left out); "
                f"set SUITE_LAW_BUDGET_S to draw more"), stacklevel=3)


def check_examples(law: Law, subject, *, device=None, max_examples: int | None = None, go_on_after_verdicts: bool = False,
                   explicit=(), budget_s: float | None = None, **settings_kwargs) -> None:
    """Check ``law`` on ``subject`` for the ``explicit`` cases, then those Hypothesis draws
    from ``law.cases(device=device)``, within the law's time budget (``BudgetedLaw``;
    ``budget_s``, default ``law_budget_s()``).

    ``go_on_after_verdicts``: a case the target declines (a ``conformance.verdicts.Verdict``,
    e.g. one shape it does not offer) is set aside and the other cases still run; the first
    such verdict is raised at the end, so the law as a whole is never reported as passed.
    Otherwise a verdict ends the law at once (a verdict is a ``unittest.SkipTest``, which
    Hypothesis does not shrink).
    """
    from hypothesis import example, given, note, settings

    from conformance.verdicts import Verdict

    options = dict(settings_kwargs)
    if max_examples is not None:
        options["max_examples"] = max_examples
    declined: list[Verdict] = []
    # Without a shrink phase (a mutant run: a verdict, not a minimal example) the only call
    # after the first failure is Hypothesis replaying it to report it; the failure is
    # raised again from memory rather than run twice (a hang would wait out its watchdog twice).
    failed: list[AssertionError] = []
    remember = "phases" in options and not any(getattr(p, "name", p) == "shrink" for p in options["phases"])
    explicit = tuple(explicit)
    law = BudgetedLaw(law, budget_s, fixed=len(explicit))  # the test below keeps its source: its draws' seed

    @settings(**options)
    @given(case=law.cases(device=device))
    def run(case):
        note(f"case: {case}")
        if failed:
            raise failed[0]
        try:
            law.check(subject, case)
        except Verdict as verdict:
            if not go_on_after_verdicts:
                raise
            declined.append(verdict)
        except AssertionError as exc:
            if remember:
                failed.append(exc)
            raise

    for case in reversed(explicit):
        run = example(case=case)(run)
    law.run(run)
    if declined:
        raise declined[0]
