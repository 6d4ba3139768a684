"""Hypothesis strategies for the context-parallel laws: small named pieces, pure functions
of their arguments.  A case is a description (sizes, flags, a seed); tensors are made from
the seed, so a failing case prints enough to rebuild its inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from conformance.harness import available_world_sizes, pinned_world_size

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
MAX_WORLD_SIZE = 4
LAYOUTS = ("contiguous", "zigzag")


def _dtype_repr(dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype))


# --- merge cases (one process) ---------------------------------------------------------


@dataclass(frozen=True)
class MergeCase:
    batch: tuple[int, ...]
    n_q: int
    n_k: int
    d: int
    dtype: torch.dtype  # of the partial O (L is float32)
    value_scale: float  # std of q and k: large values give scores (and L) in the hundreds
    cuts: tuple[int, ...]  # key block boundaries, strictly increasing inside (0, n_k)
    order: tuple[int, ...]  # a permutation of the blocks: the order they are merged in
    tree: tuple[int, ...]  # merge shape: at each merge, the index in the running list to combine with its right neighbour
    masked_block: int  # a block whose keys every row is denied (a fully masked block); -1: none
    mask_density: float  # fraction of other (row, key) pairs masked at random
    seed: int

    def __repr__(self):
        return (f"MergeCase(batch={self.batch}, n_q={self.n_q}, n_k={self.n_k}, d={self.d}, dtype={_dtype_repr(self.dtype)}, "
                f"value_scale={self.value_scale}, cuts={self.cuts}, order={self.order}, tree={self.tree}, "
                f"masked_block={self.masked_block}, mask_density={self.mask_density}, seed={self.seed})")

    @property
    def blocks(self) -> list[tuple[int, int]]:
        edges = (0, *self.cuts, self.n_k)
        return list(zip(edges[:-1], edges[1:]))


@st.composite
def merge_cases(draw, dtypes=(torch.float32, torch.float16, torch.bfloat16), max_blocks=5):
    n_k = draw(st.integers(2, 24))
    n_blocks = draw(st.integers(2, min(max_blocks, n_k)))
    cuts = tuple(sorted(draw(st.sets(st.integers(1, n_k - 1), min_size=n_blocks - 1, max_size=n_blocks - 1))))
    order = tuple(draw(st.permutations(range(n_blocks))))
    tree = tuple(draw(st.integers(0, n_blocks - 2 - i)) for i in range(n_blocks - 1))
    return MergeCase(
        batch=draw(st.sampled_from([(1,), (2,), (2, 3)])),
        n_q=draw(st.integers(1, 12)),
        n_k=n_k,
        d=draw(st.sampled_from([1, 4, 8, 16])),
        dtype=draw(st.sampled_from(dtypes)),
        value_scale=draw(st.sampled_from([0.5, 1.0, 4.0, 30.0])),
        cuts=cuts,
        order=order,
        tree=tree,
        masked_block=draw(st.integers(-1, n_blocks - 1)),
        mask_density=draw(st.sampled_from([0.0, 0.3])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@dataclass(frozen=True)
class PartialCase:
    batch: tuple[int, ...]
    n: int
    d: int
    dtype: torch.dtype
    lse_scale: float  # partial L values drawn around this size (up to 1e4: exp would overflow)
    masked_rows: float  # fraction of rows whose partial is fully masked (O = 0, L = -inf)
    seed: int

    def __repr__(self):
        return (f"PartialCase(batch={self.batch}, n={self.n}, d={self.d}, dtype={_dtype_repr(self.dtype)}, "
                f"lse_scale={self.lse_scale}, masked_rows={self.masked_rows}, seed={self.seed})")


@st.composite
def partial_cases(draw, dtypes=(torch.float32, torch.float16, torch.bfloat16)):
    return PartialCase(
        batch=draw(st.sampled_from([(1,), (3,), (2, 2)])),
        n=draw(st.integers(1, 16)),
        d=draw(st.sampled_from([1, 3, 8])),
        dtype=draw(st.sampled_from(dtypes)),
        lse_scale=draw(st.sampled_from([1.0, 50.0, 1e4])),
        masked_rows=draw(st.sampled_from([0.0, 0.5, 1.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# --- layout cases (one process) --------------------------------------------------------


@dataclass(frozen=True)
class LayoutCase:
    world_size: int
    layout: str
    chunk: int  # tokens per chunk
    shape: tuple[int, ...]  # the tensor's shape with the sequence at ``dim``
    dim: int
    seed: int

    @property
    def seq_len(self) -> int:
        return self.shape[self.dim]


@st.composite
def layout_cases(draw):
    world_size = draw(st.integers(1, 8))
    layout = draw(st.sampled_from(LAYOUTS))
    chunk = draw(st.integers(1, 6))
    n = chunk * world_size * (1 if layout == "contiguous" else 2)
    lead = draw(st.sampled_from([(), (2,), (2, 3)]))
    trail = draw(st.sampled_from([(), (4,), (3, 2)]))
    dim = len(lead)
    return LayoutCase(world_size, layout, chunk, (*lead, n, *trail), draw(st.sampled_from([dim, dim - len(lead) - len(trail) - 1])),
                      draw(st.integers(0, 2**31 - 1)))


# --- ring cases (on ranks) ---------------------------------------------------------------


@dataclass(frozen=True)
class RingCase:
    world_size: int
    layout: str
    is_causal: bool
    batch: tuple[int, ...]
    chunk: int  # tokens per layout chunk: the local shard holds 1 (contiguous) or 2 (zigzag)
    d: int
    dtype: torch.dtype
    value_scale: float
    seed: int
    members: tuple[int, ...] = ()  # a subgroup of these global ranks of the pool (empty: the default group)

    def __repr__(self):
        group = f", members={self.members}" if self.members else ""
        return (f"RingCase(W={self.world_size}{group}, layout={self.layout!r}, is_causal={self.is_causal}, "
                f"batch={self.batch}, chunk={self.chunk}, N={self.seq_len}, d={self.d}, dtype={_dtype_repr(self.dtype)}, "
                f"value_scale={self.value_scale}, seed={self.seed})")

    @property
    def group_size(self) -> int:
        """Ranks the sequence is sharded over: the subgroup's, else the world's."""
        return len(self.members) if self.members else self.world_size

    @property
    def seq_len(self) -> int:
        return self.chunk * self.group_size * (1 if self.layout == "contiguous" else 2)

    @property
    def n_local(self) -> int:
        return self.seq_len // self.group_size

    def make(self):
        """(q, k, v, dO) of the whole sequence in the case dtype (on the CPU), same on every rank."""
        g = torch.Generator().manual_seed(self.seed)
        stds = (self.value_scale, self.value_scale, 1.0, 1.0)
        return tuple((torch.randn(*self.batch, self.seq_len, self.d, generator=g, dtype=torch.float64) * s).to(self.dtype)
                     for s in stds)


def world_sizes(device, min_world: int = 1) -> st.SearchStrategy[int]:
    if pinned_world_size() is not None:
        return st.just(pinned_world_size())
    top = min(MAX_WORLD_SIZE, max(available_world_sizes(device)))
    return st.integers(min(min_world, top), top)


@st.composite
def ring_cases(draw, device="cpu", *, min_world=1, dtypes=(torch.float32,), layouts=LAYOUTS, causal=(False, True),
               max_chunk=8, d_choices=(4, 8, 16, 32)):
    return RingCase(
        world_size=draw(world_sizes(device, min_world)),
        layout=draw(st.sampled_from(layouts)),
        is_causal=draw(st.sampled_from(causal)),
        batch=draw(st.sampled_from([(1,), (2,), (2, 2)])),
        chunk=draw(st.integers(1, max_chunk)),
        d=draw(st.sampled_from(d_choices)),
        dtype=draw(st.sampled_from(dtypes)),
        value_scale=draw(st.sampled_from([0.5, 1.0, 3.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


SUBGROUP_WORLDS = (3, 4)  # a subgroup that is neither the world nor its first ranks needs 3 ranks at least


def _renumbered(members) -> bool:
    """Whether the members' group ranks differ from their global ranks (not 0, 1, ...)."""
    return tuple(members) != tuple(range(len(members)))


@st.composite
def subgroup_ring_cases(draw, device="cpu"):
    """Ring cases on a subgroup of the pool whose group ranks are not its global ranks
    (ranks 1 and 3 of 4, say): code that confuses the two talks to the wrong ranks."""
    pinned = pinned_world_size()
    top = max(SUBGROUP_WORLDS[0], min(MAX_WORLD_SIZE, max(available_world_sizes(device))))
    world = pinned if pinned is not None and pinned >= SUBGROUP_WORLDS[0] else draw(st.integers(SUBGROUP_WORLDS[0], top))
    members = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=world - 1, unique=True)
                   .map(lambda m: tuple(sorted(m))).filter(_renumbered))
    case = draw(ring_cases(device, max_chunk=4))
    return RingCase(world, case.layout, case.is_causal, case.batch, case.chunk, case.d, case.dtype, case.value_scale,
                    case.seed, members=members)
