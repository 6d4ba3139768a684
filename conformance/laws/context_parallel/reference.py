"""Single-process references for the context-parallel laws, short enough to check by eye.

    layout: contiguous rank r holds chunk r of W; zigzag rank r holds chunks r and 2W-1-r
            of 2W, in that order.  positions(N, W, r) = shard(arange(N)).
    attention(q, k, v, is_causal, scale, key_mask) -> (O, L): eager softmax attention
            (natural-log L), with an optional boolean mask of visible (query, key) pairs;
            a row that sees no key has O = 0 and L = -inf.
    rope(x, positions): rotary embedding (pairs of features rotated by position * freq).
    allowed_pairs(...): (query, key) pairs a rank may compute under causal masking when it
            skips every (query chunk, key chunk) block above the diagonal;
    shard_blocks_pairs(...): the same when it skips only the other ranks' shards that its
            queries see nothing of (whole fully masked blocks).
"""

from __future__ import annotations

import math

import torch

LAYOUTS = ("contiguous", "zigzag")


def chunk_ids(world_size: int, rank: int, layout: str) -> tuple[int, ...]:
    return (rank,) if layout == "contiguous" else (rank, 2 * world_size - 1 - rank)


def n_chunks(world_size: int, layout: str) -> int:
    return world_size if layout == "contiguous" else 2 * world_size


def shard(x: torch.Tensor, world_size: int, rank: int, layout: str, dim: int = -2) -> torch.Tensor:
    c = x.shape[dim] // n_chunks(world_size, layout)
    return torch.cat([x.narrow(dim, i * c, c) for i in chunk_ids(world_size, rank, layout)], dim=dim)


def unshard(shards, layout: str, dim: int = -2) -> torch.Tensor:
    world_size = len(shards)
    per = 1 if layout == "contiguous" else 2
    c = shards[0].shape[dim] // per
    chunks = {}
    for r, s in enumerate(shards):
        for j, i in enumerate(chunk_ids(world_size, r, layout)):
            chunks[i] = s.narrow(dim, j * c, c)
    return torch.cat([chunks[i] for i in range(len(chunks))], dim=dim)


def positions(seq_len: int, world_size: int, rank: int, layout: str) -> torch.Tensor:
    return shard(torch.arange(seq_len), world_size, rank, layout, dim=0)


def attention(q, k, v, is_causal=False, scale=None, key_mask=None):
    """(O, L) in the inputs' dtype; ``key_mask`` (N_q, N_k) bool: True where visible."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    visible = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device)
    if is_causal:
        visible = visible & torch.ones_like(visible).tril()
    if key_mask is not None:
        visible = visible & key_mask
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    p = torch.where(visible, p, torch.zeros_like(p))
    return p @ v, lse


def rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate feature pairs (2i, 2i+1) of x (..., N, d), d even, by angle pos * base^(-2i/d)."""
    d = x.shape[-1]
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = pos.to(torch.float64)[:, None] * freqs[None, :]
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


def causal_pairs(pos: torch.Tensor) -> int:
    """(query, key) pairs the queries at ``pos`` attend to under causal masking."""
    return int((pos + 1).sum())


def allowed_pairs(world_size: int, rank: int, layout: str, n_local: int) -> int:
    """Pairs a rank may compute in one causal pass: its whole local square on the diagonal
    step (the only masked block), and from every other rank only the (query chunk, key
    chunk) blocks at or below the diagonal."""
    c = n_local // (1 if layout == "contiguous" else 2)
    mine = chunk_ids(world_size, rank, layout)
    total = n_local * n_local
    for src in range(world_size):
        if src == rank:
            continue
        theirs = chunk_ids(world_size, src, layout)
        total += sum(c * c for qc in mine for kc in theirs if kc <= qc)
    return total


def shard_blocks_pairs(world_size: int, rank: int, layout: str, n_local: int) -> int:
    """Pairs a rank may compute in one causal pass when it skips only whole blocks: the
    (its queries, rank src's keys) block for every src whose first key is not after its
    last query.  Contiguous: ranks 0..rank (the same as ``allowed_pairs``); zigzag: every
    rank (each shard holds a chunk from each half of the sequence)."""
    seq_len = n_local * world_size
    last_query = int(positions(seq_len, world_size, rank, layout).max())
    seen = sum(1 for src in range(world_size) if int(positions(seq_len, world_size, src, layout).min()) <= last_query)
    return seen * n_local * n_local


def attention_magnitudes(q, k, v, grad_o, is_causal: bool, scale: float, dtype=None) -> dict[str, torch.Tensor]:
    """Float64 magnitudes of the terms summed into each attention output and gradient (the
    oracle's rounding floor), the same yardstick the attention laws use:

        mag_O = P |V|,  mag_L = |L| + max_j scale (|Q| |K|^T)_ij
        mag_dS = P' (|dO| |V|^T + rowsum|dO * O|),  P' = P (1 + (eps32 / eps) (|S| + |L|))
        mag_dQ = scale mag_dS |K|,  mag_dK = scale mag_dS^T |Q|,  mag_dV = P'^T |dO|

    P' folds in the float32 rounding of exp(S - L) recomputed from the saved L.
    """
    q, k, v, do = (t.detach().to(torch.float64) for t in (q, k, v, grad_o))
    s = (q @ k.transpose(-1, -2)) * scale
    mag_s = scale * (q.abs() @ k.abs().transpose(-1, -2))
    if is_causal:
        future = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
        s = s.masked_fill(future, float("-inf"))
        mag_s = mag_s.masked_fill(future, 0.0)
    p = torch.softmax(s, dim=-1)
    o = p @ v
    lse = torch.logsumexp(s, dim=-1)
    ulps = torch.finfo(torch.float32).eps / torch.finfo(dtype or torch.float32).eps
    p_re = p * (1 + ulps * (mag_s + lse.abs()[..., None]))
    mag_ds = p_re * (do.abs() @ v.abs().transpose(-1, -2) + (do * o).abs().sum(-1, keepdim=True))
    return {
        "O": p @ v.abs(),
        "L": lse.abs() + mag_s.amax(dim=-1),
        "dQ": scale * (mag_ds @ k.abs()),
        "dK": scale * (mag_ds.transpose(-1, -2) @ q.abs()),
        "dV": p_re.transpose(-1, -2) @ do.abs(),
    }
