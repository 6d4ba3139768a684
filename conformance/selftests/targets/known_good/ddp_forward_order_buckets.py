"""A correct bucketed data-parallel wrapper of another design: buckets packed in forward order.

Known-good target for all three flavours: ``get_ddp_individual_parameters`` (a bucket per
parameter), ``get_ddp_bucketed(module, bucket_size_mb)`` and ``get_ddp`` (a 25 MiB cap, as
torch's DDP).  Its choices differ from impl's where a correct bucketed DDP may choose:

- layout: parameters are grouped by (dtype, device) first, and each group is packed
  greedily in registration (forward) order, not reverse order; a bucket closes once the
  next parameter would take it past the cap, and a parameter larger than the cap gets a
  bucket of its own (None: one bucket per group);
- launch order: fixed, from the last bucket of the packing to the first (about the
  order backward fills them), so every rank issues the same collectives in the same
  order whatever order its gradients arrive in; a full bucket waits for the buckets
  ahead of it in that order;
- each bucket has its own flat buffer, filled when the bucket launches; the all-reduce
  sums and ``on_after_backward`` divides by the world size and copies the result back
  into ``.grad`` (no gradient views into the buffer);
- a parameter without a gradient on this rank sends zeros and a count of 0; where no
  rank had a gradient ``.grad`` stays None.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from conformance.selftests.targets.known_good.ddp_flat_after_backward import broadcast_state_from_rank0

MIB = 1 << 20
DEFAULT_CAP_MB = 25.0  # get_ddp takes no size; torch's DDP default


def pack_forward_order(params: list[nn.Parameter], cap_bytes: float | None) -> list[list[nn.Parameter]]:
    """Buckets of one (dtype, device) each, in registration order, at most ``cap_bytes`` unless single."""
    groups: dict[tuple, list[nn.Parameter]] = {}
    for p in params:
        groups.setdefault((p.dtype, p.device), []).append(p)
    buckets = []
    for group in groups.values():
        current, size = [], 0
        for p in group:
            nbytes = p.numel() * p.element_size()
            if current and cap_bytes is not None and size + nbytes > cap_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        buckets.append(current)
    return buckets


class _Bucket:
    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.ready: set[int] = set()
        self.flat = None
        self.work = None

    def launch(self) -> None:
        p0 = self.params[0]
        parts = [p.grad.reshape(-1) if p.grad is not None else p0.new_zeros(p.numel()) for p in self.params]
        counts = p0.new_tensor([float(p.grad is not None) for p in self.params])
        self.flat = torch.cat(parts + [counts])
        self.work = dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, async_op=True)

    @torch.no_grad()
    def finish(self, world: int) -> None:
        self.work.wait()
        n = len(self.params)
        counts = self.flat[self.flat.numel() - n:].tolist()
        offset = 0
        for p, had in zip(self.params, counts):
            averaged = self.flat[offset : offset + p.numel()].view_as(p) / world
            offset += p.numel()
            if had == 0:
                p.grad = None
            elif p.grad is None:
                p.grad = averaged
            else:
                p.grad.copy_(averaged)
        self.ready.clear()
        self.flat = self.work = None


class ForwardOrderBucketDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None):
        super().__init__()
        self.module = module
        broadcast_state_from_rank0(module)
        trainable = [p for p in module.parameters() if p.requires_grad]
        cap = None if bucket_size_mb is None else bucket_size_mb * MIB
        # launch order: the packing's last bucket first
        self._buckets = [_Bucket(b) for b in reversed(pack_forward_order(trainable, cap))]
        self._next = 0  # index of the next bucket to launch in launch order
        for bucket in self._buckets:
            for i, p in enumerate(bucket.params):
                p.register_post_accumulate_grad_hook(lambda _p, b=bucket, i=i: self._on_grad_ready(b, i))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, bucket: _Bucket, index: int) -> None:
        bucket.ready.add(index)
        while self._next < len(self._buckets):
            head = self._buckets[self._next]
            if len(head.ready) < len(head.params):
                return
            head.launch()
            self._next += 1

    def finish_gradient_synchronization(self) -> None:
        for bucket in self._buckets[self._next:]:  # gradients some parameters never got this step
            bucket.launch()
        world = dist.get_world_size()
        for bucket in self._buckets:
            bucket.finish(world)
        self._next = 0


def get_ddp_individual_parameters(module: nn.Module) -> nn.Module:
    return ForwardOrderBucketDDP(module, bucket_size_mb=0.0)


def ddp_individual_parameters_on_after_backward(model, optimizer) -> None:
    model.finish_gradient_synchronization()


def get_ddp_bucketed(module: nn.Module, bucket_size_mb: float | None) -> nn.Module:
    return ForwardOrderBucketDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(model, optimizer) -> None:
    model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(model, optimizer) -> None:
    pass


def get_ddp(module: nn.Module) -> nn.Module:
    return ForwardOrderBucketDDP(module, DEFAULT_CAP_MB)


def ddp_on_after_backward(model, optimizer) -> None:
    model.finish_gradient_synchronization()
