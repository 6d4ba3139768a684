"""torch's DistributedDataParallel as a target: the known-good data-parallel wrapper.

``--target conformance.adapters.torch_ddp`` checks it with the DDP laws and spec cases.
The CS336 names map onto DDP's own knobs:

    get_ddp_individual_parameters(module)   DDP with a 1-byte bucket cap: one parameter a bucket
    get_ddp_bucketed(module, bucket_size_mb) DDP(bucket_cap_mb=bucket_size_mb)
    get_ddp(module)                          DDP with its defaults (25 MiB buckets)
    *_on_after_backward, *_on_train_batch_start   no-ops: DDP finishes its reduction inside
                                             backward()

Settings, and why:
- ``find_unused_parameters=True``: the random models have a branch that some ranks (or
  all) skip in a step; DDP then marks those parameters ready with zero gradients and
  leaves ``.grad`` untouched (None) for parameters no rank used.
- the stock ``allreduce_hook`` comm hook (divide by world size, then all-reduce sum: what
  DDP does by default), registered explicitly so that its ``torch.distributed.all_reduce``
  calls are visible to the overlap law's observer; the C++ reducer's own all-reduce is not.
- parameters on ``cuda:<rank>`` get ``device_ids=[rank]``; on the CPU none.
"""

from __future__ import annotations

INDIVIDUAL_BUCKET_MB = 1 / (1 << 20)  # one byte: every parameter overflows it


def _ddp(module, bucket_cap_mb=None):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    device = next(module.parameters()).device
    model = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        find_unused_parameters=True,
    )
    model.register_comm_hook(None, allreduce_hook)
    return model


def get_ddp_individual_parameters(module):
    return _ddp(module, INDIVIDUAL_BUCKET_MB)


def ddp_individual_parameters_on_after_backward(model, optimizer):
    pass


def get_ddp_bucketed(module, bucket_size_mb):
    return _ddp(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(model, optimizer):
    pass


def ddp_bucketed_on_train_batch_start(model, optimizer):
    pass


def get_ddp(module):
    return _ddp(module)


def ddp_on_after_backward(model, optimizer):
    pass
