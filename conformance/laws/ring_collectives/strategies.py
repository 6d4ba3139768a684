"""Hypothesis strategies for ring-collective cases."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

OPS = ("ring_all_reduce", "ring_all_gather", "ring_reduce_scatter", "ring_all_reduce_alternate")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RingCase:
    op: str  # one of OPS, or "all": the four in turn
    world_size: int
    shape: tuple
    dtype: str
    seed: int
    members: tuple = ()  # a subgroup of these global ranks (empty: the default group)
    shapes: tuple = ()  # per group rank shapes (mismatch cases only)
    layout: str = "contiguous"  # "strided": each rank's tensor handed over as a non-contiguous view


@st.composite
def ring_cases(draw, worlds=(1, 2, 3, 4), dtypes=tuple(DTYPES), ops=("all",)):
    w = draw(st.sampled_from(worlds))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    return RingCase(draw(st.sampled_from(ops)), w, shape, draw(st.sampled_from(dtypes)), draw(st.integers(0, 2**20)))


@st.composite
def subgroup_cases(draw):
    case = draw(ring_cases(worlds=(3, 4), dtypes=("int64", "float32")))
    members = tuple(sorted(draw(st.sets(st.integers(0, case.world_size - 1), min_size=2,
                                        max_size=case.world_size - 1))))
    return RingCase(case.op, case.world_size, case.shape, case.dtype, case.seed, members=members)


@st.composite
def mismatch_cases(draw):
    w = draw(st.sampled_from((2, 3)))
    base = tuple(draw(st.lists(st.integers(1, 4), min_size=2, max_size=2)))
    odd = draw(st.sampled_from([base[::-1], (base[0] + 1, base[1]), (base[0] * base[1],)]).filter(lambda s: s != base))
    who = draw(st.integers(0, w - 1))
    shapes = tuple(odd if r == who else base for r in range(w))
    return RingCase(draw(st.sampled_from(OPS)), w, base, "float32", draw(st.integers(0, 2**20)), shapes=shapes)
