"""torch's own activation checkpointing as a target for the checkpointing laws.

``--target conformance.adapters.torch_checkpoint``:

    get_checkpointed_blocks(blocks, strategy, segment_size=None)
        "none"      the blocks in a plain loop;
        "segments"  k = segment_size: where k divides N, torch's ``checkpoint_sequential``
                    with N / k segments (it checkpoints every segment but the last, which
                    runs plainly); otherwise one ``checkpoint`` per k consecutive blocks,
                    the last region shorter;
        "every"     segments of 1;
        "sqrt"      segments of k = ceil(sqrt N) (k + ceil(N / k) is minimal there);
        "nested"    ``checkpoint`` calls nested by recursive halving ([0, ceil(n/2)) and
                    the rest), down to single blocks.

Every call is ``torch.utils.checkpoint.checkpoint`` with torch's defaults: non-reentrant
(``use_reentrant=False``, the value torch recommends; it must be passed), ``early_stop=True``
(a region's recomputation stops once the tensors backward needs are rebuilt) and the RNG
state preserved.  So it recomputes less and holds less than impl, which turns early stop
off to make its own cost model exact.

Composition: each block gets the first item of the previous block's output when that is a
tuple or list; the last block's output comes back whole.
"""

from __future__ import annotations

import math

import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

STRATEGIES = ("none", "every", "segments", "sqrt", "nested")


def _carried(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class _Takes(nn.Module):
    """A block fed with what the previous block hands on (its output, or its tuple's first item)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(_carried(x))


def _run(steps, x):
    for step in steps:
        x = step(x)
    return x


class TorchCheckpointedBlocks(nn.Module):
    def __init__(self, blocks, strategy: str, segment_size=None):
        super().__init__()
        blocks = list(blocks)
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown checkpointing strategy {strategy!r}; expected one of {STRATEGIES}")
        if not blocks:
            raise ValueError("need at least one block")
        if strategy == "segments":
            if isinstance(segment_size, bool) or not isinstance(segment_size, int):
                raise TypeError(f"segment_size must be an int, got {segment_size!r}")
            if not 1 <= segment_size <= len(blocks):
                raise ValueError(f"segment_size must be in 1..{len(blocks)} (the number of blocks), got {segment_size}")
        self.blocks = nn.ModuleList(blocks)
        self.steps = [_Takes(b) for b in blocks]  # not registered: the parameters are the blocks'
        self.strategy = strategy
        n = len(blocks)
        self.k = {"every": 1, "segments": segment_size, "sqrt": math.isqrt(n - 1) + 1 if n > 1 else 1}.get(strategy)

    def forward(self, x):
        steps = self.steps
        if self.strategy == "none":
            return _run(steps, x)
        if self.strategy == "nested":  # a single block is one region; more are split in two
            return checkpoint(self._nested, steps, x, use_reentrant=False) if len(steps) == 1 else self._nested(steps, x)
        n, k = len(steps), self.k
        if n % k == 0:
            return checkpoint_sequential(steps, n // k, x, use_reentrant=False)
        for i in range(0, n, k):
            x = checkpoint(_run, steps[i:i + k], x, use_reentrant=False)
        return x

    def _nested(self, steps, x):
        """The body of a region over ``steps``: one block, or its two halves, each a region."""
        if len(steps) == 1:
            return steps[0](x)
        mid = (len(steps) + 1) // 2
        x = checkpoint(self._nested, steps[:mid], x, use_reentrant=False)
        return checkpoint(self._nested, steps[mid:], x, use_reentrant=False)

def get_checkpointed_blocks(blocks, strategy, segment_size=None):
    return TorchCheckpointedBlocks(blocks, strategy, segment_size)
