"""Bringing every rank's parameters up to date after a sharded optimizer step.

After a ZeRO-1 step each rank holds fresh values for the parameters it owns and stale
ones for the rest.  Two ways to copy the owners' bits to everyone (both exact copies):

``broadcast``
    One ``broadcast`` per parameter from its owner (ZeroRedundancyOptimizer's way).  No
    extra memory and the parameters stay where they are; one collective per parameter,
    and the broadcasts of different owners run one after another.
``allgather``
    Every parameter lives in one flat byte buffer per rank, laid out so that each rank's
    parameters of a round form one contiguous, equal-sized slot; one in-place all-gather
    per round moves all shards at once, every link busy in both directions.  The
    parameters' ``.data`` become views into the buffer (set up once; a parameter whose
    storage was replaced since is copied back in before the next sync).

Both work in *rounds*: a rank's shard is cut into buckets of about ``bucket_bytes``, and
round i sends bucket i of every rank.  The optimizer steps bucket i, launches its round
asynchronously, and steps bucket i+1 while bucket i is on the wire.

Layout of the all-gather buffer (W ranks, rounds 0..R-1, slot size S_i = the largest
bucket i over ranks, padded)::

    | round 0: rank 0 slot | rank 1 slot | ... | round 1: rank 0 slot | ... |
      <------ S_0 ------>
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# Byte alignment of every parameter in the flat buffer: that of CUDA's caching allocator,
# so kernels see parameters aligned as they would be in their own allocations.
ALIGN_BYTES = 512

SYNC_STRATEGIES = ("allgather", "broadcast")


def _align(n: int, a: int = ALIGN_BYTES) -> int:
    return (n + a - 1) // a * a


def nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


@dataclass(frozen=True)
class Round:
    """One round of a step: per rank, the global indices of the parameters it updates and sends."""

    buckets: tuple[tuple[int, ...], ...]


def plan_rounds(owned: list[list[int]], sizes: list[int], bucket_bytes: int | None) -> list[Round]:
    """Cut each rank's owned parameters (in the given order) into buckets of at most
    ``bucket_bytes`` (a larger parameter is a bucket of its own; None: one bucket per rank),
    and line the buckets up into rounds: round i holds bucket i of every rank."""
    per_rank = []
    for indices in owned:
        buckets, current, filled = [], [], 0
        for i in indices:
            if current and bucket_bytes is not None and filled + sizes[i] > bucket_bytes:
                buckets.append(tuple(current))
                current, filled = [], 0
            current.append(i)
            filled += sizes[i]
        if current:
            buckets.append(tuple(current))
        per_rank.append(buckets)
    n_rounds = max((len(b) for b in per_rank), default=0)
    return [Round(tuple(b[i] if i < len(b) else () for b in per_rank)) for i in range(n_rounds)]


class NoSync:
    """World size 1: nothing to send."""

    def launch(self, round_index: int) -> list:
        return []

    def prepare(self) -> None:
        pass


class BroadcastSync:
    """One asynchronous broadcast per parameter, from its owner, in round order."""

    def __init__(self, params: list[torch.Tensor], rounds: list[Round], group, global_ranks: list[int]):
        for i, p in enumerate(params):
            if not p.data.is_contiguous():
                raise ValueError(f"sync='broadcast' needs contiguous parameters; parameter {i} (shape {tuple(p.shape)}) is not")
        self.params, self.rounds, self.group, self.global_ranks = params, rounds, group, global_ranks

    def prepare(self) -> None:
        pass

    def launch(self, round_index: int) -> list:
        works = []
        for owner, bucket in enumerate(self.rounds[round_index].buckets):
            for i in bucket:
                works.append(dist.broadcast(self.params[i].data, src=self.global_ranks[owner], group=self.group, async_op=True))
        return works


def _all_gather_into(output: torch.Tensor, chunk: torch.Tensor, group):
    """In-place all-gather (``chunk`` is this rank's slice of ``output``), asynchronously."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, chunk, group=group, async_op=True)


class AllGatherSync:
    """Parameters as views into one flat byte buffer; one in-place all-gather per round."""

    def __init__(self, params: list[torch.Tensor], rounds: list[Round], group, rank: int, world_size: int):
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise ValueError(
                f"sync='allgather' keeps this rank's parameters in one flat buffer, so they must share one device; "
                f"got {sorted(str(d) for d in devices)} (use sync='broadcast')"
            )
        self.params, self.rounds, self.group = params, rounds, group
        self.rank, self.world_size = rank, world_size
        self.offsets = [0] * len(params)  # byte offset of each parameter in the buffer
        self.segments = []  # per round: (segment start, slot size)
        start = 0
        for rnd in rounds:
            slot = max(sum(_align(nbytes(params[i])) for i in bucket) for bucket in rnd.buckets)
            for owner, bucket in enumerate(rnd.buckets):
                at = start + owner * slot
                for i in bucket:
                    self.offsets[i] = at
                    at += _align(nbytes(params[i]))
            self.segments.append((start, slot))
            start += world_size * slot
        device = next(iter(devices))
        self.buffer = torch.zeros(start, dtype=torch.uint8, device=device)
        self.views = [self._view(i) for i in range(len(params))]
        for p, view in zip(params, self.views):
            view.copy_(p.data)
            p.data = view

    def _view(self, i: int) -> torch.Tensor:
        p = self.params[i]
        flat = self.buffer[self.offsets[i] : self.offsets[i] + nbytes(p)]
        return flat.view(p.dtype).view(p.shape)

    def prepare(self) -> None:
        """Re-adopt any parameter whose storage was replaced (``p.data = ...``) since setup."""
        for p, view in zip(self.params, self.views):
            if p.data.data_ptr() != view.data_ptr() or p.data.shape != view.shape:
                if p.dtype != view.dtype or p.shape != view.shape:
                    raise ValueError(
                        f"a parameter changed from {tuple(view.shape)} {view.dtype} to {tuple(p.shape)} {p.dtype} "
                        "after it was given to the sharded optimizer"
                    )
                view.copy_(p.data)
                p.data = view

    def launch(self, round_index: int) -> list:
        start, slot = self.segments[round_index]
        if slot == 0:
            return []
        segment = self.buffer[start : start + self.world_size * slot]
        mine = segment[self.rank * slot : (self.rank + 1) * slot]
        return [_all_gather_into(segment, mine, self.group)]
