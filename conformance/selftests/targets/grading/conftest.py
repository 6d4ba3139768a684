"""Fixture repositories for ``conformance/selftests/test_grade.py``: course-like checkouts
whose ``tests/`` folders are read by the grader, never collected by this suite's pytest."""

collect_ignore_glob = ["*/*"]
