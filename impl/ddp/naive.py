"""NaiveDDP: after backward, one blocking all-reduce per parameter gradient.

The plainest correct wrapper and the slowest: nothing overlaps the backward pass and
every parameter pays one collective's latency.  Parameters are reduced in reverse
registration order; a gradient missing on this rank is reduced as zeros, and one more
collective of presence flags decides whether it ends up zero-averaged or None.
"""

from __future__ import annotations

import torch

from . import comm
from .base import DataParallelBase


class NaiveDDP(DataParallelBase):
    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        params = list(reversed(self._params))
        local = self._local_presence(params)
        reduced = []
        for param, present in zip(params, local):
            grad = param.grad if present else torch.zeros_like(param)
            comm.average_(grad)
            reduced.append(grad)
        present_anywhere = self._global_presence(local, self._launch_presence(local).wait())
        for param, here, anywhere, grad in zip(params, local, present_anywhere, reduced):
            if not here and anywhere:
                param.grad = grad  # others had a gradient: this rank's zero was averaged in
