"""Cases of the pipeline laws, as Hypothesis strategies (pure functions of their arguments).

``ScheduleCase``: a schedule name, p stages, m micro-batches (m < p included), the time a
forward and a backward take in the simulation.  ``PipelineCase``: a model cut into
``world_size`` stages and a batch cut into micro-batches, for the runs on ranks; with
``members``, into one stage per member of a process group of those global ranks (the other
ranks of the world take no part), whose group ranks differ from their global ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from conformance.harness import available_world_sizes, pinned_world_size

SCHEDULE_NAMES = ("afab", "1f1b")
MAX_WORLD_SIZE = 4


@dataclass(frozen=True)
class ScheduleCase:
    name: str
    n_stages: int
    n_microbatches: int
    forward_cost: int = 1
    backward_cost: int = 1


@dataclass(frozen=True)
class PipelineCase:
    world_size: int
    model: str  # "mlp" or "gpt"
    n_layers: int
    width: int
    batch: int
    n_microbatches: int
    seed: int
    steps: int = 1  # accumulation steps: the batch is cut into this many pipeline steps
    seq: int = 4  # gpt only
    dtype: str = "float32"  # the stages' parameters, inputs and so every activation and gradient sent
    members: tuple = ()  # global ranks of the pipeline's group, stage i on members[i]; () the world

    @property
    def n_stages(self) -> int:
        return len(self.members) if self.members else self.world_size


def schedule_cases(names=SCHEDULE_NAMES, max_stages: int = 8, max_microbatches: int = 12, costs=(1, 1)):
    """Small p and m, often m < p; forward and backward costs from 1..costs."""
    return st.builds(
        ScheduleCase,
        name=st.sampled_from(names),
        n_stages=st.integers(1, max_stages),
        n_microbatches=st.integers(1, max_microbatches),
        forward_cost=st.integers(1, costs[0]),
        backward_cost=st.integers(1, costs[1]),
    )


def world_sizes(device, low: int = 1) -> st.SearchStrategy[int]:
    if pinned_world_size() is not None:
        return st.just(pinned_world_size())
    top = min(MAX_WORLD_SIZE, max(available_world_sizes(device)))
    return st.integers(min(low, top), top)


@st.composite
def pipeline_cases(draw, device, model: str = "mlp", max_microbatches: int = 6, steps=(1, 1), min_world_size: int = 1,
                   min_microbatches: int = 1, dtype: str = "float32"):
    """A stack of W..W+3 layers on W ranks; a batch of m..m+5 rows (uneven micro-batches
    most of the time); ``steps`` accumulation steps, each with its own m-way split."""
    w = draw(world_sizes(device, min_world_size))
    n_steps = draw(st.integers(*steps))
    m = draw(st.integers(min_microbatches, max_microbatches))
    extra_layers = draw(st.integers(0, 3))
    n_layers = w + extra_layers if model == "mlp" else max(w, 3) + extra_layers  # gpt: embeddings, >= 1 block, head
    return PipelineCase(
        world_size=w,
        model=model,
        n_layers=n_layers,
        width=draw(st.integers(2, 6)),
        batch=n_steps * m + draw(st.integers(0, 5)),
        n_microbatches=m,
        seed=draw(st.integers(0, 2**20)),
        steps=n_steps,
        seq=draw(st.integers(1, 6)),
        dtype=dtype,
    )


@st.composite
def subgroup_pipeline_cases(draw, device, max_microbatches: int = 4, min_microbatches: int = 1):
    """A pipeline over some ranks of a world of 3 or 4 (2 to W - 1 of them, not ranks
    0..k-1, so that some group rank is not the global rank): ranks 1 and 2 of 3, 0, 2 and 3
    of 4, ...  The pinned world size if set (fewer than 3: the law needs 3 ranks)."""
    pinned = pinned_world_size()
    world = pinned if pinned is not None else draw(st.integers(3, max(3, min(MAX_WORLD_SIZE, max(available_world_sizes(device))))))
    members = ()
    if world >= 3:
        members = draw(st.sets(st.integers(0, world - 1), min_size=2, max_size=world - 1).map(lambda s: tuple(sorted(s)))
                       .filter(lambda m: m != tuple(range(len(m)))))
    k = len(members) or world
    m = draw(st.integers(min_microbatches, max_microbatches))
    return PipelineCase(world_size=world, model="mlp", n_layers=k + draw(st.integers(0, 2)), width=draw(st.integers(2, 5)),
                        batch=m + draw(st.integers(0, 3)), n_microbatches=m, seed=draw(st.integers(0, 2**20)),
                        members=members)
