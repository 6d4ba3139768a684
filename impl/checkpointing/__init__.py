"""Activation checkpointing over a stack of blocks: none, every, segments, sqrt, nested.

Contract
    ``checkpointed_blocks(blocks, strategy, segment_size=None)`` -> ``CheckpointedBlocks``,
    an ``nn.Module`` whose ``forward(x)`` runs ``x -> blocks[0] -> ... -> blocks[-1]`` and
    returns the last block's output.  Its parameters and buffers are the blocks' own (the
    same objects, registered under ``blocks.<i>``; nothing is copied).

    Composition: a block receives one argument.  A block may return a tensor, or a tuple or
    list whose first item is the tensor that goes on (the rest may be anything: a float, a
    dict, None, as a transformer layer returning ``(hidden, extras)`` does); only that first
    item is passed to the next block, and ``forward`` returns the last block's output
    unchanged (the whole tuple if it returned one).

    Strategies over N blocks (``plan`` builds them as a tree of regions):
      "none"      plain forward; every block's saved tensors live until its backward.
      "every"     each block is its own checkpointed region (segments of 1).
      "segments"  consecutive regions of ``segment_size`` = k blocks, the last one shorter
                  when k does not divide N (k in 1..N).
      "sqrt"      the best single level: segments of k = ceil(sqrt(N)), which minimises
                  k + ceil(N / k) (the blocks of the region being recomputed plus the
                  region inputs kept), at ceil(2 sqrt(N)).
      "nested"    recursive halving: the stack is split into halves [0, ceil(n/2)) and the
                  rest, each a checkpointed region whose body is split the same way, down
                  to single blocks.  During backward only the inputs of the regions on the
                  path to the block being recomputed are kept: O(log N) region inputs plus
                  one block's saved tensors, for O(N log N) block forwards.

    Determinism: recomputation redraws the same random numbers (torch's checkpoint stashes
    and restores the CPU and CUDA RNG states), so dropout masks match and gradients equal
    the unchekpointed stack's bit for bit where the kernels are deterministic.

    Built on ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``.  Departures:
    ``early_stop=False``: a region's recomputation runs its blocks to the end instead of
    stopping after the last tensor it needs; this costs the tail of the last block's forward
    but makes the count of block forwards the formula in ``predict`` for every strategy,
    nested regions included (with early stop, where a nested recomputation stops depends on
    which inner region saved the last tensor).  That exactness is this plan's own, the
    reference of the suite's extras; the contract only bounds a strategy's peak and forwards
    from above, so torch's default early stop (fewer forwards, a lower peak) conforms too.
    The reentrant variant is never used: it drops parameter gradients when no input
    requires grad, and nested it holds each level's recomputed output while the inner
    levels run their backward.

    Bad input is a ``ValueError`` (unknown strategy, k < 1 or k > N, no blocks) or a
    ``TypeError`` (a block that is not an ``nn.Module``, a non-integer k).

``predict(n_blocks, strategy, segment_size=None, block_bytes=1, input_bytes=None)`` ->
``Prediction(peak_saved_bytes, block_forwards)`` is the cost model of those strategies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch.nn as nn
from torch.utils.checkpoint import checkpoint

STRATEGIES = ("none", "every", "segments", "sqrt", "nested")


@dataclass(frozen=True)
class Region:
    """A checkpointed region: its body (block indices and inner regions) is recomputed in
    backward; only the region's input is kept in forward."""

    body: tuple


def sqrt_segment_size(n_blocks: int) -> int:
    """ceil(sqrt(N)): a k minimising k + ceil(N / k) (the minimum is ceil(2 sqrt(N)))."""
    return max(1, math.isqrt(n_blocks - 1) + 1) if n_blocks > 1 else 1


def _segments(n: int, k: int) -> tuple:
    return tuple(Region(tuple(range(i, min(i + k, n)))) for i in range(0, n, k))


def _halves(lo: int, hi: int) -> tuple:
    """The body of a nested region over blocks [lo, hi)."""
    if hi - lo == 1:
        return (lo,)
    mid = lo + (hi - lo + 1) // 2
    return (Region(_halves(lo, mid)), Region(_halves(mid, hi)))


def _check(n_blocks: int, strategy: str, segment_size) -> int | None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown checkpointing strategy {strategy!r}; expected one of {STRATEGIES}")
    if n_blocks < 1:
        raise ValueError(f"need at least one block, got {n_blocks}")
    if strategy != "segments":
        return None
    if segment_size is None:
        raise ValueError("strategy 'segments' needs segment_size (blocks per checkpoint)")
    if isinstance(segment_size, bool) or not isinstance(segment_size, int):
        raise TypeError(f"segment_size must be an int, got {type(segment_size).__name__}")
    if not 1 <= segment_size <= n_blocks:
        raise ValueError(f"segment_size must be in 1..{n_blocks} (the number of blocks), got {segment_size}")
    return segment_size


def plan(n_blocks: int, strategy: str, segment_size: int | None = None) -> tuple:
    """The strategy as a tree: a tuple of block indices (run plainly) and ``Region``s."""
    k = _check(n_blocks, strategy, segment_size)
    if strategy == "none":
        return tuple(range(n_blocks))
    if strategy == "every":
        return _segments(n_blocks, 1)
    if strategy == "segments":
        return _segments(n_blocks, k)
    if strategy == "sqrt":
        return _segments(n_blocks, sqrt_segment_size(n_blocks))
    return (Region((0,)),) if n_blocks == 1 else _halves(0, n_blocks)


@dataclass(frozen=True)
class Prediction:
    peak_saved_bytes: int
    block_forwards: int


def _recompute_forwards(region: Region) -> int:
    """Block forwards spent in the backward of one region: its body once more, then each
    inner region's own backward."""
    inner = [r for r in region.body if isinstance(r, Region)]
    return _forwards_of(region.body) + sum(_recompute_forwards(r) for r in inner)


def _forwards_of(body) -> int:
    return sum(_forwards_of(x.body) if isinstance(x, Region) else 1 for x in body)


def predict(n_blocks: int, strategy: str, segment_size: int | None = None, block_bytes: int = 1,
            input_bytes: int | None = None) -> Prediction:
    """Peak bytes saved for backward and block forwards (recomputation included).

    ``block_bytes`` (b): what one block saves for backward; ``input_bytes`` (a): what a
    checkpointed region keeps, its input (default b: the classic model where a block's
    saved tensors are the size of its output).  For N blocks:

      none        peak = N b                                   forwards = N
      segments k  s = ceil(N / k) regions, r = N - (s - 1) k in the last;
                  peak = max(r b + (s - 1) a, k b + (s - 2) a)  (s >= 2; s = 1: N b)
                  -- backward recomputes one region at a time while the inputs of the
                  regions before it are still kept (the stack's own input is the
                  caller's, not counted)               forwards = 2 N
      every       segments with k = 1:  peak = b + (N - 1) a,  forwards = 2 N
      sqrt        segments with k = ceil(sqrt N): about 2 sqrt(N) b,  forwards = 2 N
      nested      depth D = ceil(log2 N) of halvings; peak = b + (regions on the path
                  whose inputs are kept) a = O(log N) a + b;
                  forwards = N + sum over regions of their size = N (1 + D) for N a
                  power of two: O(N log N).

    With a = b, segments cost about N / k + k blocks (Chen et al. 2016).
    """
    a = block_bytes if input_bytes is None else input_bytes
    b = block_bytes
    tree = plan(n_blocks, strategy, segment_size)
    forwards = _forwards_of(tree) + sum(_recompute_forwards(r) for r in tree if isinstance(r, Region))
    return Prediction(_peak(tree, a, b, kept=0, top=True), forwards)


def _peak(body, a: int, b: int, kept: int, top: bool = False) -> int:
    """Peak bytes while the backward of ``body`` runs, ``kept`` bytes of outer inputs held.

    Plain blocks keep b each until their backward; regions keep their input a (except the
    first item of the top level, whose input is the caller's).  Backward walks the items
    last to first; recomputing a region runs its body's backward with everything before
    it still held."""
    held = []  # bytes each item holds after the forward
    for i, item in enumerate(body):
        if isinstance(item, Region):
            held.append(0 if (top and i == 0) or (not top and i == 0) else a)
        else:
            held.append(b)
    peak = kept + sum(held)
    for i in range(len(body) - 1, -1, -1):
        before = kept + sum(held[:i])
        item = body[i]
        if isinstance(item, Region):
            peak = max(peak, _peak(item.body, a, b, before + held[i]))
    return peak


class CheckpointedBlocks(nn.Module):
    """``blocks`` run in order under a checkpointing plan (see the module docstring)."""

    def __init__(self, blocks: Sequence[nn.Module], strategy: str, segment_size: int | None = None):
        super().__init__()
        blocks = list(blocks)
        for i, block in enumerate(blocks):
            if not isinstance(block, nn.Module):
                raise TypeError(f"block {i} is a {type(block).__name__}, not an nn.Module")
        self.blocks = nn.ModuleList(blocks)
        self.strategy = strategy
        self.segment_size = segment_size
        self.plan = plan(len(blocks), strategy, segment_size)

    def forward(self, x):
        return self._run(self.plan, x)

    def _run(self, body, x):
        out = x
        for j, item in enumerate(body):
            inp = _carried(out) if j else out
            if isinstance(item, Region):
                out = checkpoint(self._run, item.body, inp, use_reentrant=False, early_stop=False)
            else:
                out = self.blocks[item](inp)
        return out


def _carried(out):
    """What goes on to the next block: the output, or the first item of a tuple/list."""
    return out[0] if isinstance(out, (tuple, list)) else out


def checkpointed_blocks(blocks, strategy: str, segment_size: int | None = None) -> CheckpointedBlocks:
    return CheckpointedBlocks(blocks, strategy, segment_size)


__all__ = ["CheckpointedBlocks", "Prediction", "Region", "STRATEGIES", "checkpointed_blocks", "plan", "predict",
           "sqrt_segment_size"]
