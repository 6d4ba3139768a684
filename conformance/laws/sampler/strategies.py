"""Cases of the sampler laws, as Hypothesis strategies.

``SamplerCase``: a dataset of N items shared by R replicas, shuffled or not, a seed, an
epoch, drop_last.  N runs from 0 to a few times R, so divisible and ragged sizes, N < R
and N = 0 all come up.  ``UnevenCase``: per-rank batch counts for the join law.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from conformance.harness import available_world_sizes, pinned_world_size

MAX_WORLD_SIZE = 4
# The epoch law needs orders long enough that two epochs' permutations are told apart:
# at N >= 12 a uniform shuffle repeats a given order with probability 1/12! < 2.1e-9.
MIN_LEN_FOR_REORDER = 12


@dataclass(frozen=True)
class SamplerCase:
    dataset_len: int
    num_replicas: int
    shuffle: bool
    seed: int
    epoch: int
    drop_last: bool


def sampler_cases(shuffle=(True, False), min_len: int = 0, max_len: int = 40, drop_last=(False, True),
                  ragged: bool = False):
    """``ragged``: N % R != 0 only (where drop_last drops something)."""
    cases = st.builds(
        SamplerCase,
        dataset_len=st.integers(min_len, max_len),
        num_replicas=st.integers(2 if ragged else 1, 8),
        shuffle=st.sampled_from(shuffle),
        seed=st.integers(0, 2**31),
        epoch=st.integers(0, 50),
        drop_last=st.sampled_from(drop_last),
    )
    return cases.filter(lambda c: c.dataset_len % c.num_replicas) if ragged else cases


@dataclass(frozen=True)
class UnevenCase:
    world_size: int
    batches: tuple[int, ...]  # per rank
    width: int
    rows: int  # rows per batch
    lr: float
    seed: int


def world_sizes(device, low: int = 2):
    if pinned_world_size() is not None:
        return st.just(pinned_world_size())
    top = min(MAX_WORLD_SIZE, max(available_world_sizes(device)))
    return st.integers(min(low, top), top)


@st.composite
def uneven_cases(draw, device):
    """W ranks with 0..4 batches each, at least two counts differing when W > 1."""
    w = draw(world_sizes(device))
    batches = draw(st.lists(st.integers(0, 4), min_size=w, max_size=w).filter(lambda b: w == 1 or len(set(b)) > 1))
    return UnevenCase(w, tuple(batches), draw(st.integers(2, 5)), draw(st.integers(1, 3)),
                      draw(st.sampled_from([0.5, 0.25, 0.1])), draw(st.integers(0, 2**20)))
