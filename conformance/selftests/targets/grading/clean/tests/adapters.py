from __future__ import annotations

import torch


def get_flashattention_autograd_function_pytorch() -> type:
    import clean_systems  # noqa: F401 - imported when asked, as many solutions do: reads its metadata

    raise NotImplementedError


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    raise NotImplementedError


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    raise NotImplementedError


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    raise NotImplementedError


def get_sharded_optimizer(params, optimizer_cls: type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    raise NotImplementedError


def get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
    from clean_systems.sampler import sampler  # imported when asked: reads the package's metadata then

    return sampler(dataset_len, num_replicas, rank, shuffle, seed, drop_last)
