"""Averaging collectives and the CUDA communication stream.

``launch_average(t)`` starts ``t <- sum_r t_r / world_size`` on the default process group
and returns a ``PendingAverage``; its ``wait()`` leaves the average in ``t``.  NCCL does
the division inside the collective (``ReduceOp.AVG``); other backends sum, and the
division runs once the sum has arrived.  Either way every rank divides the same bits by
the same number, so the result is bit-identical across ranks.  ``Averager`` makes that
choice once, for a wrapper that launches many collectives a step.

On CUDA, ``CommStream`` is a side stream for the work that feeds a collective (copying
gradients into a bucket): it starts after everything queued so far on the current
stream, runs beside the rest of the backward pass, and NCCL's own stream waits for it.
On the CPU it is a no-op.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def require_process_group(who: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{who} needs an initialised default process group: call "
            "torch.distributed.init_process_group(...) on every rank before wrapping the module"
        )


class PendingAverage:
    """An all-reduce in flight; ``wait()`` completes it and applies the division."""

    def __init__(self, tensor: torch.Tensor, work, divisor: int):
        self.tensor = tensor
        self.work = work
        self.divisor = divisor

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()  # NCCL: the current stream waits; the host does not block
            self.work = None
        if self.divisor != 1:
            self.tensor.div_(self.divisor)
            self.divisor = 1
        return self.tensor


def launch_average(tensor: torch.Tensor, async_op: bool = True) -> PendingAverage:
    """Start averaging ``tensor`` (in place) over the default process group."""
    return Averager(tensor.device).launch(tensor, async_op)


class Averager:
    """``launch_average`` with the backend's choice (AVG inside the collective, or SUM then
    divide) made once: a wrapper launching hundreds of buckets a step asks for it once."""

    def __init__(self, device: torch.device):
        n = dist.get_world_size()
        # NCCL runs one process group's collectives on one stream, in the order they were
        # issued, and divides inside the collective.
        self.in_order = torch.device(device).type == "cuda" and "nccl" in str(dist.get_backend()).lower()
        if self.in_order:
            self.op, self.divisor = dist.ReduceOp.AVG, 1
        else:
            self.op, self.divisor = dist.ReduceOp.SUM, n

    def launch(self, tensor: torch.Tensor, async_op: bool = True) -> PendingAverage:
        # Looked up on the module at call time (not imported by name), so a test can observe it.
        work = dist.all_reduce(tensor, op=self.op, async_op=async_op)
        return PendingAverage(tensor, work if async_op else None, self.divisor)


    def wait_all(self, pending: list[PendingAverage]) -> None:
        """Complete every average in ``pending`` (launched in this order by this averager).

        In order (NCCL): the current stream waits for the last collective only, which on the
        process group's one stream comes after all the others: one wait per step instead
        of one per bucket (about 10 us of host time each).  Otherwise each is waited."""
        if self.in_order:
            last = next((p for p in reversed(pending) if p.work is not None), None)
            if last is not None:
                last.wait()
            for p in pending:
                if p.divisor == 1:
                    p.work = None  # complete: it ran before the last one on the same stream
        for p in pending:
            p.wait()


def average_(tensor: torch.Tensor) -> torch.Tensor:
    """Blocking average in place."""
    return launch_average(tensor, async_op=False).wait()


class CommStream:
    """Where the work feeding a collective runs: a CUDA side stream, or inline on the CPU.

    ``enter()`` switches to the side stream after all work queued so far on the current
    one and returns what ``leave(previous)`` restores (None on the CPU: nothing to do).
    Two plain calls, not a context manager: they run once per bucket on the host's hot path.
    """

    def __init__(self, device: torch.device, enabled: bool = True):
        self.stream = torch.cuda.Stream(device=device) if enabled and device.type == "cuda" else None
        # One event, recorded again at every launch: Stream.wait_stream would create (and
        # later destroy) a fresh CUDA event per call.
        self._ready = torch.cuda.Event() if self.stream is not None else None
        self._device_index = device.index if self.stream is not None else None

    def enter(self):
        if self.stream is None:
            return None
        current = torch.cuda.current_stream(self._device_index)
        self._ready.record(current)
        self.stream.wait_event(self._ready)
        torch.cuda.set_stream(self.stream)
        return current

    def leave(self, previous) -> None:
        if previous is not None:
            torch.cuda.set_stream(previous)

    def keep_alive(self, tensor: torch.Tensor) -> None:
        """Tell the caching allocator ``tensor`` is read on the side stream (it may be freed sooner)."""
        if self.stream is not None:
            tensor.record_stream(self.stream)
