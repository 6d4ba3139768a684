"""A checkpointed stack built on its own ``autograd.Function``, not on torch.utils.checkpoint.

A correct design other than impl's (and torch's), for the checkpointing laws:

- A region is one ``Function`` node.  Its forward runs the region's blocks under
  ``no_grad`` (nothing is saved for backward but the region's input); its backward restores
  the RNG state the forward started from, runs the blocks again with grad on, and takes the
  gradients of the region's input and parameters with ``torch.autograd.grad``, which it
  returns (autograd adds them into ``.grad``; nothing is written there by hand).
- The blocks' parameters are inputs of the node, so the node is recorded, and the
  parameters get their gradients, when the stack's input does not require grad.
- Regions nest: an inner region's node is built while the outer region recomputes, so each
  level keeps only its regions' inputs (the reentrant way: one backward runs inside another).
- "sqrt" takes the largest k minimising k + ceil(N / k) (the fewest regions; impl takes
  ceil(sqrt N)); "nested" halves with the larger half on the right (impl: on the left).
- Recomputation always runs a region to its end (no early stop).

``get_checkpointed_blocks(blocks, strategy, segment_size=None)``; a block returning a tuple
or list hands its first item on, and the last block's output comes back whole.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

STRATEGIES = ("none", "every", "segments", "sqrt", "nested")


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _run(blocks, x):
    for i, block in enumerate(blocks):
        x = block(_first(x) if i else x)
    return x


def _rng_devices(x):
    return [x.device] if x.is_cuda else []


class _Region(torch.autograd.Function):
    """apply(run, x, *params) -> run(x); backward runs ``run`` again.  ``params``: every
    parameter ``run`` uses, so that they get their gradients through this node."""

    @staticmethod
    def forward(ctx, run, x, *params):
        ctx.run, ctx.params = run, params
        ctx.cpu_rng = torch.get_rng_state()  # dropout must redraw the same masks
        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.is_cuda else None
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run(x)

    @staticmethod
    def backward(ctx, *grads_out):
        (x,) = ctx.saved_tensors
        with torch.random.fork_rng(devices=_rng_devices(x)):  # the caller's RNG stream goes on untouched
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng, x.device)
            inp = x.detach().requires_grad_(True)
            with torch.enable_grad():
                out = ctx.run(inp)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads_out)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        wanted = [inp] + [p for p in ctx.params if p.requires_grad]
        grads = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        by_param = dict(zip(map(id, wanted[1:]), grads[1:]))
        return (None, grads[0] if ctx.needs_input_grad[1] else None, *(by_param.get(id(p)) for p in ctx.params))


def _region(blocks, x, run=None):
    """``blocks`` (or ``run``, which uses only their parameters) as one checkpointed region."""
    params = [p for b in blocks for p in b.parameters()]
    return _Region.apply(run or (lambda t: _run(blocks, t)), x, *params)


class _Halves:
    """The body of a nested region: one block, or two halves, each a region (the larger second)."""

    def __init__(self, blocks):
        self.blocks = blocks
        half = len(blocks) // 2
        self.left, self.right = (_Halves(blocks[:half]), _Halves(blocks[half:])) if len(blocks) > 1 else (None, None)

    def __call__(self, x):
        if self.left is None:
            return self.blocks[0](x)
        x = _region(self.left.blocks, x, run=self.left)
        return _region(self.right.blocks, _first(x), run=self.right)


def _largest_best_k(n: int) -> int:
    cost = {k: k + math.ceil(n / k) for k in range(1, n + 1)}
    best = min(cost.values())
    return max(k for k, c in cost.items() if c == best)


class FunctionRegions(nn.Module):
    def __init__(self, blocks, strategy: str, segment_size=None):
        super().__init__()
        blocks = list(blocks)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if not blocks:
            raise ValueError("no blocks to run")
        for i, b in enumerate(blocks):
            if not isinstance(b, nn.Module):
                raise TypeError(f"block {i} is not an nn.Module")
        n = len(blocks)
        if strategy == "segments":
            if isinstance(segment_size, bool) or not isinstance(segment_size, int) or not 1 <= segment_size <= n:
                raise ValueError(f"segment_size {segment_size!r} is not a block count in 1..{n}")
        self.blocks = nn.ModuleList(blocks)
        self.strategy = strategy
        k = {"every": 1, "segments": segment_size, "sqrt": _largest_best_k(n)}.get(strategy)
        self.groups = [blocks[i:i + k] for i in range(0, n, k)] if k else []
        self.halves = _Halves(blocks) if strategy == "nested" else None

    def forward(self, x):
        if self.strategy == "none":
            return _run(self.blocks, x)
        if self.halves is not None:  # one block is one region; more are split in two
            return _region(self.halves.blocks, x) if len(self.blocks) == 1 else self.halves(x)
        for i, group in enumerate(self.groups):
            x = _region(group, _first(x) if i else x)
        return x


def get_checkpointed_blocks(blocks, strategy, segment_size=None):
    return FunctionRegions(blocks, strategy, segment_size)
