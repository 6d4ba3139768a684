"""``python -m conformance [pytest args]``: run the conformance checks and print the report.

With no arguments: every conformance check against the default target (this project's
``impl``) on the default device, with the ``ci`` Hypothesis profile.  Any pytest option
can follow, e.g. ``--target path/to/tests/adapters.py``, ``--device cuda``,
``--hypothesis-profile thorough``, ``--conformance-report out/report``.
"""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.chdir(ROOT)
    # The target's conformance only: the suite's self-checks (mutants, harness) run with the tests.
    args = ["conformance", "-q", "-p", "no:cacheprovider", "--ignore-glob=conformance/test_*mutants.py",
            "--ignore=conformance/selftests/test_harness.py"]
    if not any(a.startswith("--hypothesis-profile") for a in argv):
        args += ["--hypothesis-profile", "ci"]
    return int(pytest.main(args + argv))


if __name__ == "__main__":
    sys.exit(main())
