"""``python -m conformance [pytest args]``: run the target's spec cases and print the report.

With no arguments: every spec case (``conformance/spec``) against the default target (this
project's ``impl``) on the default device, with the ``ci`` Hypothesis profile.  Any pytest
option can follow, e.g. ``--target path/to/tests/adapters.py``, ``--device cuda``,
``--hypothesis-profile thorough``, ``--conformance-report out/report``, ``--contract-only``.

The checks run in a worker process (pytest-xdist, one worker unless ``-n`` says otherwise)
that is replaced when it dies, so a target that segfaults, calls ``os._exit``, aborts or
hangs gets a failing row saying how (``conformance.isolation``) and the report still comes
out.  ``--no-isolation`` runs them in this process instead.
"""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A replaced worker per crash: enough for every check of a target that always crashes.
MAX_WORKER_RESTARTS = 1000


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.chdir(ROOT)
    args = ["conformance/spec", "-q", "-p", "no:cacheprovider"]
    if "--no-isolation" in argv:
        argv.remove("--no-isolation")
        args += ["-p", "no:xdist"]
    elif not any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in argv):
        args += ["-n", "1", f"--max-worker-restart={MAX_WORKER_RESTARTS}"]
    if not any(a.startswith("--hypothesis-profile") for a in argv):
        args += ["--hypothesis-profile", "ci"]
    return int(pytest.main(args + argv))


if __name__ == "__main__":
    sys.exit(main())
