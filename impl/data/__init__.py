"""Data partitioning for data-parallel training.

    sampler  DistributedSampler: each rank's share of the dataset indices per epoch
    join     ddp_join(model): ranks with different numbers of batches finish together
"""

from .join import ddp_join
from .sampler import DistributedSampler

__all__ = ["DistributedSampler", "ddp_join"]
