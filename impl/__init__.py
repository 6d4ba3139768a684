"""This project's own implementations, exposed through the target protocol.

The functions below carry the CS336 assignment 2 adapter names (2025 and 2026 releases),
so ``impl`` is the default target of every check.  Modules:

    attention   eager reference, FlashAttention-2 in PyTorch tiles and in Triton
    ddp         data-parallel wrappers: naive, flat, overlapped, bucketed
    zero        optimizer-state sharding (ZeRO-1)

Every package knows nothing of the suite: it imports torch, triton and itself only.
"""

from __future__ import annotations


# --- attention ----------------------------------------------------------------------


def get_flashattention_autograd_function_pytorch():
    from .attention.flash_pytorch import FlashAttentionPytorch

    return FlashAttentionPytorch


def get_flashattention_autograd_function_triton():
    from .attention.flash_triton import FlashAttentionTriton

    return FlashAttentionTriton


# --- data parallelism (2025 names) --------------------------------------------------


def get_ddp_individual_parameters(module):
    from .ddp import OverlappedIndividualDDP

    return OverlappedIndividualDDP(module)


def ddp_individual_parameters_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def get_ddp_bucketed(module, bucket_size_mb):
    from .ddp import BucketedDDP

    return BucketedDDP(module, bucket_size_mb=bucket_size_mb)


def ddp_bucketed_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(model, optimizer):
    model.on_train_batch_start()


# --- data parallelism (2026 names) --------------------------------------------------


def get_ddp(module):
    from .ddp import BucketedDDP

    return BucketedDDP(module)


def ddp_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def get_fsdp(module, compute_dtype=None):
    raise NotImplementedError("impl does not offer FSDP yet")


def fsdp_on_after_backward(model, optimizer):
    raise NotImplementedError("impl does not offer FSDP yet")


def fsdp_gather_full_params(model):
    raise NotImplementedError("impl does not offer FSDP yet")


# --- optimizer-state sharding -------------------------------------------------------


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    from .zero import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_cls, **kwargs)
