"""Tell "the target needs a GPU" apart from "the target is wrong", on a machine without one.

A CS336 Triton flavour may accept CUDA tensors only (``assert q.is_cuda``, or a
ValueError "requires CUDA tensors"): the handout runs it on a GPU.  On a CPU-only machine
such a check did not run; it did not fail.  ``gpu_refusal(exc)`` returns the skip reason
"needs a GPU: ..." for exactly that situation, else None:

- no CUDA device is visible (``torch.cuda.is_available()`` is False), and
- the error, or one it was raised from or while handling (the suite's bad-input checks
  wrap the target's error), was raised in the target's code, not the suite's (the
  innermost frame lies outside ``conformance/`` and ``properties/``; the adapters in
  ``conformance/adapters`` are targets), and its message or the source line that raised
  it names CUDA or a GPU (a bare ``assert q.is_cuda`` has no message).

An exception group counts only if every error in it is such a refusal.  A wrong answer
raises the suite's own AssertionError, from the suite's code, and still fails.
"""

from __future__ import annotations

import linecache
import os
import re

import torch

try:
    BaseExceptionGroup
except NameError:  # Python 3.10: the backport Hypothesis depends on
    from exceptiongroup import BaseExceptionGroup

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SUITE_DIRS = tuple(os.path.join(_ROOT, d) + os.sep for d in ("conformance", "properties"))
_TARGET_DIRS = (os.path.join(_ROOT, "conformance", "adapters") + os.sep,)
_SUITE_FILES = (os.path.join(_ROOT, "conftest.py"),)
_NAMES_A_GPU = re.compile(r"cuda|\bgpus?\b", re.IGNORECASE)


def _raised_by_target(exc: BaseException) -> str | None:
    """The source line that raised ``exc`` if that line is the target's, else None."""
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    in_suite = (path.startswith(_SUITE_DIRS) and not path.startswith(_TARGET_DIRS)) or path in _SUITE_FILES
    if in_suite:
        return None
    return linecache.getline(path, tb.tb_lineno).strip()


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
