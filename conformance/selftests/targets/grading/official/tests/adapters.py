from __future__ import annotations

import torch


def get_flashattention_autograd_function_pytorch() -> type:
    """Returns a torch.autograd.Function subclass implementing FlashAttention-2."""
    raise NotImplementedError


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    """Returns the module wrapped for data-parallel training."""
    raise NotImplementedError


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """Called after the backward pass."""
    raise NotImplementedError


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Returns the module wrapped for fully sharded data-parallel training."""
    raise NotImplementedError


def get_sharded_optimizer(params, optimizer_cls: type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    """Returns an optimizer whose state is sharded across ranks."""
    raise NotImplementedError
