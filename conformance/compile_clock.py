"""Seconds this process has spent compiling Triton kernels, from Triton's compilation listener.

A law's clock (``conformance.lawbook``) admits the next example only while twice the slowest
so far still fits its budget.  On a fresh GPU machine the first example that meets a kernel
variant pays its compilation (seconds per variant; tens for a set of Gluon ones), which the
next example, served from the cache, does not pay: counted in, it would stop the draws
after one example.  So the clock leaves these seconds out of its estimate, as it leaves out
a rank pool's start; the budget itself is still charged with them.

The listener is installed on the first call after Triton was imported (a target that uses
Triton has imported it by the time its law runs; a law that never meets Triton does not pay
for importing it), and passes every event on to the one it found (the GPU gate's progress
log installs its own); one installed later without passing events on stops the count, and
the estimate is then the wall time, as before.
"""

from __future__ import annotations

import sys

_SECONDS = [0.0]
_INSTALLED = [False]


def _count(previous):
    def listener(*, src, metadata, metadata_group, times, cache_hit):
        if not cache_hit:  # a hit reads the cache: part of the call, not a compilation
            try:  # microseconds; a Triton whose times read otherwise leaves the count where it is
                _SECONDS[0] += times.total / 1e6
            except (AttributeError, TypeError):  # never an error inside the target's compilation
                pass
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    return listener


def install() -> bool:
    """Start counting (once); False while Triton is not imported, or has no compilation listener."""
    if _INSTALLED[0]:
        return True
    if "triton" not in sys.modules:
        return False
    try:
        from triton import knobs

        knobs.compilation.listener = _count(knobs.compilation.listener)
    except (ImportError, AttributeError):  # a Triton without the knob: nothing is left out
        return False
    _INSTALLED[0] = True
    return True


def compile_seconds() -> float:
    """Seconds of Triton compilation in this process since counting started."""
    install()
    return _SECONDS[0]
