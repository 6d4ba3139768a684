"""Hypothesis strategies for checkpointing cases: N blocks, a strategy, k, the block's size."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

CHECKPOINTED = ("every", "segments", "sqrt", "nested")


@dataclass(frozen=True)
class StackCase:
    n: int
    strategy: str
    k: int | None
    rows: int
    d: int
    h: int
    p: float
    seed: int
    input_requires_grad: bool = True


@st.composite
def stack_cases(draw, min_n=1, max_n=24, strategies=CHECKPOINTED, p=(0.0, 0.25, 0.5), input_grad=(True,)):
    n = draw(st.integers(min_n, max_n))
    strategy = draw(st.sampled_from(strategies))
    k = draw(st.integers(1, n)) if strategy == "segments" else None
    d = draw(st.integers(2, 6))
    return StackCase(n, strategy, k, rows=draw(st.integers(1, 3)), d=d, h=draw(st.integers(2, 4)) * d,
                     p=draw(st.sampled_from(p)), seed=draw(st.integers(0, 2**20)),
                     input_requires_grad=draw(st.sampled_from(input_grad)))


@dataclass(frozen=True)
class BadRequest:
    n: int
    strategy: str
    k: object
    words: str  # what the error must name


@st.composite
def bad_requests(draw):
    n = draw(st.integers(1, 8))
    kind = draw(st.sampled_from(["name", "k0", "kneg", "kbig"]))
    if kind == "name":
        return BadRequest(n, draw(st.sampled_from(["Every", "sqrtn", "segment", ""])), None, "strategy")
    if kind == "k0":
        return BadRequest(n, "segments", 0, "segment_size")
    if kind == "kneg":
        return BadRequest(n, "segments", draw(st.integers(-5, -1)), "segment_size")
    return BadRequest(n, "segments", n + draw(st.integers(1, 4)), "segment_size")
