"""A distributed sampler of another design than torch's: contiguous blocks, padded from the end.

    --target conformance.selftests.targets.known_good.sampler_blocks

    get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False)

Where torch's DistributedSampler leaves the choice free, this one chooses otherwise:

- the shuffle comes from Python's ``random.Random`` seeded with the text "seed:epoch" (not a
  ``torch.Generator`` seeded with seed + epoch);
- without drop_last the order is padded with its LAST T - N entries (cycling), not its first;
- rank r takes the contiguous block [r L, (r + 1) L) of the padded order, not every R-th entry.

What torch documents still holds: shares of equal length L = ceil(N / R) (floor with drop_last,
which drops the tail of the order), every index seen each epoch, the same order on every rank,
a new order per epoch, none without shuffling, and a ValueError for a rank outside [0, R).
"""

from __future__ import annotations

import math
import random


class BlockSampler:
    def __init__(self, dataset_len: int, num_replicas: int, rank: int, shuffle=True, seed=0, drop_last=False):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside [0, {num_replicas}) for {num_replicas} replicas")
        if dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {dataset_len}")
        self.n, self.replicas, self.rank = dataset_len, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.epoch = 0
        # equal shares: drop the tail (floor) or pad (ceil)
        self.share_len = dataset_len // num_replicas if drop_last else math.ceil(dataset_len / num_replicas)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.share_len

    def _order(self) -> list[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(order)  # the same on every rank
        return order

    def _padded(self) -> list[int]:
        order = self._order()
        total = self.share_len * self.replicas
        if total <= len(order):
            return order[:total]  # drop_last: the tail of this epoch's order goes
        missing = total - len(order)
        cycled = order * math.ceil(missing / len(order))
        return order + cycled[len(cycled) - missing:]  # the end of the order again

    def __iter__(self):
        start = self.rank * self.share_len
        return iter(self._padded()[start:start + self.share_len])


def get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
    return BlockSampler(dataset_len, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
