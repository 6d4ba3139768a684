"""Averaging collectives and the CUDA communication stream.

``launch_average(t)`` starts ``t <- sum_r t_r / world_size`` on the default process group
and returns a ``PendingAverage``; its ``wait()`` leaves the average in ``t``.  NCCL does
the division inside the collective (``ReduceOp.AVG``); other backends sum, and the
division runs once the sum has arrived.  Either way every rank divides the same bits by
the same number, so the result is bit-identical across ranks.

On CUDA, ``CommStream`` is a side stream for the work that feeds a collective (copying
gradients into a bucket): it starts after everything queued so far on the current
stream, runs beside the rest of the backward pass, and NCCL's own stream waits for it.
On the CPU it is a no-op.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


def require_process_group(who: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{who} needs an initialised default process group: call "
            "torch.distributed.init_process_group(...) on every rank before wrapping the module"
        )


def _averages_in_collective(tensor: torch.Tensor) -> bool:
    """NCCL has ReduceOp.AVG; gloo (and the rest) only sum."""
    return tensor.is_cuda and "nccl" in str(dist.get_backend()).lower()


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
    n = dist.get_world_size()
    if _averages_in_collective(tensor):
        op, divisor = dist.ReduceOp.AVG, 1
    else:
        op, divisor = dist.ReduceOp.SUM, n
    # Looked up on the module at call time (not imported by name), so a test can observe it.
    work = dist.all_reduce(tensor, op=op, async_op=async_op)
    return PendingAverage(tensor, work if async_op else None, divisor)


def average_(tensor: torch.Tensor) -> torch.Tensor:
    """Blocking average in place."""
    return launch_average(tensor, async_op=False).wait()


class CommStream:
    """Where the work feeding a collective runs: a CUDA side stream, or inline on the CPU."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.stream = torch.cuda.Stream(device=device) if enabled and device.type == "cuda" else None

    @contextlib.contextmanager
    def after_current(self):
        """Run the block on the side stream, after all work queued so far on the current one."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield

    def keep_alive(self, tensor: torch.Tensor) -> None:
        """Tell the caching allocator ``tensor`` is read on the side stream (it may be freed sooner)."""
        if self.stream is not None and tensor.is_cuda:
            tensor.record_stream(self.stream)
