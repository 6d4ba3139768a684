"""Fully sharded data parallelism: ZeRO-3 / ZeRO-2 / DDP / hybrid sharding, mixed precision.

    wrapper   FSDP: the module wrapper (its docstring is the contract)
    comm      the collectives it issues, looked up on torch.distributed at call time
"""

from .wrapper import FSDP, STRATEGIES

__all__ = ["FSDP", "STRATEGIES"]
