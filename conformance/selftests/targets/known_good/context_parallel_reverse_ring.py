"""A correct ring attention of another design than impl's (a known-good target).

    pytest properties/test_context_parallel.py conformance/spec/test_context_parallel.py \
        --target conformance.selftests.targets.known_good.context_parallel_reverse_ring

Where it differs from ``impl.context_parallel``, each a legitimate choice:

- K/V travel the other way round: rank r sends its current block to rank r - 1 and receives
  rank r + 1's (peers named by group rank, ``group_peer``); K and V are two messages of one
  ``batch_isend_irecv``, the next block's exchange in flight while the current one is
  computed.
- Causal masking skips only whole blocks: a block whose every key comes after every query
  is not computed; any other block (the diagonal, and every off-diagonal block of the
  zigzag layout) is computed whole with a mask built from the layout's positions.
- Blocks are plain matmuls in float32 (float64 for float64 inputs), not FlashAttention tiles.
- Partials merge with ``torch.logaddexp``; the output is their exp(L_b - L)-weighted sum.
- Backward recomputes P = exp(S - L) from the saved L; each block's dK/dV accumulator
  travels with it the same way round and ends on its owner.
- Layouts by ``index_select`` with the shard's positions; no metadata check across ranks.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")
NEG_INF = float("-inf")


# --- layouts -------------------------------------------------------------------------------


def context_parallel_positions(seq_len, world_size, rank, layout="contiguous", device=None):
    """Positions of rank ``rank``'s tokens: its chunk (contiguous) or chunks r and 2W-1-r (zigzag)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    pieces = world_size if layout == "contiguous" else 2 * world_size
    if seq_len % pieces:
        raise ValueError(f"sequence length {seq_len} does not cut into {pieces} equal chunks ({layout}, W={world_size})")
    mine = [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]
    return torch.arange(seq_len, device=device).view(pieces, seq_len // pieces)[mine].flatten()


def context_parallel_shard(x, world_size, rank, layout="contiguous", dim=-2):
    return x.index_select(dim, context_parallel_positions(x.shape[dim], world_size, rank, layout, device=x.device))


def context_parallel_unshard(shards, layout="contiguous", dim=-2):
    shards = list(shards)
    joined = torch.cat(shards, dim=dim)
    n = joined.shape[dim]
    held = torch.cat([context_parallel_positions(n, len(shards), r, layout) for r in range(len(shards))])
    row_of = torch.empty_like(held)
    row_of[held] = torch.arange(n)  # position p sits at row row_of[p] of the concatenation
    return joined.index_select(dim, row_of.to(joined.device))


# --- merge ---------------------------------------------------------------------------------


def _work_dtype(*tensors):
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def merge_attention_partials(o1, lse1, o2, lse2):
    """L = logaddexp(L1, L2); O = exp(L1 - L) O1 + exp(L2 - L) O2; rows with L = -inf give O = 0."""
    work = _work_dtype(o1, lse1, o2, lse2)
    l1, l2 = lse1.to(work), lse2.to(work)
    lse = torch.logaddexp(l1, l2)
    empty = lse == NEG_INF
    shift = torch.where(empty, torch.zeros_like(lse), lse)
    o = torch.exp(l1 - shift)[..., None] * o1.to(work) + torch.exp(l2 - shift)[..., None] * o2.to(work)
    o = torch.where(empty[..., None], torch.zeros_like(o), o)
    return o.to(torch.promote_types(o1.dtype, o2.dtype)), lse.to(torch.promote_types(lse1.dtype, lse2.dtype))


# --- the ring ------------------------------------------------------------------------------


class _Ring:
    """One call on one rank: its group, its neighbours the other way round, its positions."""

    def __init__(self, q, k, v, is_causal, group, layout, scale):
        if not (q.shape == k.shape == v.shape) or q.dim() < 2:
            raise ValueError(f"q, k, v must be local shards of equal shapes (..., n, d); got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        if not q.is_floating_point():
            raise TypeError(f"ring attention needs floating-point inputs, got {q.dtype}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.group = group if group is not None else dist.group.WORLD
        self.size, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError("this process is not in the group it passed")
        n = q.shape[-2]
        if layout == "zigzag" and n % 2:
            raise ValueError(f"a zigzag shard holds two equal chunks: local length {n} is odd")
        self.is_causal, self.layout = bool(is_causal), layout
        self.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        self.seq_len = n * self.size
        self.my_positions = context_parallel_positions(self.seq_len, self.size, self.rank, layout)

    def source(self, step):
        """Whose K/V this rank holds at ``step`` (blocks arrive from rank + 1)."""
        return (self.rank + step) % self.size

    def visible(self, src):
        """None: every pair visible; False: none (skip the block); else the (query, key) mask."""
        if not self.is_causal:
            return None
        keys = context_parallel_positions(self.seq_len, self.size, src, self.layout)
        mask = keys[None, :] <= self.my_positions[:, None]
        if not bool(mask.any()):
            return False
        return None if bool(mask.all()) else mask.to(self.device)

    def start(self, tensors):
        """Send ``tensors`` to rank - 1 and receive as many from rank + 1: (buffers, requests)."""
        inbox = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, group=self.group, group_peer=(self.rank - 1) % self.size) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, group=self.group, group_peer=(self.rank + 1) % self.size) for b in inbox]
        return inbox, dist.batch_isend_irecv(ops)

    @staticmethod
    def finish(pending):
        inbox, requests = pending
        for request in requests:
            request.wait()
        return inbox

    def forward(self, q, k, v):
        self.device = q.device
        work = _work_dtype(q)
        qw = q.to(work)
        o = torch.zeros(qw.shape, dtype=work, device=q.device)
        lse = torch.full(qw.shape[:-1], NEG_INF, dtype=work, device=q.device)
        held = [k, v]
        for step in range(self.size):
            pending = self.start(held) if step < self.size - 1 else None
            mask = self.visible(self.source(step))
            if mask is not False:
                s = (qw @ held[0].to(work).transpose(-1, -2)) * self.scale
                if mask is not None:
                    s = s.masked_fill(~mask, NEG_INF)
                top = s.amax(dim=-1, keepdim=True)
                top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
                p = torch.exp(s - top)
                total = p.sum(dim=-1, keepdim=True)
                o_b = (p @ held[1].to(work)) / torch.where(total > 0, total, torch.ones_like(total))
                lse_b = (top + torch.log(total)).squeeze(-1)  # -inf for a row that sees no key here
                o, lse = merge_attention_partials(o, lse, o_b, lse_b)
            if pending is not None:
                held = self.finish(pending)
        return o.to(q.dtype), lse

    def backward(self, q, k, v, o, lse, grad_o):
        work = _work_dtype(q)
        qw, dow = q.to(work), grad_o.to(work)
        row_dot = (dow * o.to(work)).sum(dim=-1, keepdim=True)  # D = rowsum(dO * O)
        shift = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf))[..., None]
        dq = torch.zeros(qw.shape, dtype=work, device=q.device)
        held, carried = [k, v], None
        for step in range(self.size):
            pending_kv = self.start(held) if step < self.size - 1 else None
            dk_b = torch.zeros(k.shape, dtype=work, device=k.device)
            dv_b = torch.zeros(v.shape, dtype=work, device=v.device)
            mask = self.visible(self.source(step))
            if mask is not False:
                kw, vw = held[0].to(work), held[1].to(work)
                s = (qw @ kw.transpose(-1, -2)) * self.scale
                if mask is not None:
                    s = s.masked_fill(~mask, NEG_INF)
                p = torch.exp(s - shift)
                dv_b = p.transpose(-1, -2) @ dow
                ds = p * ((dow @ vw.transpose(-1, -2)) - row_dot)
                dq = dq + (ds @ kw) * self.scale
                dk_b = (ds.transpose(-1, -2) @ qw) * self.scale
            if carried is None:
                sums = [dk_b, dv_b]
            else:
                got = self.finish(carried)
                sums = [got[0] + dk_b, got[1] + dv_b]
            # rank - 1 holds this block next step (after the last step: it owns it)
            carried = self.start(sums) if self.size > 1 else None
            if pending_kv is not None:
                held = self.finish(pending_kv)
        sums = self.finish(carried) if carried is not None else sums
        return dq.to(q.dtype), sums[0].to(k.dtype), sums[1].to(v.dtype)


class ReverseRingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, group=None, layout="contiguous", scale=None):
        ring = _Ring(q, k, v, is_causal, group, layout, scale)
        o, lse = ring.forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ring = ring
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ctx.ring.backward(q, k, v, o, lse, grad_o)
        return dq, dk, dv, None, None, None, None


def get_ring_attention_autograd_function():
    return ReverseRingAttention
