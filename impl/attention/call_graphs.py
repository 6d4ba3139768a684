"""A call's kernel launches recorded once as a CUDA graph and replayed when the call comes again
with its tensors at the same addresses: a training loop's steady state, a benchmark's repetitions.

At a short sequence a pass is decided by how long the host takes to issue it.  Through Triton's
C launcher a launch costs the host 8 to 18 us on an H200's host (the Gluon dK/dV kernel with its
five TMA descriptors the most); a graph of a backward's three launches replays in about 6, and
recording one costs about 150 (perf/results/2026-11-28-h200-call-graphs/).

Contract
    graphs = CallGraphs(device, launches, scratch=())   # one per plan
    graphs.run(key, launch) -> None                     # one per call
    launches: every ``triton_launch.Launch`` the owner's calls issue (recording waits until
        all are ``graph_ready``).
    scratch: (shape, dtype) of each buffer the launches write before they read it (a
        zeroed accumulator, per-row statistics).  A direct call gets fresh ones; a graph keeps
        its own, allocated when it is recorded.
    key: hashable, and everything the launches' arguments depend on besides what the owner
        fixes once (its plan: shapes, strides, scalars, kernels): the address of every tensor
        they read or write, except the scratch buffers.  ``run`` adds the current stream.
    launch(*buffers): issues the launches, handed the scratch buffers, reading and writing
        only the tensors named by key and those buffers.
    The first SIGHTINGS calls with a key launch directly; the next records the launches on a
    side stream and replays them; later ones replay.  Replaying launches exactly the kernels, with
    exactly the arguments, that a direct call would, so results are the same bits.
    Always direct: while the current stream is being captured (the caller's own graph records
    the launches), while launch hooks are set (a profiler sees every launch), when a launch is
    not bound to Triton's C launcher or needs global scratch, when the device is not the
    current one, when the scratch of one call is over MAX_SCRATCH_BYTES, and when ENABLED is
    False (the default; ``LLM_SYSTEMS_CALL_GRAPHS=1`` in the environment at import sets it; it
    is read on every call).  If recording fails the owner stays direct.
    Bounded: at most MAX_GRAPHS graphs and MAX_KEPT_BYTES of kept scratch a process, the
    least recently used dropped first; ``clear()`` drops them all.  Recording costs far more
    than a direct call (capture and instantiation), so it must be paid back by replays: past
    FREE_RECORDINGS an owner records again only while its graphs have been replayed at least
    as often as it has recorded (addresses that recur only twice, or graphs dropped before
    they replay, stop the recording).  ``stats()`` counts what happened.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import warnings
from collections import OrderedDict

import torch

from impl.attention import triton_launch

MAX_GRAPHS = 512
MAX_SCRATCH_BYTES = 8 << 20  # a call's scratch; larger calls (whose GPU time hides their host time) are issued directly
MAX_KEPT_BYTES = 64 << 20  # all graphs' scratch together: memory the caller never sees allocated
MAX_SEEN = 8192
SIGHTINGS = 2  # direct calls of a key before it is recorded (addresses that recur only in pairs never are)
FREE_RECORDINGS = 32  # an owner's recordings before its replays must keep pace
ENABLED = os.environ.get("LLM_SYSTEMS_CALL_GRAPHS", "0") == "1"

_ENTRIES: OrderedDict = OrderedDict()  # (owner id, stream, key) -> _Entry, least recently used first
_SEEN: OrderedDict = OrderedDict()  # keys called directly -> how often
_KEPT = [0]  # bytes of scratch the graphs hold
_SIDE: dict = {}  # device index -> the stream graphs are recorded on
_OWNER_IDS = itertools.count()
_LOCK = threading.Lock()  # the bookkeeping above; a backward runs on autograd's device thread
_STATS = {"direct": 0, "recorded": 0, "replayed": 0, "dropped": 0, "declined": 0}


def stats() -> dict:
    """Calls issued directly, graphs recorded, replays (a recording's own first replay
    included), graphs dropped by the bounds, recordings declined for want of replays."""
    return dict(_STATS, graphs=len(_ENTRIES), kept_bytes=_KEPT[0])


def clear() -> None:
    """Drop every graph and its scratch (and forget the calls seen once)."""
    with _LOCK:
        _ENTRIES.clear()
        _SEEN.clear()
        _KEPT[0] = 0
        _STATS.update(dict.fromkeys(_STATS, 0))


def graph_count() -> int:
    return len(_ENTRIES)


class _Entry:
    __slots__ = ("graph", "buffers", "nbytes")

    def __init__(self, graph, buffers, nbytes):
        self.graph, self.buffers, self.nbytes = graph, buffers, nbytes


def _nbytes(scratch) -> int:
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in scratch)


class CallGraphs:
    """The graphs of one owner (a plan): its launches and scratch are fixed; a key names a call."""

    __slots__ = ("device", "launches", "scratch", "scratch_bytes", "owner", "broken", "recorded", "replayed")

    def __init__(self, device: torch.device, launches: tuple, scratch: tuple = ()):
        self.device = device
        self.launches = launches  # every Launch the owner's calls issue
        self.scratch = tuple(scratch)
        self.scratch_bytes = _nbytes(self.scratch)
        self.owner = next(_OWNER_IDS)
        self.broken = False
        self.recorded = self.replayed = 0

    def _buffers(self) -> tuple:
        return tuple(torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in self.scratch)

    def run(self, key, launch) -> None:
        if (not ENABLED or self.broken or self.device.type != "cuda" or torch.cuda.is_current_stream_capturing()
                or triton_launch._hooks_active() or torch.cuda.current_device() != self.device.index):
            _STATS["direct"] += 1
            launch(*self._buffers())
            return
        full = (self.owner, torch._C._cuda_getCurrentRawStream(self.device.index), key)
        with _LOCK:
            entry = _ENTRIES.get(full)
            if entry is not None:
                _ENTRIES.move_to_end(full)
            else:
                record = _SEEN.get(full, 0) >= SIGHTINGS and self._may_record()
                if record:
                    _SEEN.pop(full, None)  # absent when SIGHTINGS is 0
                else:
                    _SEEN[full] = _SEEN.get(full, 0) + 1
                    _SEEN.move_to_end(full)
                    if len(_SEEN) > MAX_SEEN:
                        _SEEN.popitem(last=False)
        if entry is None:
            entry = self._record(launch) if record else None
            if entry is None:
                _STATS["direct"] += 1
                launch(*self._buffers())
                return
            with _LOCK:
                twin = _ENTRIES.pop(full, None)  # another thread recorded the same call meanwhile
                _KEPT[0] += entry.nbytes - (twin.nbytes if twin is not None else 0)
                _ENTRIES[full] = entry
                self.recorded += 1
                _STATS["recorded"] += 1
                while len(_ENTRIES) > MAX_GRAPHS or _KEPT[0] > MAX_KEPT_BYTES:
                    _, old = _ENTRIES.popitem(last=False)
                    _KEPT[0] -= old.nbytes
                    _STATS["dropped"] += 1
        self.replayed += 1
        _STATS["replayed"] += 1
        entry.graph.replay()

    def _may_record(self) -> bool:
        if self.recorded >= FREE_RECORDINGS and self.replayed < 2 * self.recorded:  # its own first replays, and as many more
            _STATS["declined"] += 1
            return False
        return (self.scratch_bytes <= MAX_SCRATCH_BYTES
                and all(launch.graph_ready for launch in self.launches))

    def _record(self, launch):
        """The launches recorded on a side stream (nothing runs), or None if recording failed
        (this owner then stays direct, with a warning)."""
        buffers = self._buffers()
        side = _SIDE.get(self.device.index)
        if side is None:
            side = _SIDE[self.device.index] = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        side.wait_stream(current)  # the buffers' allocation is ordered before the replays
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    launch(*buffers)
                finally:
                    graph.capture_end()
        except RuntimeError as exc:
            self.broken = True
            warnings.warn(f"recording a CUDA graph of an attention call failed ({exc}); its launches are issued "
                          "directly from now on", RuntimeWarning, stacklevel=3)
            return None
        current.wait_stream(side)
        return _Entry(graph, buffers, self.scratch_bytes)
