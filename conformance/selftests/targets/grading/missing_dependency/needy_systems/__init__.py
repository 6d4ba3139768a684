import grading_fixture_absent_package  # noqa: F401 - declared in pyproject.toml, installed nowhere
