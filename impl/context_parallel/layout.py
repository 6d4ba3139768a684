"""Sequence layouts for context parallelism: which tokens each rank holds.

    contiguous   the sequence cut in W equal chunks; rank r holds chunk r
    zigzag       the sequence cut in 2W equal chunks; rank r holds chunks r and 2W-1-r,
                 in that order (load-balanced: under causal masking every rank's queries
                 attend to the same number of keys)

A rank's shard is the concatenation of its chunks along the sequence dimension (``dim``,
default -2: tensors are (..., N, d)).  ``shard_positions`` gives the absolute positions
of a rank's tokens (what RoPE must be evaluated at); it equals ``shard_sequence`` applied
to ``arange(N)``.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"context parallel: unknown layout {layout!r}; expected one of {LAYOUTS}")
    return layout


def chunks_per_rank(layout: str) -> int:
    return 1 if check_layout(layout) == "contiguous" else 2


def chunk_ids(world_size: int, rank: int, layout: str) -> tuple[int, ...]:
    """Indices of the chunks rank ``rank`` holds, in the order its shard holds them."""
    _check_rank(world_size, rank)
    if check_layout(layout) == "contiguous":
        return (rank,)
    return (rank, 2 * world_size - 1 - rank)


def _check_rank(world_size, rank) -> None:
    for name, value in (("world_size", world_size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"context parallel: {name} must be an int, got {type(value).__name__}")
    if world_size < 1:
        raise ValueError(f"context parallel: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"context parallel: rank {rank} is outside 0..{world_size - 1}")


def chunk_length(seq_len: int, world_size: int, layout: str) -> int:
    """Tokens per chunk; ValueError unless the sequence cuts into equal chunks."""
    n_chunks = world_size * chunks_per_rank(layout)
    if seq_len % n_chunks:
        raise ValueError(
            f"context parallel: sequence length {seq_len} is not divisible by {n_chunks} "
            f"({layout} layout over {world_size} ranks cuts it into {n_chunks} equal chunks)"
        )
    return seq_len // n_chunks


def shard_sequence(x: torch.Tensor, world_size: int, rank: int, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` (a new contiguous tensor)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"context parallel: x must be a torch.Tensor, got {type(x).__name__}")
    dim = dim % x.dim()
    c = chunk_length(x.shape[dim], world_size, layout)
    pieces = [x.narrow(dim, i * c, c) for i in chunk_ids(world_size, rank, layout)]
    return torch.cat(pieces, dim=dim).contiguous()


def unshard_sequence(shards, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's shard (``shards[r]`` is rank r's)."""
    shards = list(shards)
    world_size = len(shards)
    if world_size < 1:
        raise ValueError("context parallel: unshard_sequence needs at least one shard")
    per_rank = chunks_per_rank(layout)
    ref = shards[0]
    dim = dim % ref.dim()
    for r, s in enumerate(shards):
        if s.shape != ref.shape:
            raise ValueError(f"context parallel: shard {r} has shape {tuple(s.shape)}, shard 0 {tuple(ref.shape)}")
    if ref.shape[dim] % per_rank:
        raise ValueError(f"context parallel: a {layout} shard holds {per_rank} equal chunks; length {ref.shape[dim]}")
    c = ref.shape[dim] // per_rank
    chunks: list = [None] * (world_size * per_rank)
    for r, s in enumerate(shards):
        for j, chunk in enumerate(chunk_ids(world_size, r, layout)):
            chunks[chunk] = s.narrow(dim, j * c, c)
    return torch.cat(chunks, dim=dim)


def shard_positions(seq_len: int, world_size: int, rank: int, layout: str = "contiguous", device=None) -> torch.Tensor:
    """Absolute positions (int64) of rank ``rank``'s tokens: the RoPE positions of its shard."""
    c = chunk_length(seq_len, world_size, layout)
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in chunk_ids(world_size, rank, layout)])
