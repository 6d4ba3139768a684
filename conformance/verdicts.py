"""Verdicts that are neither pass nor fail: a check that could not run on this target, here.

    NotOffered          "not offered: ..."   the target lacks the entry point, or it (or the
                                             target's own code while the check ran) raises
                                             NotImplementedError
    NeedsHardware       "needs ...: ..."     this machine lacks what the check needs (a GPU,
                                             N GPUs, N ranks)
    EnvironmentRefusal  "not run here: ..."  the environment refuses the target's code (an
                                             autotuned kernel under the Triton interpreter)
    NotApplicable       "not applicable: ..." the check asks something of a design the target
                                             rightly does not have (a message count of
                                             collectives that are not point-to-point rings)
    TargetImportError   "target does not import: ..."  the target's module raised on import

Each is an ``Exception`` subclass of ``Verdict``, whose ``reason`` is the one line a report
shows.  Anything else a check raises is a failure.  ``Verdict`` is a ``unittest.SkipTest``:
Hypothesis re-raises a skip at once instead of shrinking it as a failure (a "not offered"
met on the first example would otherwise be shrunk through dozens of rank-pool cases).

One path for all of them.  A check raises a verdict, or raises an ordinary exception that
``classify`` recognises as one (``conformance.refusals`` holds the rules: a CUDA-only target
on a CPU machine, an unwritten backward).  The distributed harness calls ``classify`` on a
rank's exception inside the rank, where the traceback still has its frames, and re-raises
in the parent the verdict every rank agreed on, by class name through ``REGISTRY``, without
knowing what any of them means.  conftest.py turns a verdict into a skip with its reason.
"""

from __future__ import annotations

import unittest


class Verdict(unittest.SkipTest):
    """A check that did not run here, for a stated reason (never a pass, never a fail)."""

    prefix = "not run here"

    @property
    def reason(self) -> str:
        text = str(self)
        return text if text.startswith(self.prefix) else f"{self.prefix}: {text}"


class NotOffered(Verdict):
    """The target does not offer this capability (factory missing or NotImplementedError)."""

    prefix = "not offered"


class NeedsHardware(Verdict):
    """This machine lacks what the check needs; the message starts with "needs"."""

    prefix = "needs"

    @property
    def reason(self) -> str:
        text = str(self)
        return text if text.startswith("needs") else f"needs {text}"


class EnvironmentRefusal(Verdict):
    """The environment cannot run the target's code (not the target's fault)."""

    prefix = "not run here"


class NotApplicable(Verdict):
    """The check measures a design the target legitimately does not use; the reason says
    which.  Never a pass: the report counts it as skipped, with its reason."""

    prefix = "not applicable"


class TargetImportError(Verdict):
    """The target's module raised while being imported."""

    prefix = "target does not import"


REGISTRY: dict[str, type[Verdict]] = {
    cls.__name__: cls for cls in (Verdict, NotOffered, NeedsHardware, EnvironmentRefusal, NotApplicable, TargetImportError)
}


def rebuild(class_name: str, message: str) -> Verdict | None:
    """The verdict named ``class_name`` (sent from a rank) with ``message``, or None."""
    cls = REGISTRY.get(class_name)
    return cls(message) if cls is not None else None


def classify(exc: BaseException) -> Verdict | None:
    """``exc`` itself if it is a verdict, the verdict a refusal rule reads in it, else None."""
    if isinstance(exc, Verdict):
        return exc
    from conformance import refusals  # the rules need torch; imported only when asked

    return refusals.verdict_for(exc)
