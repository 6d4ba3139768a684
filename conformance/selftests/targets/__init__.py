"""Fixture targets for the suite's self-checks: targets that die or hang in each way a
student's code can (a segfault, an exit, an abort, a hang at import, a hang in a call).
Each offers the PyTorch attention flavour and breaks in one way."""
