"""Uneven inputs for impl's DDP wrappers: ranks that run out of batches shadow the others.

Contract
    ``ddp_join(model)`` -> a context manager, entered on every rank of the default group
    around that rank's training loop, for ``model`` a wrapper from ``impl.ddp`` (what
    ``impl.get_ddp`` returns).  Ranks may run different numbers of batches.

    Per step, a rank that still has data calls ``model(...)`` exactly once, then backward
    and ``model.finish_gradient_synchronization()`` (synced steps only: ``no_sync`` is
    refused inside the join).  A forward pre-hook on the wrapper first takes part in a
    join round: one all-reduce (SUM) of a one-element tensor, 1 from a rank with data.
    A rank whose loop ended waits in ``__exit__``: it answers every join round with 0 and,
    while the sum is > 0, shadows the step's gradient collectives with zero gradients
    (it drops its ``.grad`` and calls ``finish_gradient_synchronization``, which counts
    missing gradients as zeros).  When a round sums to 0 every rank has joined.

The rule (what training with uneven inputs computes)
    The averaged gradient of step t is ``sum over ranks still active at step t of their
    local gradient, divided by the INITIAL world size W`` (torch's Join default,
    ``divide_by_initial_world_size=True``).  Active ranks step their optimizers with it;
    joined ranks do not step.  On exit every rank receives the parameters and buffers of
    the rank that ran the most steps (the lowest such rank): all replicas end identical.

What it communicates
    Per step, one extra all-reduce of one element; on exit, one all-gather of each rank's
    step count and one broadcast per parameter and buffer.  The wrapper itself is not
    changed: the hook is an ordinary ``register_forward_pre_hook``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


def _round(device, active: bool) -> int:
    t = torch.tensor([1 if active else 0], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t.item())


def _device(model: nn.Module) -> torch.device:
    dev = getattr(model, "device", None)
    if dev is None:
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    return dev if "nccl" in str(dist.get_backend()).lower() else torch.device("cpu")


class _Join:
    def __init__(self, model: nn.Module):
        if not hasattr(model, "finish_gradient_synchronization"):
            raise TypeError(f"ddp_join needs a DDP wrapper from impl.ddp (impl.get_ddp), got {type(model).__name__}")
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ddp_join needs an initialised default process group")
        self.model = model
        self.steps = 0
        self.device = _device(model)
        self._handle = None

    def _pre_forward(self, module, args):
        if not getattr(module, "_sync_enabled", True):
            raise RuntimeError("ddp_join: no_sync() inside a join is not supported (every forward is a synced step)")
        _round(self.device, True)
        self.steps += 1

    def __enter__(self):
        self._handle = self.model.register_forward_pre_hook(self._pre_forward)
        return self

    def _shadow_until_all_joined(self) -> None:
        while _round(self.device, False) > 0:
            for p in self.model.parameters():
                p.grad = None
            self.model.finish_gradient_synchronization()
        for p in self.model.parameters():
            p.grad = None

    @torch.no_grad()
    def _sync_final_model(self) -> None:
        w = dist.get_world_size()
        counts = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(w)]
        dist.all_gather(counts, torch.tensor([self.steps], dtype=torch.int64, device=self.device))
        steps = [int(c.item()) for c in counts]
        src = steps.index(max(steps))
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            dense = t.data if t.is_contiguous() else t.data.contiguous()
            dist.broadcast(dense, src=src)
            if dense is not t.data:
                t.data.copy_(dense)

    def __exit__(self, exc_type, exc, tb):
        self._handle.remove()
        if exc_type is not None:
            return False  # the others would wait for us forever anyway; let the error out
        self._shadow_until_all_joined()
        self._sync_final_model()
        return False


def ddp_join(model: nn.Module) -> contextlib.AbstractContextManager:
    return _Join(model)
