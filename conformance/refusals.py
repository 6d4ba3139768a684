"""Errors that mean a check could not run on this target, not that the target is wrong.

``gpu_refusal(exc)``: "needs a GPU: ..." (the check did not run here).
``not_implemented_refusal(exc)``: "not offered: ..." (the target has not written this part).
conftest turns either into a skip with that reason; every other error fails the check.

Needs a GPU.  Tell "the target needs a GPU" apart from "the target is wrong", on a
machine without one.
A CS336 Triton flavour may accept CUDA tensors only (``assert q.is_cuda``, or a
ValueError "requires CUDA tensors"): the handout runs it on a GPU.  On a CPU-only machine
such a check did not run; it did not fail.  ``gpu_refusal(exc)`` returns the skip reason
"needs a GPU: ..." for exactly that situation, else None:

- no CUDA device is visible (``torch.cuda.is_available()`` is False), and
- the error, or one it was raised from or while handling (the suite's bad-input checks
  wrap the target's error), was raised in the target's code, not the suite's (the
  innermost frame's module is not one of the suite's: ``is_suite_module`` reads the
  module's dotted name, never its file path; adapters and mutants are targets), and its
  message or the source line that raised it names CUDA or a GPU (a bare
  ``assert q.is_cuda`` has no message).

An exception group counts only if every error in it is such a refusal.  A wrong answer
raises the suite's own AssertionError, from the suite's code, and still fails.

Not offered.  The handout lets an autograd.Function's backward "just raise
NotImplementedError" until it is written; ``conformance.target`` already reads a factory
raising NotImplementedError as "not offered".  ``not_implemented_refusal`` extends that to
a NotImplementedError raised by the target's own code while a check runs (its
``backward``, typically): a ``raise`` statement in the target's files, neither the
suite's nor an installed package's; or torch's own ``Function.backward``, which a Function
that defines no backward inherits ("You must implement either the backward or vjp
method") (torch raises NotImplementedError for an operator a
backend lacks, which is the target's failure, not an unwritten part; its C++ operators
raise it from the calling line, which is not a ``raise``).  Only the error the
check raised counts, not one the suite caught and wrapped: a bad-input check expects a
ValueError, and a NotImplementedError there is an unclear error.
"""

from __future__ import annotations

import importlib.metadata
import linecache
import os
import re

import torch

try:
    BaseExceptionGroup
except NameError:  # Python 3.10: the backport Hypothesis depends on
    from exceptiongroup import BaseExceptionGroup

# Suite code is classified by module name: the suite's packages, less the ones that hold
# targets (library adapters, kept mutants, fixture targets of the self-tests).  perf (the
# benchmarks, the gate and their tests) is the suite's too: an assertion of a benchmark test
# that names CUDA is a failure, not a target refusing CPU tensors.
SUITE_PACKAGES = ("conformance", "properties", "conftest", "perf")
TARGET_PACKAGES = ("conformance.adapters", "conformance.mutants", "conformance.selftests.targets")


def _in_package(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def is_suite_module(module: str) -> bool:
    """Whether code of the module named ``module`` is the suite's own (not a target's)."""
    return _in_package(module, SUITE_PACKAGES) and not _in_package(module, TARGET_PACKAGES)


_NAMES_A_GPU = re.compile(r"cuda|\bgpus?\b", re.IGNORECASE)


def _innermost(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _raised_by_target(exc: BaseException) -> str | None:
    """The source line that raised ``exc`` if that line is the target's, else None."""
    tb = _innermost(exc)
    if tb is None:
        return None
    if is_suite_module(tb.tb_frame.f_globals.get("__name__", "")):
        return None
    return linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()


def _refusal(exc: BaseException, seen: set) -> str | None:
    if exc is None or id(exc) in seen:
        return None
    seen.add(id(exc))
    line = _raised_by_target(exc)
    if line is not None and (_NAMES_A_GPU.search(str(exc)) or _NAMES_A_GPU.search(line)):
        return f"{type(exc).__name__}: {str(exc) or line}"[:200]
    return _refusal(exc.__cause__, seen) or _refusal(exc.__context__, seen)


def gpu_refusal(exc: BaseException) -> str | None:
    """"needs a GPU: ..." when ``exc`` is the target refusing CPU tensors on a machine without one."""
    if torch.cuda.is_available():
        return None
    if isinstance(exc, BaseExceptionGroup):
        reasons = [gpu_refusal(e) for e in exc.exceptions]
        return reasons[0] if reasons and all(reasons) else None
    why = _refusal(exc, set())
    return f"needs a GPU: the target refuses CPU tensors ({why})" if why else None


_INSTALLED = tuple(p for p in {os.path.dirname(os.path.dirname(torch.__file__))} if p)


def not_implemented_refusal(exc: BaseException) -> str | None:
    """"not offered: ..." when ``exc`` is a NotImplementedError raised by the target's own code."""
    if isinstance(exc, BaseExceptionGroup):
        reasons = [not_implemented_refusal(e) for e in exc.exceptions]
        return reasons[0] if reasons and all(reasons) else None
    if not isinstance(exc, NotImplementedError):
        return None
    if _torch_default_backward(exc):
        return "not offered: the autograd Function defines no backward (torch: " + str(exc).split(" for your")[0] + ")"
    line = _raised_by_target(exc)
    if line is None or not line.startswith("raise"):  # torch's C++ operators raise it from the caller's line
        return None
    tb = _innermost(exc)
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if path.startswith(_INSTALLED) or "site-packages" in path or "dist-packages" in path:
        return None
    name = tb.tb_frame.f_code.co_name
    where = f"{os.path.basename(path)}:{tb.tb_lineno}"
    part = "backward" if name == "backward" else f"{name}()"
    detail = f": {exc}" if str(exc) else ""
    return f"not offered: {part} raises NotImplementedError ({where}{detail})"


def _torch_default_backward(exc: NotImplementedError) -> bool:
    """Raised by torch's own ``Function.backward``, which a subclass that defines none inherits."""
    tb = _innermost(exc)
    return (tb is not None and tb.tb_frame.f_code.co_name == "backward"
            and tb.tb_frame.f_globals.get("__name__") == "torch.autograd.function"
            and "implement either the backward or vjp" in str(exc))


# Errors the environment raises for code that is right on the machine it was written for.
_ENVIRONMENT = (
    (re.compile(r"\b0 active drivers"), "the target's Triton autotuner or launcher needs a GPU driver, and the CPU interpreter has none"),
    (re.compile(r"NVTX functions not installed"), "the target calls torch.cuda.nvtx, which this CPU build of torch lacks"),
)


def environment_refusal(exc: BaseException, seen: set | None = None) -> str | None:
    """"not run here: ..." when ``exc`` (or an error it came from) is the environment refusing
    the target's code on a machine without a GPU; None otherwise."""
    if torch.cuda.is_available() or exc is None:
        return None
    seen = set() if seen is None else seen
    if id(exc) in seen:
        return None
    seen.add(id(exc))
    if isinstance(exc, BaseExceptionGroup):
        reasons = [environment_refusal(e, seen) for e in exc.exceptions]
        return reasons[0] if reasons and all(reasons) else None
    for pattern, why in _ENVIRONMENT:
        if pattern.search(str(exc)):
            return f"not run here: {why} ({type(exc).__name__}: {str(exc)[:120]})"
    return environment_refusal(exc.__cause__, seen) or environment_refusal(exc.__context__, seen)


def missing_module_refusal(exc: BaseException) -> str | None:
    """"not run here: ..." when the target's own code (an import inside a factory or a
    check, after the target loaded) imports a module this environment lacks, or reads the
    installed metadata of a package that is not installed: the target's dependencies, not
    its logic (its own machine has them, or its tests could not run)."""
    if isinstance(exc, BaseExceptionGroup):
        reasons = [missing_module_refusal(e) for e in exc.exceptions]
        return reasons[0] if reasons and all(reasons) else None
    if not isinstance(exc, ModuleNotFoundError) or _raised_by_target(exc) is None:
        return None
    if isinstance(exc, importlib.metadata.PackageNotFoundError):
        # a subclass of ModuleNotFoundError: ``importlib.metadata.version("cs336-systems")``
        # in the target's package, run from its folders without being pip-installed
        return (f"not run here: the target's code reads the installed metadata of {exc.name!r} "
                f"(importlib.metadata), which is not installed here; install the target's package "
                f"(pip install -e), or give it metadata as python -m conformance.grade does")
    return (f"not run here: the target's code imports {exc.name!r}, which is not installed here "
            f"(ModuleNotFoundError: {exc}); install the target's dependencies")


def verdict_for(exc: BaseException):
    """The verdict (``conformance.verdicts``) a refusal rule reads in ``exc``, or None."""
    from conformance.verdicts import EnvironmentRefusal, NeedsHardware, NotOffered

    reason = environment_refusal(exc) or missing_module_refusal(exc)
    if reason:
        return EnvironmentRefusal(reason)
    reason = gpu_refusal(exc)
    if reason:
        return NeedsHardware(reason)
    reason = not_implemented_refusal(exc)
    if reason:
        return NotOffered(reason)
    return None
