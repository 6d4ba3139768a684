"""Hypothesis strategies of tensor-parallel cases: pure functions of their arguments.

A case is a frozen dataclass holding everything a rank needs to rebuild its inputs: the
world size, a seed, and the shapes.  Sizes a layer shards must be divisible by W where
the contract says so (row-parallel input features, heads, d_ff); column-parallel output
features and vocabularies are drawn both divisible and not.

A ``SubgroupCase`` runs one of these cases on a process group of some ranks of a larger
world (``members``, global ranks), whose group ranks differ from their global ranks: the
inner case's ``world_size`` is the group's size.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from conformance.harness import available_world_sizes, pinned_world_size

MAX_WORLD_SIZE = 4


def world_sizes(min_world: int = 1, fixed: int | None = None):
    if fixed is not None:  # a subgroup's size, chosen by the subgroup case
        return st.just(fixed)
    pinned = pinned_world_size()
    if pinned is not None:
        return st.just(pinned)
    top = min(MAX_WORLD_SIZE, max(available_world_sizes()))
    return st.integers(min(min_world, top), top)


seeds = st.integers(0, 2**31 - 1)
batch_shapes = st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple)


@dataclass(frozen=True)
class LinearCase:
    world_size: int
    seed: int
    batch_shape: tuple[int, ...]
    in_features: int
    out_features: int
    bias: bool
    flag: bool  # column: gather_output; row: input_is_parallel


@st.composite
def column_cases(draw, min_world: int = 1, fixed_world: int | None = None):
    w = draw(world_sizes(min_world, fixed_world))
    # output features in the chunk layout: divisible by W or not (the last shards shorter)
    return LinearCase(w, draw(seeds), draw(batch_shapes), draw(st.integers(1, 12)), draw(st.integers(w, 5 * w)),
                      draw(st.booleans()), draw(st.booleans()))


@st.composite
def row_cases(draw, min_world: int = 1, fixed_world: int | None = None):
    w = draw(world_sizes(min_world, fixed_world))
    return LinearCase(w, draw(seeds), draw(batch_shapes), w * draw(st.integers(1, 5)), draw(st.integers(1, 12)),
                      draw(st.booleans()), draw(st.booleans()))


@dataclass(frozen=True)
class EmbeddingCase:
    world_size: int
    seed: int
    vocab_size: int
    dim: int
    batch: int  # the ids: every vocabulary id once (shard boundaries included), then random ids


@st.composite
def embedding_cases(draw, min_world: int = 1, fixed_world: int | None = None):
    w = draw(world_sizes(min_world, fixed_world))
    return EmbeddingCase(w, draw(seeds), draw(st.integers(max(2, w - 1), 4 * w + 3)), draw(st.integers(1, 6)), draw(st.integers(1, 3)))


@dataclass(frozen=True)
class CrossEntropyCase:
    world_size: int
    seed: int
    vocab_size: int
    n_tokens: int
    token_shape: tuple[int, ...]
    reduction: str
    ignore_index: int
    n_ignored: int
    scale: float  # logits ~ scale * N(0, 1)
    shift: float  # added to every logit (shift-invariance law)
    dtype: str


@st.composite
def cross_entropy_cases(draw, min_world: int = 1, huge: bool = False, shifted: bool = False, fixed_world: int | None = None):
    w = draw(world_sizes(min_world, fixed_world))
    vocab = draw(st.integers(max(2, w - 1), 4 * w + 3))
    # enough tokens to put a target on both sides of every shard boundary
    n_tokens = draw(st.integers(2 * w + 2, 2 * w + 10))
    shape = draw(st.sampled_from([(n_tokens,), (1, n_tokens)] + ([(2, n_tokens // 2)] if n_tokens % 2 == 0 else [])))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    ignore_index = draw(st.sampled_from([-100, 0, vocab - 1]))
    # every token ignored is its own boundary: a mean over none is NaN, its gradient zero
    n_ignored = draw(st.one_of(st.integers(0, n_tokens // 2), st.just(n_tokens)))
    scale = draw(st.sampled_from([1e30, 1e36])) if huge else draw(st.sampled_from([1.0, 4.0]))
    shift = float(2 ** draw(st.integers(4, 14))) * draw(st.sampled_from([1, -1])) if shifted else 0.0
    dtype = "float32"
    return CrossEntropyCase(w, draw(seeds), vocab, n_tokens, shape, reduction, ignore_index, n_ignored, scale, shift, dtype)


@dataclass(frozen=True)
class BlockCase:
    world_size: int
    seed: int
    d_head: int
    n_heads: int
    d_ff: int
    batch: int
    seq: int
    sequence_parallel: bool


@st.composite
def block_cases(draw, min_world: int = 1, sequence_parallel: bool = False, fixed_world: int | None = None):
    w = draw(world_sizes(min_world, fixed_world))
    seq = w * draw(st.integers(1, 3)) if sequence_parallel else draw(st.integers(1, 6))
    return BlockCase(w, draw(seeds), draw(st.sampled_from([2, 4])), w * draw(st.integers(1, 2)), w * draw(st.integers(1, 6)),
                     draw(st.integers(1, 2)), seq, sequence_parallel)


@dataclass(frozen=True)
class ModelCase:
    world_size: int
    seed: int
    d_head: int
    n_heads: int
    d_ff: int
    n_layers: int
    vocab_size: int
    batch: int
    seq: int
    optimizer: str
    steps: int
    ignore_index: int
    sequence_parallel: bool = False


@st.composite
def model_cases(draw, min_world: int = 1, sequence_parallel: bool = False, fixed_world: int | None = None):
    w = draw(world_sizes(min_world, fixed_world))
    vocab = draw(st.integers(max(2, w - 1), 4 * w + 5))
    seq = w * draw(st.integers(1, 2)) if sequence_parallel else draw(st.integers(2, 6))
    return ModelCase(w, draw(seeds), draw(st.sampled_from([2, 4])), w * draw(st.integers(1, 2)), w * draw(st.integers(1, 4)),
                     draw(st.integers(1, 2)), vocab, draw(st.integers(1, 2)), seq,
                     "SGD", draw(st.integers(1, 3)),
                     draw(st.sampled_from([-100, 0])), sequence_parallel)


# --- subgroups -----------------------------------------------------------------------------------

SUBGROUP_KINDS = ("column", "row", "embedding", "cross_entropy", "block", "gpt")


@dataclass(frozen=True)
class SubgroupCase:
    world_size: int  # ranks that run (the world)
    members: tuple[int, ...]  # global ranks of the tensor-parallel group, in group-rank order
    kind: str  # the entry point: one of SUBGROUP_KINDS
    inner: object  # the case of that kind, its world_size the group's size


def _members(world: int):
    """Sorted subsets of 2 to world - 1 ranks whose group ranks are not their global ranks
    (not 0..k-1): ranks 1 and 2 of 3, 0 and 3 of 4, ..."""
    return (st.sets(st.integers(0, world - 1), min_size=2, max_size=world - 1).map(lambda s: tuple(sorted(s)))
            .filter(lambda m: m != tuple(range(len(m)))))


@st.composite
def subgroup_cases(draw, kinds=SUBGROUP_KINDS[:-1]):
    """A case of one entry point on a subgroup of a world of 3 or 4 (the pinned size if
    set); the whole GPT only where asked (its dense reference costs a pass per token)."""
    pinned = pinned_world_size()
    world = pinned if pinned is not None else draw(st.integers(3, max(3, min(MAX_WORLD_SIZE, max(available_world_sizes())))))
    members = draw(_members(world)) if world >= 3 else tuple(range(world))
    kind = draw(st.sampled_from(kinds))
    k = len(members)
    inner = draw({"column": column_cases, "row": row_cases, "embedding": embedding_cases,
                  "cross_entropy": cross_entropy_cases, "block": block_cases, "gpt": model_cases}[kind](fixed_world=k))
    return SubgroupCase(world, members, kind, inner)
