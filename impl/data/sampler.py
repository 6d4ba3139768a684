"""Each rank's share of a dataset's indices, per epoch (torch's DistributedSampler rule).

Contract
    ``DistributedSampler(dataset_len, num_replicas, rank, shuffle=True, seed=0,
    drop_last=False)`` is an iterable of int indices with ``set_epoch(epoch)`` and
    ``__len__``.  With N = dataset_len and R = num_replicas:

    order     shuffle: ``torch.randperm(N)`` drawn from a ``torch.Generator`` seeded with
              ``seed + epoch`` (the same permutation on every rank: it depends on nothing
              rank-specific); no shuffle: ``0, 1, ..., N-1``.
    length    drop_last and N % R != 0: ``ceil((N - R) / R)`` (= floor(N / R)); otherwise
              ``ceil(N / R)``.  Every rank gets the same length L; T = L * R.
    padding   without drop_last, the order is extended to T indices by repeating its
              start (``order + order[:T - N]``, cycling when T - N > N); with drop_last
              the last N - T indices of the order are dropped.
    share     rank r gets positions r, r + R, r + 2R, ... < T of the padded order.

    So over one epoch the ranks together see every index exactly once plus exactly the
    first T - N indices of the order once more (or, with drop_last, every index but the
    last N - T of the order exactly once).  N = 0 gives empty shares.

Errors
    num_replicas < 1, rank outside [0, num_replicas), a negative dataset_len or epoch, or
    non-integers raise ValueError / TypeError naming the argument.
"""

from __future__ import annotations

import math

import torch


def _int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


class DistributedSampler:
    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.dataset_len = _int("dataset_len", dataset_len, 0)
        self.num_replicas = _int("num_replicas", num_replicas, 1)
        self.rank = _int("rank", rank, 0)
        if rank >= num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}")
        self.shuffle = bool(shuffle)
        self.seed = _int("seed", seed, -(2**63))
        self.drop_last = bool(drop_last)
        self.epoch = 0
        n, r = dataset_len, num_replicas
        self.num_samples = math.ceil((n - r) / r) if drop_last and n % r != 0 else math.ceil(n / r)
        self.total_size = self.num_samples * r

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _int("epoch", epoch, 0)

    def order(self) -> list[int]:
        """The epoch's order of all N indices, before padding or dropping."""
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=g).tolist()

    def padded(self) -> list[int]:
        """The T indices the ranks share out, in order."""
        order = self.order()
        if self.drop_last:
            return order[: self.total_size]
        missing = self.total_size - len(order)
        if missing > 0:
            repeats = math.ceil(missing / len(order))
            order = order + (order * repeats)[:missing]
        return order

    def __iter__(self):
        return iter(self.padded()[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
