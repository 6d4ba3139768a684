"""Grading a class: the pieces of ``python -m conformance.grade``, one job a module.

    releases   which CS336 release (2025, 2026) an adapters file or a checkout follows
    project    a repository's packages and metadata, as its ``pyproject.toml`` declares them
    official   every version of the course's test files an official checkout holds
    edits      the official tests a repository changed, found by comparing syntax trees
    runner     one repository's conformance run in its own process tree, read into a record
    tables     the records as grades.json, grades.csv and grades.md
"""
