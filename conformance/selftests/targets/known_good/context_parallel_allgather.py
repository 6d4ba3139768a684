"""A correct context-parallel attention of another design than impl's (a known-good target).

    pytest properties/test_context_parallel.py conformance/spec/test_context_parallel.py \
        --target conformance.selftests.targets.known_good.context_parallel_allgather

Where it differs from ``impl.context_parallel``, each a legitimate choice (the all-gather
scheme of Llama 3's context parallelism and of torch's default rotation):

- No ring: every rank's K and V are gathered by one asynchronous all-gather per forward,
  in flight while the rank's own (diagonal) block is computed; no point-to-point calls.
- Work is cut by layout chunks: (query chunk, key chunk) blocks above the diagonal are
  skipped, the diagonal chunk blocks masked, the others computed in full.
- Blocks by logsumexp and softmax in float32 (float64 for float64 inputs).
- Partials merge in sigmoid form: O = O1 - sigmoid(L2 - L1) (O1 - O2),
  L = max + log1p(exp(min - max)).
- Backward gathers K/V again, computes every block's dK/dV share, and sums the shares onto
  their owners with one reduce-scatter.
- Layouts by ``tensor_split`` and ``torch.cat``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")
NEG_INF = float("-inf")


# --- layouts -------------------------------------------------------------------------------


def _chunk_ids(world_size, rank, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return (rank,) if layout == "contiguous" else (rank, 2 * world_size - 1 - rank)


def context_parallel_shard(x, world_size, rank, layout="contiguous", dim=-2):
    ids = _chunk_ids(world_size, rank, layout)
    pieces = world_size * len(ids)
    if x.shape[dim] % pieces:
        raise ValueError(f"{x.shape[dim]} tokens do not split into {pieces} equal {layout} chunks")
    chunks = x.tensor_split(pieces, dim=dim)
    return torch.cat([chunks[i] for i in ids], dim=dim)


def context_parallel_unshard(shards, layout="contiguous", dim=-2):
    shards = list(shards)
    world_size = len(shards)
    per_rank = len(_chunk_ids(world_size, 0, layout))
    chunks = [None] * (world_size * per_rank)
    for rank, shard in enumerate(shards):
        for piece, i in zip(shard.tensor_split(per_rank, dim=dim), _chunk_ids(world_size, rank, layout)):
            chunks[i] = piece
    return torch.cat(chunks, dim=dim)


def context_parallel_positions(seq_len, world_size, rank, layout="contiguous", device=None):
    return context_parallel_shard(torch.arange(seq_len, device=device), world_size, rank, layout, dim=0)


# --- merge ---------------------------------------------------------------------------------


def _work_dtype(*tensors):
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def merge_attention_partials(o1, lse1, o2, lse2):
    work = _work_dtype(o1, lse1, o2, lse2)
    l1, l2 = lse1.to(work), lse2.to(work)
    hi, lo = torch.maximum(l1, l2), torch.minimum(l1, l2)
    gap = torch.where(lo == NEG_INF, torch.full_like(lo, NEG_INF), lo - hi)  # <= 0; -inf when lo is empty
    lse = hi + torch.log1p(torch.exp(gap))
    # weight of the second partial: 0 if it is empty, 1 if only the first is, else sigmoid(L2 - L1)
    w2 = torch.where(l2 == NEG_INF, torch.zeros_like(l2),
                     torch.where(l1 == NEG_INF, torch.ones_like(l1), torch.sigmoid(l2 - l1)))
    a, b = o1.to(work), o2.to(work)
    o = a - w2[..., None] * (a - b)
    return o.to(torch.promote_types(o1.dtype, o2.dtype)), lse.to(torch.promote_types(lse1.dtype, lse2.dtype))


# --- attention over gathered K/V -----------------------------------------------------------


def _gather(tensor, group, size):
    """(all ranks' ``tensor`` stacked, the request): asynchronous, wait before reading."""
    out = tensor.new_empty((size * tensor.shape[0], *tensor.shape[1:]))  # concatenated along dim 0
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    request = gather(out, tensor.contiguous(), group=group, async_op=True)
    return out.view(size, *tensor.shape), request


class _Plan:
    """Which (query chunk, key chunk) blocks this rank computes against each source rank."""

    def __init__(self, q, k, v, is_causal, group, layout, scale):
        if not (q.shape == k.shape == v.shape) or q.dim() < 2:
            raise ValueError(f"q, k, v must be shards of equal shapes (..., n, d); got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        self.group = group if group is not None else dist.group.WORLD
        self.size, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError("this process is not in the group it passed")
        self.layout, self.is_causal = layout, bool(is_causal)
        self.per_rank = len(_chunk_ids(self.size, self.rank, layout))
        if q.shape[-2] % self.per_rank:
            raise ValueError(f"local length {q.shape[-2]} does not hold {self.per_rank} equal {layout} chunks")
        self.chunk = q.shape[-2] // self.per_rank
        self.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)

    def blocks(self, src):
        """[(query rows, key rows, causal)]: chunk pairs at or below the diagonal."""
        c = self.chunk
        out = []
        for i, qc in enumerate(_chunk_ids(self.size, self.rank, self.layout)):
            for j, kc in enumerate(_chunk_ids(self.size, src, self.layout)):
                if self.is_causal and kc > qc:
                    continue
                out.append((slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c), self.is_causal and kc == qc))
        return out

    def scores(self, q, k, causal):
        s = (q @ k.transpose(-1, -2)) * self.scale
        if causal:  # a diagonal chunk block: query i sees key j <= i
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), NEG_INF)
        return s

    def attend(self, q, k, v, src, o, lse):
        """Merge this rank's attention over rank ``src``'s K/V into the running (o, lse)."""
        for rows, cols, causal in self.blocks(src):
            s = self.scores(q[..., rows, :], k[..., cols, :], causal)
            lse_b = torch.logsumexp(s, dim=-1)  # every row of a computed block sees a key
            o_b = torch.softmax(s, dim=-1) @ v[..., cols, :]
            o[..., rows, :], lse[..., rows] = merge_attention_partials(o[..., rows, :], lse[..., rows], o_b, lse_b)
        return o, lse

    def forward(self, q, k, v):
        work = _work_dtype(q)
        qw = q.to(work)
        o = torch.zeros(qw.shape, dtype=work, device=q.device)
        lse = torch.full(qw.shape[:-1], NEG_INF, dtype=work, device=q.device)
        if self.size > 1:
            gathered, request = _gather(torch.stack((k, v)), self.group, self.size)
        o, lse = self.attend(qw, k.to(work), v.to(work), self.rank, o, lse)  # while the gather runs
        if self.size > 1:
            request.wait()
            for src in range(self.size):
                if src != self.rank:
                    o, lse = self.attend(qw, gathered[src, 0].to(work), gathered[src, 1].to(work), src, o, lse)
        return o.to(q.dtype), lse

    def backward(self, q, k, v, o, lse, grad_o):
        work = _work_dtype(q)
        qw, dow = q.to(work), grad_o.to(work)
        row_dot = (dow * o.to(work)).sum(dim=-1, keepdim=True)
        if self.size > 1:
            gathered, request = _gather(torch.stack((k, v)), self.group, self.size)
            request.wait()
        else:
            gathered = torch.stack((k, v))[None]
        dq = torch.zeros(qw.shape, dtype=work, device=q.device)
        shares = torch.zeros((self.size, 2, *k.shape), dtype=work, device=k.device)  # dK, dV of every rank's block
        for src in range(self.size):
            kw, vw = gathered[src, 0].to(work), gathered[src, 1].to(work)
            for rows, cols, causal in self.blocks(src):
                qi, doi = qw[..., rows, :], dow[..., rows, :]
                p = torch.exp(self.scores(qi, kw[..., cols, :], causal) - lse[..., rows, None])
                shares[src, 1][..., cols, :] += p.transpose(-1, -2) @ doi
                ds = p * (doi @ vw[..., cols, :].transpose(-1, -2) - row_dot[..., rows, :])
                dq[..., rows, :] += (ds @ kw[..., cols, :]) * self.scale
                shares[src, 0][..., cols, :] += (ds.transpose(-1, -2) @ qi) * self.scale
        if self.size > 1:
            mine = torch.empty_like(shares[0])
            dist.reduce_scatter_tensor(mine, shares.flatten(0, 1), group=self.group)
        else:
            mine = shares[0]
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype)


class AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, group=None, layout="contiguous", scale=None):
        plan = _Plan(q, k, v, is_causal, group, layout, scale)
        o, lse = plan.forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan = plan
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ctx.plan.backward(q, k, v, o, lse, grad_o)
        return dq, dk, dv, None, None, None, None


def get_ring_attention_autograd_function():
    return AllGatherAttention
