"""torch's ``DistributedSampler`` as a target for the sampler laws.

``--target conformance.adapters.torch_sampler``:

    get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False)
        ``torch.utils.data.DistributedSampler(range(dataset_len), num_replicas, rank,
        shuffle, seed, drop_last)``: it needs only ``len`` of the dataset.

torch has no join for impl's DDP wrappers (its ``Join`` takes torch's own DDP), so
``ddp_join`` is not offered: the uneven-inputs extra reads "not offered" for this target.
"""

from __future__ import annotations

from torch.utils.data import DistributedSampler


def get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
    return DistributedSampler(range(dataset_len), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                              drop_last=drop_last)
