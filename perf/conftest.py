"""Fixtures for the benchmark harness's tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_cpu_thread(device):
    """On the CPU, one intra-op thread per test process.

    CI has 2 cores shared by the pytest-xdist workers; with torch's default of one
    thread per core, every parallel op of the tiny models waited for a descheduled
    sibling thread (a tiny model's forward+backward took 40-90 ms with 2 threads and
    10-12 ms with 1 under load).  The previous setting is restored after the test.
    """
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
