"""Ring attention over a process group (Liu et al. 2023), on our FlashAttention-2 blocks.

Contract
    RingAttention.apply(q, k, v, is_causal=False, group=None, layout="contiguous", scale=None) -> O
    (positional arguments).  Every rank of ``group`` (default: the default process group)
    calls it at once with its own shard of the sequence: q, k, v of shape (..., n, d),
    n = N / W tokens in the ``layout`` of ``impl.context_parallel.layout`` (contiguous:
    chunk r; zigzag: chunks r and 2W-1-r, so n must be even).  Returns this rank's shard of
    O, in the input dtype.  Equal shapes for q, k, v; the same shapes, dtype, is_causal,
    layout and scale on every rank (checked with one small all_gather of metadata, which
    raises ValueError on every rank when they differ).
    dtypes float16, bfloat16, float32, float64; CPU (gloo) or CUDA (NCCL), as the group's
    backend allows.  Blocks run on our FlashAttention-2: Triton kernels for CUDA tensors,
    the PyTorch tiles elsewhere (see ``blocks``).
    is_causal: query i sees key j <= i in absolute positions (top-left aligned).
    scale: softmax scale, default 1/sqrt(d).
    Saved for backward: q, k, v, O and L = logsumexp of the scaled scores of this rank's
    queries over the whole sequence (natural log, float32; float64 for float64 inputs;
    shape q.shape[:-1], the only saved tensor of that shape).
Communication (point-to-point only, ``batch_isend_irecv``, rank r sends to r+1 and
receives from r-1 modulo W)
    forward: W - 1 exchanges of this rank's current K and V (one tensor of 2 x |K| in the
    input dtype).  The exchange for step t+1 starts before step t's block is computed and
    is waited on only after it, so transfer hides behind compute.
    backward: W - 1 K/V exchanges as in the forward, and W exchanges of a dK/dV
    accumulator (2 x |K| in float32; float64 for float64) that travels with its K/V block
    and ends on the block's owner: every rank adds its share on the way.
Work under causal masking
    A (query chunk, key chunk) block entirely above the diagonal is skipped; a block on the
    diagonal is the only one masked; blocks below it run unmasked.  Contiguous: rank r
    computes r + 1 blocks (rank W-1 the most).  Zigzag: step 0 is one causal call on the
    local shard; from a lower rank the whole query shard meets the first half of the
    keys, from a higher rank the second half of the queries meets all its keys: every
    rank does the same work.
Backward recomputes P from the saved O and L block by block (FlashAttention-2's
backward with the row's final O and L); the N x N matrix is never formed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .blocks import block_backward, block_forward
from .layout import check_layout
from .merge import merge_attention_partials
from impl.attention.validation import validate_attention_inputs

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LAYOUT_CODES = {"contiguous": 0, "zigzag": 1}
_DTYPE_CODES = {dt: i for i, dt in enumerate(DTYPES)}
_ALL = slice(None)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class Exchange:
    """One step of the ring: send ``tensor`` to the next rank, receive the previous rank's.

    ``wait()`` returns the received tensor; it must be called before the tensor is read.
    """

    def __init__(self, tensor: torch.Tensor, group, send_to: int, recv_from: int):
        self.sent = tensor  # kept alive until the send completes
        self.received = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, tensor, send_to, group), dist.P2POp(dist.irecv, self.received, recv_from, group)]
        self.works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        self.works = []
        self.sent = None
        return self.received


class RingSchedule:
    """One call of ring attention on one rank: who sends to whom, which blocks run, merging."""

    def __init__(self, q, k, v, is_causal, group, layout, scale):
        self.scale = validate_attention_inputs(q, k, v, is_causal, scale, dtypes=DTYPES, max_head_dim=256)
        self.is_causal = bool(is_causal)
        self.layout = check_layout(layout)
        if q.shape != k.shape:
            raise ValueError(f"ring attention: q {tuple(q.shape)} and k {tuple(k.shape)} must have equal shapes (local shards)")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ring attention: torch.distributed is not initialised (no process group)")
        self.group = group if group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError("ring attention: this process is not a member of the given group")
        self.n = q.shape[-2]
        if self.layout == "zigzag" and self.n % 2:
            raise ValueError(
                f"ring attention: the zigzag layout holds two equal chunks per rank; local length {self.n} is odd "
                f"(the sequence must be divisible by 2W = {2 * self.world_size})"
            )
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.world_size)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world_size)
        if self.world_size > 1:
            self.check_same_everywhere(q)

    # --- checks ---------------------------------------------------------------------

    def check_same_everywhere(self, q) -> None:
        """Every rank passes the same shapes, dtype, flags: one all_gather of a few numbers."""
        shape = list(q.shape) + [0] * (8 - q.dim()) if q.dim() <= 8 else list(q.shape)
        meta = [float(q.dim()), *map(float, shape), float(_DTYPE_CODES[q.dtype]), float(self.is_causal),
                float(_LAYOUT_CODES[self.layout]), self.scale]
        mine = torch.tensor(meta, dtype=torch.float64, device=q.device)
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(everyone, mine, group=self.group)
        rows = [t.tolist() for t in everyone]
        if any(row != rows[0] for row in rows):
            names = ["ndim"] + [f"shape[{i}]" for i in range(len(shape))] + ["dtype", "is_causal", "layout", "scale"]
            differ = sorted({names[i] for row in rows for i in range(len(row)) if row[i] != rows[0][i]})
            raise ValueError(
                f"ring attention: ranks disagree on {', '.join(differ)}; every rank must pass shards of one "
                f"sequence with the same shape, dtype, is_causal, layout and scale (rank 0: {rows[0]}, "
                f"rank {self.rank}: {rows[self.rank]})"
            )

    # --- the schedule -----------------------------------------------------------------

    def source(self, step: int) -> int:
        """The rank whose K/V block this rank holds at ``step``."""
        return (self.rank - step) % self.world_size

    def plan(self, src: int):
        """[(query slice, key slice, causal)] to compute against rank ``src``'s K/V shard."""
        if not self.is_causal:
            return [(_ALL, _ALL, False)]
        if src == self.rank:
            return [(_ALL, _ALL, True)]  # the diagonal: masked (zigzag: both chunk pairs at once)
        if self.layout == "contiguous":
            return [(_ALL, _ALL, False)] if src < self.rank else []
        half = self.n // 2
        if src < self.rank:  # keys: chunk src (below both query chunks), chunk 2W-1-src (above both)
            return [(_ALL, slice(0, half), False)]
        # src > rank: query chunk r sees neither key chunk, chunk 2W-1-r sees both
        return [(slice(half, None), _ALL, False)]

    def merge(self, o, lse, o_b, lse_b):
        return merge_attention_partials(o, lse, o_b, lse_b)

    def start_exchange(self, tensor) -> Exchange:
        return Exchange(tensor, self.group, self.next, self.prev)

    # --- forward and backward -------------------------------------------------------------

    def forward(self, q, k, v):
        work = _work_dtype(q.dtype)
        o = torch.zeros(q.shape, dtype=work, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=work, device=q.device)
        kv = torch.stack((k, v)) if self.world_size > 1 else None
        k_cur, v_cur = k, v
        for step in range(self.world_size):
            pending = self.start_exchange(kv) if step < self.world_size - 1 else None
            for qs, ks, causal in self.plan(self.source(step)):
                o_b, lse_b = block_forward(q[..., qs, :], k_cur[..., ks, :], v_cur[..., ks, :], causal, self.scale)
                o[..., qs, :], lse[..., qs] = self.merge(o[..., qs, :], lse[..., qs], o_b, lse_b)
            if pending is not None:
                kv = pending.wait()
                k_cur, v_cur = kv[0], kv[1]
        return o.to(q.dtype), lse

    def backward(self, q, k, v, o, lse, grad_o):
        work = _work_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=work, device=q.device)
        kv = torch.stack((k, v)) if self.world_size > 1 else None
        k_cur, v_cur = k, v
        dkv_pending = None
        dkv = None
        for step in range(self.world_size):
            kv_pending = self.start_exchange(kv) if step < self.world_size - 1 else None
            share = torch.zeros((2, *k.shape), dtype=work, device=k.device)  # this rank's dK, dV for the block
            for qs, ks, causal in self.plan(self.source(step)):
                dq_b, dk_b, dv_b = block_backward(q[..., qs, :], k_cur[..., ks, :], v_cur[..., ks, :], o[..., qs, :],
                                                  lse[..., qs], grad_o[..., qs, :], causal, self.scale)
                dq[..., qs, :] += dq_b
                share[0][..., ks, :] += dk_b
                share[1][..., ks, :] += dv_b
            dkv = share if dkv_pending is None else dkv_pending.wait() + share  # the block's sum so far
            if self.world_size > 1:
                dkv_pending = self.start_exchange(dkv)  # on to the next rank, which holds this block next
            if kv_pending is not None:
                kv = kv_pending.wait()
                k_cur, v_cur = kv[0], kv[1]
        if dkv_pending is not None:
            dkv = dkv_pending.wait()  # this rank's own block, with every rank's share
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def make_ring_attention_function(schedule_cls=RingSchedule, name: str = "RingAttention"):
    """An autograd.Function class running ``schedule_cls`` (see the module contract)."""

    def forward(ctx, q, k, v, is_causal=False, group=None, layout="contiguous", scale=None):
        ring = schedule_cls(q, k, v, is_causal, group, layout, scale)
        o, lse = ring.forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ring = ring
        return o

    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        grad_o = grad_o.to(q.dtype)
        dq, dk, dv = ctx.ring.backward(q, k, v, o, lse, grad_o)
        return dq, dk, dv, None, None, None, None

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
        "__doc__": "Ring attention over a process group (see impl.context_parallel.ring).",
    })


RingAttention = make_ring_attention_function(RingSchedule)


def ring_attention_forward(q, k, v, is_causal=False, group=None, layout="contiguous", scale=None):
    """(O, L) of this rank's shard, without autograd."""
    ring = RingSchedule(q, k, v, is_causal, group, layout, scale)
    return ring.forward(q, k, v)
