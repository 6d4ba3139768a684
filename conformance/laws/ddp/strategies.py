"""Hypothesis strategies for the data-parallel laws (pure functions of their arguments)."""

from __future__ import annotations

from hypothesis import note
from hypothesis import strategies as st

from conformance.harness import available_world_sizes, pinned_world_size

from .spy import MAX_CPU_WORLD, MIB
from .model import ModelSpec, RandomMLP
from .cases import OPTIMIZERS, PRECISIONS, StepPlan, TrainingCase


def max_world_size() -> int:
    pinned = pinned_world_size()
    return pinned if pinned is not None else min(MAX_CPU_WORLD, max(available_world_sizes()))


def model_specs(*, tied=st.booleans(), frozen=st.booleans(), branch=st.booleans(), min_depth=1, max_depth=3):
    return st.builds(
        ModelSpec,
        d_in=st.integers(1, 6),
        widths=st.lists(st.integers(1, 8), min_size=min_depth, max_size=max_depth).map(tuple),
        d_out=st.integers(1, 4),
        bias=st.booleans(),
        tied=tied,
        frozen=frozen,
        branch=branch,
    )


def rank_splits(world_size: int, max_rows: int = 5):
    """Rows per rank for one micro-batch: uneven, at least one each."""
    return st.lists(st.integers(1, max_rows), min_size=world_size, max_size=world_size).map(tuple)


def step_plans(world_size: int, micro_batches=st.just(1)):
    branch_p = st.sampled_from((0.0, 0.3, 1.0))  # unused by all, by some ranks, used by all
    return micro_batches.flatmap(
        lambda m: st.builds(StepPlan, micro_splits=st.lists(rank_splits(world_size), min_size=m, max_size=m).map(tuple), branch_p=branch_p)
    )


def bucket_sizes_mb():
    """From one parameter per bucket (1 byte) through mixed buckets to unbounded."""
    return st.one_of(st.just(1e-6), st.floats(1e-5, 2e-3), st.just(1e3))


def world_sizes(min_world: int = 1):
    top = max_world_size()
    if pinned_world_size() is not None:
        return st.just(top)
    return st.integers(min(min_world, top), top)


@st.composite
def training_cases(draw, *, first_step_micro_batches=st.just(1), steps=st.integers(1, 3), model=None, min_world=1):
    world = draw(world_sizes(min_world))
    n_steps = draw(steps)
    plans = [draw(step_plans(world, first_step_micro_batches))]
    plans += [draw(step_plans(world)) for _ in range(n_steps - 1)]
    case = TrainingCase(
        model=draw(model if model is not None else model_specs()),
        world_size=world,
        steps=tuple(plans),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        lr=draw(st.sampled_from((0.05, 0.01))),
        precision=draw(st.sampled_from(PRECISIONS)),
        bucket_size_mb=draw(bucket_sizes_mb()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    note(repr(case))
    return case


def no_sync_cases(min_world: int = 1):
    """m >= 2 micro-batches in the first step (m-1 under no_sync), then a plain step."""
    return training_cases(first_step_micro_batches=st.integers(2, 3), steps=st.just(2), min_world=min_world)


def overlap_cases(min_world: int = 2):
    """A deep model without an optional branch, two steps (torch DDP rebuilds its buckets
    after the first), one parameter per bucket, at least two ranks."""
    return training_cases(
        steps=st.just(2),
        model=model_specs(branch=st.just(False), min_depth=3, max_depth=4),
        min_world=max(2, min_world),
    ).map(lambda c: TrainingCase(**{**c.__dict__, "bucket_size_mb": 1e-6}))


@st.composite
def layout_cases(draw, min_world: int = 1):
    spec = draw(model_specs())
    sizes = [p.numel() * p.element_size() for p in RandomMLP(spec).parameters()]
    cap_bytes = draw(st.one_of(st.just(1), st.sampled_from(sizes), st.integers(1, sum(sizes) + 1)))
    bucket_size_mb = cap_bytes / MIB
    world = draw(st.integers(min(min_world, 2, max_world_size()), min(2, max_world_size())))
    seed = draw(st.integers(0, 2**31 - 1))
    note(f"model={spec}, bucket_size_mb={bucket_size_mb!r} ({cap_bytes} bytes), world_size={world}")
    return spec, bucket_size_mb, world, seed
