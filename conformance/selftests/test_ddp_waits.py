"""impl's DDP waits once per step where the backend completes collectives in order.

``comm.Averager.wait_all`` on NCCL waits for the last collective only (the process group's
one stream runs them in issue order); on other backends it waits for each.  The CPU cannot
run NCCL, so the choice is checked here with recorded stand-ins for the works; the DDP
laws on two GPUs check the numbers it leads to.
"""

from __future__ import annotations

import torch

from impl.ddp import comm


class _Work:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(self.name)


def _averager(in_order: bool, divisor: int) -> comm.Averager:
    a = comm.Averager.__new__(comm.Averager)  # no process group needed for the waits
    a.in_order, a.op, a.divisor = in_order, None, divisor
    return a


def _pending(log, names, divisor):
    return [comm.PendingAverage(torch.full((2,), 4.0), _Work(log, n) if n else None, divisor) for n in names]


def test_in_order_backend_waits_for_the_last_collective_only():
    log = []
    pending = _pending(log, ["a", "b", "c"], 1)
    _averager(True, 1).wait_all(pending)
    assert log == ["c"]
    assert all(p.work is None for p in pending)


def test_in_order_wait_skips_a_unit_with_nothing_launched_at_the_end():
    log = []
    pending = _pending(log, ["a", "b", None], 1)
    _averager(True, 1).wait_all(pending)
    assert log == ["b"]


def test_other_backends_wait_for_each_and_divide_once():
    log = []
    pending = _pending(log, ["a", "b"], 2)
    _averager(False, 2).wait_all(pending)
    assert log == ["a", "b"]
    assert all(torch.equal(p.tensor, torch.full((2,), 2.0)) for p in pending)
    _averager(False, 2).wait_all(pending)  # waiting again neither waits nor divides again
    assert log == ["a", "b"] and torch.equal(pending[0].tensor, torch.full((2,), 2.0))


def test_a_sum_launched_on_an_in_order_backend_is_still_divided_after_its_wait():
    log = []
    pending = _pending(log, ["a", "b"], 2)
    _averager(True, 2).wait_all(pending)
    assert log == ["b", "a"]  # the last first, then each one still to divide
    assert all(torch.equal(p.tensor, torch.full((2,), 2.0)) for p in pending)
