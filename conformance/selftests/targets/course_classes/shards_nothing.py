"""An FSDP that wraps the model and shards nothing (every rank keeps every parameter)."""

from __future__ import annotations


def get_fsdp(module, compute_dtype=None):
    from impl.fsdp import FSDP

    return FSDP(module, strategy="NO_SHARD", compute_dtype=compute_dtype)


def fsdp_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def fsdp_gather_full_params(model):
    return model.gather_full_params()
