"""What a law observes of a checkpointed stack: the test blocks, the peak of activation
bytes (torch's ``MemTracker``) and the block forwards (forward pre-hooks).

The block (``Block``): ``x -> Dropout(p) -> Linear(d, h) -> GELU -> Linear(h, d)``.  Every
intermediate it makes is saved by the op after it, so no tensor lives only for a moment:
with fp32 rows of width d and hidden h it saves b = rows (4 d [dropout mask] + 4 d
[dropped input] + 4 h [GELU's input] + 4 h [fc2's input]) bytes, and its output is
a = 4 rows d bytes (``block_bytes``).  Its input is not saved by it (the dropout keeps its
mask only).  This holds for 0 < p < 1: with p = 0 the dropout hands its input on as it is
(no mask, no copy), so the peak laws draw p > 0.

Peak: ``ActivationPeak`` is torch's ``MemTracker`` (a dispatch mode; it works on the CPU)
that also records, after every op, the maximum of its current ``Activation`` bytes.  The
tracker files every tensor an op makes in forward as Activation, and also those made while
a module runs forward inside backward (checkpoint recomputation: its ``_in_ac`` flag);
gradients of activations are ``Temp`` and parameters, buffers and the tracked input are
other classes.  So the Activation peak is what forward keeps for backward, including what a
checkpoint keeps outside autograd (its region inputs, which ``saved_tensors_hooks`` never
see), plus what recomputation rebuilds.  The stack's input is registered with the tracker
beforehand (class Other): it is the caller's, not the stack's.

Forwards: a forward pre-hook on every block counts block forwards that start, original and
recomputed.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType


class ActivationPeak(MemTracker):
    """``MemTracker`` that also keeps the peak of the Activation class (bytes)."""

    def __init__(self):
        super().__init__()
        self.activation_peak = 0

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        for snap in self._curr_mem_snap.values():
            self.activation_peak = max(self.activation_peak, snap.get(_MemRefType.ACT, 0))


class Block(nn.Module):
    def __init__(self, d: int, h: int, p: float):
        super().__init__()
        self.drop = nn.Dropout(p)
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(self.drop(x))))


class ScaledBlock(Block):
    """A block with a buffer (a fixed scale folded into its input) that returns a tuple:
    ``(y, {"rows": n})`` -- the dict is not a tensor."""

    def __init__(self, d: int, h: int, p: float):
        super().__init__(d, h, p)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return super().forward(x * self.scale), {"rows": x.shape[0]}


def block_bytes(rows: int, d: int, h: int) -> tuple[int, int]:
    """(a, b): a block's output bytes and its saved bytes, fp32 (see the module docstring)."""
    return 4 * rows * d, rows * (4 * d + 4 * d + 4 * h + 4 * h)


def make_blocks(n: int, d: int, h: int, p: float, seed: int, kind=Block) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [kind(d, h, p) for _ in range(n)]


def plain_forward(blocks, x):
    """The stack without checkpointing (the composition rule: a tuple's first item goes on)."""
    out = x
    for i, block in enumerate(blocks):
        out = block(out[0] if i and isinstance(out, (tuple, list)) else out)
    return out


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class ForwardCounter:
    def __init__(self, blocks):
        self.count = 0
        self._handles = [b.register_forward_pre_hook(self._hook) for b in blocks]

    def _hook(self, module, args):
        self.count += 1

    def remove(self):
        for h in self._handles:
            h.remove()


def observe(model: nn.Module, blocks, x: torch.Tensor, seed: int) -> tuple[int, int, torch.Tensor]:
    """(activation peak bytes, block forwards, loss) of one forward + backward of ``model``."""
    counter = ForwardCounter(blocks)
    tracker = ActivationPeak()
    tracker.track_external(model, x)
    try:
        torch.manual_seed(seed)
        with tracker:
            loss = first(model(x)).sum()
            loss.backward()
    finally:
        counter.remove()
    return tracker.activation_peak, counter.count, loss.detach()
