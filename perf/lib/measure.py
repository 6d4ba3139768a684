"""Timing, peak memory and out-of-memory handling shared by the benchmark scripts.

Timing
    ``time_calls(fn, device, warmup, steps)``: wall-clock seconds of each of ``steps``
    calls after ``warmup`` untimed ones, with ``workloads.synchronize`` before and after
    every timed call (CUDA work is asynchronous: without the syncs a timer reads the
    launch, not the work).  Used for whole model steps, where the spread matters.
    ``median_ms(fn, device)``: the median of many calls.  On CUDA this is
    ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call, warm-up and
    repetition given in milliseconds); on the CPU a perf_counter loop with the same
    meaning, so the sweep runs anywhere.

    ``device_ms_held_behind(fn, device, host_us=...)``: the median device time of one call
    with the GPU held behind the host by a sleep after the flush, so that a call whose host
    time exceeds the flush is still timed by its kernels (do_bench reads whichever ends last).

Kernels
    ``kernel_us_per_call(fn, calls)``: device time per call of each CUDA kernel ``fn``
    launches (torch.profiler, after one untimed call), microseconds by kernel name.

Memory
    ``PeakMemory``: ``torch.cuda.max_memory_allocated`` over a block, after resetting the
    peak; None on the CPU (no allocator statistics there).

Out of memory
    ``Outcome.of(exc)`` classifies an exception into what a table shows: "OOM"
    (torch.OutOfMemoryError, or a CUDA/cuDNN error that says it ran out of memory),
    "unsupported" (an SDPA backend that has no kernel for these inputs), or
    "error: Type: message".  ``free_memory(device)`` releases what a failed case left
    in the caching allocator; call it *after* leaving the ``except`` block, since the
    traceback holds the failed frames' tensors.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from perf.lib.workloads import synchronize

OK = "ok"
OOM = "OOM"
UNSUPPORTED = "unsupported"
SKIPPED = "skipped"

_OOM_WORDS = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")
# What SDPA says when the backend forced by sdpa_kernel() cannot take the inputs
# (CUDA: "No available kernel"; CPU: "No viable backend").
_UNSUPPORTED_WORDS = ("No available kernel", "No viable backend")


@dataclass(frozen=True)
class Outcome:
    status: str  # OK, OOM, UNSUPPORTED, SKIPPED or "error"
    detail: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> "Outcome":
        text = f"{type(exc).__name__}: {exc}".strip()
        first_line = text.splitlines()[0][:300] if text else type(exc).__name__
        if isinstance(exc, torch.OutOfMemoryError) or any(w in str(exc) for w in _OOM_WORDS):
            return cls(OOM, first_line)
        if any(w in str(exc) for w in _UNSUPPORTED_WORDS):
            return cls(UNSUPPORTED, first_line)
        return cls("error", first_line)

    @property
    def label(self) -> str:
        """What a table cell shows."""
        return f"error: {self.detail}" if self.status == "error" else self.status


def free_memory(device: torch.device | str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


class PeakMemory:
    """Peak bytes allocated on a CUDA device during the block (``.bytes``); None on the CPU."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.bytes: int | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda" and exc[0] is None:
            synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device)

    @property
    def mib(self) -> float | None:
        return None if self.bytes is None else self.bytes / 2**20


def host_and_wall_us_per_call(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(host, wall) microseconds a call: ``calls`` calls with no synchronisation inside the
    loop (what the CPU spends issuing the work), then the wall time once the GPU is done.
    Without a GPU (a script's dry run) the two are the same."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    sync()
    return host, (time.perf_counter() - t0) / calls * 1e6


def time_calls(fn: Callable[[], object], device, warmup: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` timed calls, after ``warmup`` untimed ones."""
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


def _clear_grads(tensors: Iterable[torch.Tensor] | None) -> None:
    for t in tensors or ():
        t.grad = None


def median_ms(fn: Callable[[], object], device, *, warmup_ms: float = 25, rep_ms: float = 100,
              grad_to_none: Sequence[torch.Tensor] | None = None, max_calls: int = 1000) -> float:
    """Median milliseconds of one call: do_bench on CUDA, a perf_counter loop on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, return_mode="median"))
    # CPU: one call to estimate, then as many as fit in rep_ms (at least 3, at most max_calls).
    _clear_grads(grad_to_none)
    start = time.perf_counter()
    fn()
    estimate = max(time.perf_counter() - start, 1e-6)
    for _ in range(min(max_calls, int(warmup_ms / 1e3 / estimate))):
        _clear_grads(grad_to_none)
        fn()
    times = []
    for _ in range(max(3, min(max_calls, int(rep_ms / 1e3 / estimate)))):
        _clear_grads(grad_to_none)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def host_us_per_call(fn: Callable[[], object], device, *, calls: int = 20,
                     grad_to_none: Sequence[torch.Tensor] | None = None) -> float | None:
    """Microseconds the host spends issuing one call: ``calls`` calls with no synchronisation
    inside the loop (the GPU works behind), divided by ``calls``.  None on the CPU, where
    host and device time are the same thing."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        _clear_grads(grad_to_none)
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize(device)
    return host


# The GPU is held behind the host by a sleep this many times the call's host time (at least
# MIN_HOLD_US): the host's issue of one call then ends before the GPU reaches its start event.
HOLD_FACTOR = 3.0
MIN_HOLD_US = 40.0


@functools.lru_cache(maxsize=None)
def _sleep_cycles_per_us(device_index: int) -> float:
    """``torch.cuda._sleep``'s cycles per microsecond on this GPU, timed once with events."""
    with torch.cuda.device(device_index):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000)  # the first call loads the kernel
        start.record()
        torch.cuda._sleep(2_000_000)
        end.record()
        torch.cuda.synchronize()
        return 2_000_000 / (start.elapsed_time(end) * 1e3)


def device_ms_held_behind(fn: Callable[[], object], device, *, host_us: float, reps: int = 30,
                          grad_to_none: Sequence[torch.Tensor] | None = None) -> float | None:
    """Median milliseconds of device time of one call, with the GPU held behind the host, so
    that the events time the call's kernels and not its issue.  Before each call, as do_bench:
    the L2 flushed; then a GPU sleep of HOLD_FACTOR x ``host_us`` (the call's host time,
    ``host_us_per_call``; at least MIN_HOLD_US), during which the host issues the whole call.
    Where a call's host time exceeds the flush, do_bench's reading is whichever of the two ends
    last, not the kernels.  None on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    from triton.runtime import driver

    index = device.index if device.index is not None else torch.cuda.current_device()
    cycles = int(max(MIN_HOLD_US, HOLD_FACTOR * host_us) * _sleep_cycles_per_us(index))
    cache = driver.active.get_empty_cache_for_benchmark()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        _clear_grads(grad_to_none)
        driver.active.clear_cache(cache)
        torch.cuda._sleep(cycles)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events)


class Deadline:
    """A wall-clock budget: ``expired`` once ``seconds`` have passed (never, for None)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.end = None if seconds is None else time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def left(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - time.monotonic())


def device_description(device: torch.device | str) -> dict:
    """What a results file needs to say about where it was measured."""
    import platform

    device = torch.device(device)
    info = {"device": str(device), "torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info


def kernel_us_per_call(fn: Callable[[], object], calls: int = 20) -> dict[str, float]:
    """Microseconds of device time per call, by CUDA kernel (name cut to 80 characters)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key[:80]: round(e.device_time_total / calls, 2) for e in prof.key_averages()
            if e.device_type.name == "CUDA" and getattr(e, "device_time_total", 0) > 0}
