"""FlatDDP: after backward, one all-reduce of all gradients flattened into one buffer.

One collective instead of one per parameter (latency paid once), still nothing
overlapped with the backward pass, plus a copy in and a copy out.  The buffer holds the
gradients in reverse registration order followed by one presence flag per parameter, so
the None-vs-zero rule for missing gradients costs no extra collective.  Parameters of
different dtypes get one buffer (and one collective) per dtype.
"""

from __future__ import annotations

import torch

from . import comm
from .base import DataParallelBase


class FlatDDP(DataParallelBase):
    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        params = list(reversed(self._params))
        groups: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in params:
            groups.setdefault(p.dtype, []).append(p)
        for dtype, group in groups.items():
            self._reduce_group(group, dtype)

    def _reduce_group(self, params, dtype) -> None:
        local = self._local_presence(params)
        pieces = [p.grad.reshape(-1) if here else torch.zeros(p.numel(), dtype=dtype, device=p.device) for p, here in zip(params, local)]
        flags = torch.tensor([1.0 if f else 0.0 for f in local], dtype=dtype, device=self.device)
        flat = torch.cat(pieces + [flags])
        comm.average_(flat)
        anywhere = self._global_presence(local, flat[-len(params):])
        offset = 0
        for p, here, there in zip(params, local, anywhere):
            chunk = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            if here:
                p.grad.copy_(chunk)
            elif there:
                p.grad = chunk.clone()
