"""Data-parallel training wrappers: naive, flat, overlapped individual, bucketed.

Every wrapper is a ``torch.nn.Module`` around a user module and shares this contract.

Process group
    The default ``torch.distributed`` process group must be initialised (gloo on the CPU,
    NCCL on GPUs).  All parameters of the wrapped module live on one device.

Wrapping
    ``Wrapper(module)`` broadcasts rank 0's parameters AND buffers to every rank (in
    place, frozen parameters included), so replicas start identical.

Entry points
    ``forward(*args, **kwargs)``         calls the wrapped module.
    ``on_train_batch_start()``            checks that no synchronisation is still in flight
                                          and resets per-step bookkeeping (cheap).
    ``finish_gradient_synchronization()`` call after every synced backward, before the
                                          optimizer step: waits for the collectives and
                                          leaves the averaged gradients in ``param.grad``.
                                          Inside ``no_sync()`` it does nothing.
    ``no_sync()``                         context manager: backward passes inside it
                                          communicate nothing; gradients accumulate locally
                                          and the next synced backward reduces the sums.

What a synced step leaves in ``param.grad``
    The average over ranks, ``sum_r g_r / world_size``: one all-reduce (sum) then one
    division (NCCL: ``ReduceOp.AVG`` in the collective), so every rank holds the same bits.
    - ``requires_grad=False`` parameters are never hooked, never reduced, never touched.
    - A parameter registered under several names (tied weights) is reduced once.
    - A parameter that got no gradient on some rank in this step counts as a zero
      gradient there, so every rank issues the same collectives in the same order (no
      hang).  If no rank produced a gradient for it, its ``.grad`` stays None, exactly as
      a single process trained on the whole batch would leave it.  (Each collective
      carries one presence flag per parameter to decide this.)
    - Loss scaling is the caller's business: averaging gradients of per-rank losses
      equals the full-batch gradient when each rank's loss is
      ``world_size / global_batch * sum(per-sample losses)``.

Collective order
    Every wrapper issues its collectives in one fixed order (reverse registration order
    of the parameters), whatever order the gradients become ready in: a unit whose
    gradients are ready waits for the units before it.  On a rank where some parameter
    gets no gradient the units from that one on are launched by
    ``finish_gradient_synchronization`` instead (correct, less overlap there).

Modules
    base        the shared wrapper: broadcast, parameter bookkeeping, no_sync, presence
    comm        averaging collectives and the CUDA communication stream
    naive       NaiveDDP: one all-reduce per parameter after backward
    flat        FlatDDP: one all-reduce of all gradients flattened, after backward
    overlapped  OverlappedIndividualDDP: one async all-reduce per parameter from its hook
    bucketed    BucketedDDP: async all-reduce per bucket of parameters, gradients as views
"""

from .base import DataParallelBase
from .bucketed import BucketedDDP, plan_buckets
from .flat import FlatDDP
from .naive import NaiveDDP
from .overlapped import OverlappedIndividualDDP

__all__ = [
    "DataParallelBase",
    "NaiveDDP",
    "FlatDDP",
    "OverlappedIndividualDDP",
    "BucketedDDP",
    "plan_buckets",
]
