"""Optimizer-state sharding (ZeRO stage 1).

    optimizer   ShardedOptimizer: each rank steps the parameters it owns
    param_sync  how updated parameters reach every rank (broadcast, all-gather rounds)
"""

from .optimizer import ShardedOptimizer

__all__ = ["ShardedOptimizer"]
