"""Fixture targets for the law time budget's self-test (``test_law_budget.py``).

Each offers ``mean_over_ranks(t)``: every rank of the default group calls it with its own
tensor and gets the mean over the ranks.  Every call first sleeps ``SLEEP_S`` on every
rank, so that a law drawing a dozen examples, or shrinking through a few dozen, outlasts a
budget of a few seconds.

    correct   slow but right
    summing   slow, and returns the sum (wrong wherever more than one rank runs)
    hanging   slow, and never returns for a tensor of ``HANG_FROM`` elements or more
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

SLEEP_S = 0.4
HANG_FROM = 5


class _SlowMean:
    def __init__(self, divide: bool = True, hang: bool = False):
        self.divide, self.hang = divide, hang

    def mean_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP_S)
        while self.hang and t.numel() >= HANG_FROM:
            time.sleep(0.05)
        out = t.clone()
        dist.all_reduce(out)
        return out / dist.get_world_size() if self.divide else out


correct = _SlowMean()
summing = _SlowMean(divide=False)
hanging = _SlowMean(hang=True)
