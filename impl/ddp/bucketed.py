"""BucketedDDP: parameters grouped into buckets, one async all-reduce per bucket.

Layout
    Parameters that require grad, in reverse registration order (about the order their
    gradients become ready in a backward pass), are packed greedily into buckets of at
    most ``bucket_size_mb`` MiB (2**20 bytes) of gradient; a parameter larger than the
    cap gets a bucket of its own; ``None`` means one bucket.  A bucket holds one dtype.
    ``.buckets`` lists each bucket's parameter names (first name of a tied parameter).

Buffer
    Each bucket owns one flat buffer: the gradients of its parameters, back to back in
    bucket order, then one presence flag per parameter (1 if this rank had a gradient).
    After a synced step ``param.grad`` IS a view into that buffer (like torch's
    ``gradient_as_bucket_view``): the averaged gradient is never copied back.  When the
    gradient is already that view (``zero_grad(set_to_none=False)``, accumulation under
    ``no_sync``) nothing is copied in either.

Timeline of a synced backward pass
    hook(p)       marks p ready; when every parameter of the next bucket in launch order
                  is ready, the bucket is launched (and any ready buckets behind it)
    launch        copy the fresh gradients into the buffer (one multi-tensor copy), start
                  the all-reduce, point ``param.grad`` at the buffer (the fresh gradient
                  tensor is freed now); with ``side_stream=True`` the copy runs on a CUDA
                  side stream after the gradients (the allocator is told it reads them)
    finish        launch buckets still waiting (missing gradients count as zero), wait
                  (NCCL: the compute stream waits, the host does not), divide where the
                  backend only sums, and only where a gradient was missing here read
                  the averaged flags back: > 0 keeps the view, 0 sets ``.grad = None``;
                  then every flag is set back to 1 (one multi-tensor copy), so a launch
                  where this rank has every gradient writes no flags
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn as nn

from .base import OrderedOverlapBase, Unit

MIB = 1 << 20


def check_bucket_size_mb(bucket_size_mb) -> float | None:
    if bucket_size_mb is None:
        return None
    if isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, numbers.Real):
        raise TypeError(f"bucket_size_mb must be a positive number of MiB or None, got {type(bucket_size_mb).__name__}")
    if not (math.isfinite(bucket_size_mb) and bucket_size_mb > 0):
        raise ValueError(f"bucket_size_mb must be a positive, finite number of MiB or None, got {bucket_size_mb!r}")
    return float(bucket_size_mb)


def plan_buckets(nbytes: list[int], kinds: list, cap_bytes: float | None) -> list[list[int]]:
    """Greedy packing, in the given order, of items of ``nbytes`` into buckets of at most
    ``cap_bytes`` (None: unbounded); an item larger than the cap gets its own bucket; a
    change of ``kind`` (dtype, device) starts a new bucket.  Returns lists of indices."""
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes, current_kind = 0, None
    for i, (size, kind) in enumerate(zip(nbytes, kinds)):
        overflow = cap_bytes is not None and current_bytes + size > cap_bytes
        if current and (overflow or kind != current_kind):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += size
        current_kind = kind
    if current:
        buckets.append(current)
    return buckets


class Bucket(Unit):
    def __init__(self, index: int, params: list[nn.Parameter], names: list[str]):
        super().__init__(index, params, names)
        numel = sum(p.numel() for p in params)
        self.buffer = torch.zeros(numel + len(params), dtype=params[0].dtype, device=params[0].device)
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.buffer[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.presence = self.buffer[numel:]
        self.ones = torch.ones(len(params), dtype=params[0].dtype, device=params[0].device)
        self.presence.fill_(1)  # kept at 1 between rounds: a launch with every gradient writes nothing

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


class BucketedDDP(OrderedOverlapBase):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None = None, *, side_stream: bool = False):
        self.bucket_size_mb = check_bucket_size_mb(bucket_size_mb)
        # False (default, like torch DDP): copy into the bucket on the backward's own stream.
        # True: on a side stream, beside the backward.  Measured on one H100, one rank, one
        # bucket per parameter (perf/notes/RESULTS.md): the side stream costs the host about
        # twice as much per bucket (an event, two stream switches, and the allocator's
        # cross-stream frees) for the same peak memory; it only pays where the device,
        # not the host, bounds the step.
        self.side_stream = bool(side_stream)
        super().__init__(module)

    @property
    def buckets(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order."""
        return [list(b.names) for b in self._units]

    def _layout(self, order: list[tuple[str, nn.Parameter]]) -> list[list[int]]:
        cap = None if self.bucket_size_mb is None else self.bucket_size_mb * MIB
        nbytes = [p.numel() * p.element_size() for _, p in order]
        kinds = [(p.dtype, p.device) for _, p in order]
        return plan_buckets(nbytes, kinds, cap)

    def _build_units(self) -> list[Bucket]:
        order = list(zip(self._names, self._params))[::-1]
        layout = self._layout(order)
        return [Bucket(i, [order[j][1] for j in idx], [order[j][0] for j in idx]) for i, idx in enumerate(layout)]

    def _launch(self, bucket: Bucket) -> None:
        # The host's hot path, once per bucket per step (in a host-bound step every
        # microsecond here adds to the step): one multi-tensor copy and the collective;
        # the flags already read 1 (see _end_round).
        present = [p.grad is not None for p in bucket.params]
        bucket.local_present = present
        previous = self.comm_stream.enter()
        try:
            sources, targets = [], []
            for p, view, here in zip(bucket.params, bucket.views, present):
                if not here:
                    self._fill_missing(view)
                elif p.grad is not view:
                    sources.append(p.grad)
                    targets.append(view)
            if not all(present):
                bucket.presence.copy_(torch.tensor([float(f) for f in present], dtype=bucket.buffer.dtype))
            if sources:
                torch._foreach_copy_(targets, sources)
                if self.comm_stream.stream is not None:
                    for g in sources:
                        self.comm_stream.keep_alive(g)
            bucket.pending = self._start_average(bucket, bucket.buffer)
        finally:
            self.comm_stream.leave(previous)
        for p, view, here in zip(bucket.params, bucket.views, present):
            if here:
                p.grad = view

    @staticmethod
    def _fill_missing(view: torch.Tensor) -> None:
        view.zero_()  # a gradient this rank did not produce counts as zero in the average

    def _end_round(self) -> None:
        # After the average a flag reads 1 only if every rank had the gradient: set them all
        # back to 1 for the next round, in one multi-tensor copy per step (not one per bucket).
        if self._units:  # a module with nothing to train has no buckets
            torch._foreach_copy_([b.presence for b in self._units], [b.ones for b in self._units])

    def _complete_missing(self, bucket: Bucket, presence) -> None:
        anywhere = bucket.presence.tolist()
        for p, view, here, there in zip(bucket.params, bucket.views, bucket.local_present, anywhere):
            if not here and there > 0:
                p.grad = view
