from fixture_basics import items
from torch.utils.data import DistributedSampler


def sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
    return DistributedSampler(items(dataset_len), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                              drop_last=drop_last)
