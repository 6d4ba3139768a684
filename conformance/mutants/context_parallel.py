"""Kept broken context-parallel targets: each is impl with one decision changed.

Every mutant is a target object offering the five context-parallel entry points (see
``conformance.laws.context_parallel.laws``); ``MUTANTS`` lists each with the laws that must
reject it.  ``conformance/selftests/test_mutants.py`` runs them.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

import impl
from conformance.lawbook import Mutant
from impl.context_parallel import layout as _layout
from impl.context_parallel import merge as _merge
from impl.context_parallel.ring import Exchange, RingSchedule, make_ring_attention_function

CAPABILITY = "context parallel"


def _target(**overrides):
    """impl's context-parallel entry points with some replaced."""
    base = dict(
        get_ring_attention_autograd_function=impl.get_ring_attention_autograd_function,
        merge_attention_partials=impl.merge_attention_partials,
        context_parallel_shard=impl.context_parallel_shard,
        context_parallel_unshard=impl.context_parallel_unshard,
        context_parallel_positions=impl.context_parallel_positions,
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def _ring(schedule_cls):
    fn = make_ring_attention_function(schedule_cls, f"Ring_{schedule_cls.__name__}")
    return lambda: fn


# --- merge ----------------------------------------------------------------------------------


def merge_no_max(o1, lse1, o2, lse2):
    """Weights exp(L_i) / (exp(L_1) + exp(L_2)) without subtracting the max: overflows."""
    l1, l2 = lse1.float(), lse2.float()
    w1, w2 = torch.exp(l1), torch.exp(l2)
    total = w1 + w2
    o = (w1[..., None] * o1.float() + w2[..., None] * o2.float()) / total[..., None]
    return o.to(o1.dtype), torch.log(total)


def merge_base2(o1, lse1, o2, lse2):
    """Treats L as a base-2 logsumexp (exp2 / log2) while the blocks give natural-log L."""
    l1, l2 = lse1.float(), lse2.float()
    m = torch.maximum(l1, l2)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1, w2 = torch.exp2(l1 - m), torch.exp2(l2 - m)
    total = w1 + w2
    o = (torch.where(w1[..., None] > 0, w1[..., None] * o1.float(), 0.0)
         + torch.where(w2[..., None] > 0, w2[..., None] * o2.float(), 0.0)) / total[..., None].clamp_min(1e-30)
    return o.to(o1.dtype), m + torch.log2(total)


def merge_nan_when_masked(o1, lse1, o2, lse2):
    """Subtracts the max without guarding m = -inf: two fully masked partials give NaN."""
    l1, l2 = lse1.float(), lse2.float()
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
    total = w1 + w2
    o = (w1[..., None] * o1.float() + w2[..., None] * o2.float()) / total[..., None]
    return o.to(o1.dtype), m + torch.log(total)


class _MergeBase2Schedule(RingSchedule):
    def merge(self, o, lse, o_b, lse_b):
        return merge_base2(o, lse, o_b, lse_b)


merge_without_max_subtraction = _target(merge_attention_partials=merge_no_max)
merge_treats_lse_as_base_2 = _target(merge_attention_partials=merge_base2,
                                     get_ring_attention_autograd_function=_ring(_MergeBase2Schedule))
merge_nan_for_fully_masked_blocks = _target(merge_attention_partials=merge_nan_when_masked)


# --- layout -----------------------------------------------------------------------------------


def _swapped_ids(world_size, rank, layout):
    ids = (rank,) if layout == "contiguous" else (rank, 2 * world_size - 1 - rank)
    return ids[::-1] if layout == "zigzag" and rank % 2 else ids


def _shard_with(ids_fn):
    def shard(x, world_size, rank, layout="contiguous", dim=-2):
        dim = dim % x.dim()
        c = _layout.chunk_length(x.shape[dim], world_size, layout)
        return torch.cat([x.narrow(dim, i * c, c) for i in ids_fn(world_size, rank, layout)], dim=dim)

    def unshard(shards, layout="contiguous", dim=-2):
        shards = list(shards)
        dim = dim % shards[0].dim()
        per = _layout.chunks_per_rank(layout)
        c = shards[0].shape[dim] // per
        chunks = {}
        for r, s in enumerate(shards):
            for j, i in enumerate(ids_fn(len(shards), r, layout)):
                chunks[i] = s.narrow(dim, j * c, c)
        return torch.cat([chunks[i] for i in sorted(chunks)], dim=dim)

    def positions(seq_len, world_size, rank, layout="contiguous", device=None):
        c = _layout.chunk_length(seq_len, world_size, layout)
        return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in ids_fn(world_size, rank, layout)])

    return dict(context_parallel_shard=shard, context_parallel_unshard=unshard, context_parallel_positions=positions)


def _w_plus_r_ids(world_size, rank, layout):
    """Second chunk W + r instead of 2W - 1 - r: still a partition, not balanced."""
    return (rank,) if layout == "contiguous" else (rank, world_size + rank)


zigzag_chunks_swapped_on_odd_ranks = _target(**_shard_with(_swapped_ids))
zigzag_second_chunk_is_w_plus_r = _target(**_shard_with(_w_plus_r_ids))


def _local_positions(seq_len, world_size, rank, layout="contiguous", device=None):
    """Each rank numbers its own tokens from 0 (RoPE as if the shard were the sequence)."""
    return torch.arange(seq_len // world_size, device=device)


rope_positions_restart_at_zero_on_every_rank = _target(context_parallel_positions=_local_positions)


# --- ring: forward ------------------------------------------------------------------------------


class _DiagonalUnmasked(RingSchedule):
    def plan(self, src):
        return [(qs, ks, False) for qs, ks, _ in super().plan(src)]


class _ComputesAboveDiagonal(RingSchedule):
    """Blocks above the diagonal are computed with every score masked, then merged (a no-op)."""

    def plan(self, src):
        steps = super().plan(src)
        if self.is_causal and src != self.rank:
            covered = {(repr(qs), repr(ks)) for qs, ks, _ in steps}
            if (repr(slice(None)), repr(slice(None))) not in covered:
                steps = steps + [("above", slice(None), None)]
        return steps

    def forward(self, q, k, v):
        return _forward_with_masked_above(self, q, k, v)

    def backward(self, q, k, v, o, lse, grad_o):
        return _backward_with_masked_above(self, q, k, v, o, lse, grad_o)


def _masked_block(q, k, v, scale):
    """A block computed in full, every score then masked: O = 0, L = -inf (matmuls still run)."""
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    s = torch.full_like(s, float("-inf"))
    p = torch.zeros_like(s)
    return (p @ v.float()).to(q.dtype), torch.logsumexp(s, dim=-1)


def _forward_with_masked_above(ring, q, k, v):
    from impl.context_parallel.blocks import block_forward

    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.zeros(q.shape, dtype=work, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=work, device=q.device)
    kv = torch.stack((k, v)) if ring.world_size > 1 else None
    k_cur, v_cur = k, v
    for step in range(ring.world_size):
        pending = ring.start_exchange(kv) if step < ring.world_size - 1 else None
        for qs, ks, causal in ring.plan(ring.source(step)):
            if qs == "above":
                o_b, lse_b = _masked_block(q, k_cur, v_cur, ring.scale)
                qs = slice(None)
            else:
                o_b, lse_b = block_forward(q[..., qs, :], k_cur[..., ks, :], v_cur[..., ks, :], causal, ring.scale)
            o[..., qs, :], lse[..., qs] = ring.merge(o[..., qs, :], lse[..., qs], o_b, lse_b)
        if pending is not None:
            kv = pending.wait()
            k_cur, v_cur = kv[0], kv[1]
    return o.to(q.dtype), lse


def _backward_with_masked_above(ring, q, k, v, o, lse, grad_o):
    plan = ring.plan
    ring.plan = lambda src: [step for step in plan(src) if step[0] != "above"]
    try:
        return RingSchedule.backward(ring, q, k, v, o, lse, grad_o)
    finally:
        ring.plan = plan


class _ExtraExchange(RingSchedule):
    """Passes K/V on at the last step too (W exchanges; the last one is never used)."""

    def forward(self, q, k, v):
        out = super().forward(q, k, v)
        if self.world_size > 1:
            kv = torch.stack((k, v))
            self.start_exchange(kv).wait()
        return out


class _NoOverlap(RingSchedule):
    """Waits for each exchange as soon as it starts: correct, but communication is never hidden."""

    def start_exchange(self, tensor):
        exchange = super().start_exchange(tensor)
        received = exchange.wait()
        exchange.wait = lambda: received
        return exchange


class _MissingWait(RingSchedule):
    """Reads the received K/V block without waiting for the exchange to complete."""

    def start_exchange(self, tensor):
        exchange = super().start_exchange(tensor)
        works = exchange.works
        exchange.works = []

        def finish_later():  # the handles are completed only after the block has been read
            for work in works:
                work.wait()

        self._unwaited = getattr(self, "_unwaited", []) + [finish_later]
        return exchange

    def forward(self, q, k, v):
        try:
            return super().forward(q, k, v)
        finally:
            for finish in getattr(self, "_unwaited", []):
                finish()
            self._unwaited = []

    def backward(self, q, k, v, o, lse, grad_o):
        try:
            return super().backward(q, k, v, o, lse, grad_o)
        finally:
            for finish in getattr(self, "_unwaited", []):
                finish()
            self._unwaited = []


class _UnbatchedExchange(RingSchedule):
    """Each K/V exchange is an isend to the next rank, then an irecv from the previous one:
    right on gloo; at W = 2 on NCCL both ranks' sends wait for receives queued behind them."""

    def start_exchange(self, tensor):
        exchange = Exchange.__new__(Exchange)
        exchange.sent, exchange.received = tensor, torch.empty_like(tensor)
        exchange.works = [dist.isend(tensor, self.next, group=self.group),
                          dist.irecv(exchange.received, self.prev, group=self.group)]
        return exchange


class _NeighboursAsGlobalRanks(RingSchedule):
    """Takes the group ranks of its ring neighbours for global ranks (no get_global_rank):
    right on the default group, where the two agree; on ranks 1 and 3 of 4 it sends to
    itself and to rank 0, which is not in the group."""

    def __init__(self, *args):
        super().__init__(*args)
        self.next = (self.rank + 1) % self.world_size
        self.prev = (self.rank - 1) % self.world_size


diagonal_block_unmasked = _target(get_ring_attention_autograd_function=_ring(_DiagonalUnmasked))
blocks_above_the_diagonal_computed_then_masked = _target(get_ring_attention_autograd_function=_ring(_ComputesAboveDiagonal))
one_key_value_exchange_too_many = _target(get_ring_attention_autograd_function=_ring(_ExtraExchange))
exchange_waited_before_compute = _target(get_ring_attention_autograd_function=_ring(_NoOverlap))
received_block_read_before_wait = _target(get_ring_attention_autograd_function=_ring(_MissingWait))
exchanges_unbatched = _target(get_ring_attention_autograd_function=_ring(_UnbatchedExchange))
neighbours_taken_as_global_ranks = _target(get_ring_attention_autograd_function=_ring(_NeighboursAsGlobalRanks))


# --- ring: backward -----------------------------------------------------------------------------


class _DkDvNeverSummed(RingSchedule):
    """Each rank keeps only its own share of dK/dV for its own block (step 0), never passed on."""

    def backward(self, q, k, v, o, lse, grad_o):
        dq, _, _ = super().backward(q, k, v, o, lse, grad_o)
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        share = torch.zeros((2, *k.shape), dtype=work, device=k.device)
        from impl.context_parallel.blocks import block_backward

        for qs, ks, causal in self.plan(self.rank):
            _, dk_b, dv_b = block_backward(q[..., qs, :], k[..., ks, :], v[..., ks, :], o[..., qs, :], lse[..., qs],
                                           grad_o[..., qs, :], causal, self.scale)
            share[0][..., ks, :] += dk_b
            share[1][..., ks, :] += dv_b
        return dq, share[0].to(k.dtype), share[1].to(v.dtype)


class _DkDvToWrongRank(RingSchedule):
    """The final hand-over of the dK/dV accumulator is skipped: rank r keeps block r+1's sums."""

    def backward(self, q, k, v, o, lse, grad_o):
        skip = {"n": 0}
        original = self.start_exchange
        ring = self

        def start_exchange(tensor):
            skip["n"] += 1
            # backward: W-1 K/V exchanges and W accumulator exchanges, the last one is the hand-over
            if skip["n"] == 2 * ring.world_size - 1 and ring.world_size > 1:
                return _Kept(tensor)
            return original(tensor)

        self.start_exchange = start_exchange
        try:
            return super().backward(q, k, v, o, lse, grad_o)
        finally:
            del self.start_exchange


class _Kept:
    def __init__(self, tensor):
        self.tensor = tensor

    def wait(self):
        return self.tensor


class _BackwardReusesFirstKV(RingSchedule):
    """The backward computes every step against the rank's own K/V (the first step's) again."""

    def backward(self, q, k, v, o, lse, grad_o):
        original = self.start_exchange
        kv0 = torch.stack((k, v))
        calls = {"n": 0}
        ring = self

        def start_exchange(tensor):
            # backward order: K/V, dK/dV at each step but the last, which has only dK/dV
            is_kv = calls["n"] % 2 == 0 and calls["n"] < 2 * (ring.world_size - 1)
            calls["n"] += 1
            exchange = original(tensor)
            if is_kv:
                received = exchange.wait
                exchange.wait = lambda: (received(), kv0)[1]
            return exchange

        self.start_exchange = start_exchange
        try:
            return super().backward(q, k, v, o, lse, grad_o)
        finally:
            del self.start_exchange


class _OutputInFloat32(RingSchedule):
    """Returns O in the float32 accumulator's dtype instead of the input dtype."""

    def forward(self, q, k, v):
        o, lse = super().forward(q, k, v)
        return o.to(torch.promote_types(o.dtype, torch.float32)), lse


output_left_in_float32 = _target(get_ring_attention_autograd_function=_ring(_OutputInFloat32))

dkdv_never_summed_across_ranks = _target(get_ring_attention_autograd_function=_ring(_DkDvNeverSummed))
dkdv_left_on_the_wrong_rank = _target(get_ring_attention_autograd_function=_ring(_DkDvToWrongRank))
backward_reads_the_first_steps_kv_again = _target(get_ring_attention_autograd_function=_ring(_BackwardReusesFirstKV))


# --- the list ---------------------------------------------------------------------------------

_M = "conformance.mutants.context_parallel:"
PARITY = "ring_output_logsumexp_and_gradients_equal_full_attention"
MERGE = "merged_blocks_of_any_key_partition_in_any_order_equal_full_attention"
IDENTITY = "empty_partial_is_an_exact_identity_and_masked_partials_never_give_nan"

MUTANTS = (
    Mutant("merge_without_max_subtraction", CAPABILITY, "merge weights exp(L) without subtracting the max: overflow",
           (MERGE, IDENTITY), _M + "merge_without_max_subtraction"),
    Mutant("merge_treats_lse_as_base_2", CAPABILITY, "merge uses exp2/log2 on natural-log L (in the ring too)",
           (MERGE, PARITY), _M + "merge_treats_lse_as_base_2"),
    Mutant("merge_nan_for_fully_masked_blocks", CAPABILITY, "m = max(L1, L2) = -inf is not guarded: NaN",
           (IDENTITY,), _M + "merge_nan_for_fully_masked_blocks"),
    Mutant("zigzag_chunks_swapped_on_odd_ranks", CAPABILITY, "odd ranks hold chunks (2W-1-r, r) instead of (r, 2W-1-r)",
           ("shards_follow_the_layout_and_unshard_inverts_shard", "rope_positions_of_a_shard_are_the_slice_of_the_full_positions"),
           _M + "zigzag_chunks_swapped_on_odd_ranks"),
    Mutant("zigzag_second_chunk_is_w_plus_r", CAPABILITY, "zigzag rank r holds chunks r and W+r: a partition, not balanced",
           ("zigzag_gives_every_rank_the_same_causal_work", "shards_follow_the_layout_and_unshard_inverts_shard"),
           _M + "zigzag_second_chunk_is_w_plus_r"),
    Mutant("rope_positions_restart_at_zero_on_every_rank", CAPABILITY, "each rank's RoPE positions count from 0",
           ("rope_positions_of_a_shard_are_the_slice_of_the_full_positions",), _M + "rope_positions_restart_at_zero_on_every_rank"),
    Mutant("diagonal_block_unmasked", CAPABILITY, "the diagonal block runs without the causal mask",
           (PARITY,), _M + "diagonal_block_unmasked"),
    Mutant("blocks_above_the_diagonal_computed_then_masked", CAPABILITY,
           "causal skip off: blocks above the diagonal are computed, fully masked, and merged as no-ops",
           ("fully_masked_causal_blocks_are_never_computed", "causal_chunk_blocks_above_the_diagonal_are_never_computed"),
           _M + "blocks_above_the_diagonal_computed_then_masked"),
    Mutant("one_key_value_exchange_too_many", CAPABILITY, "the forward passes K/V on W times instead of W - 1",
           ("forward_moves_no_more_than_the_other_ranks_key_value_blocks",
            "forward_passes_w_minus_1_key_value_blocks_around_the_ring"), _M + "one_key_value_exchange_too_many"),
    Mutant("exchange_waited_before_compute", CAPABILITY, "each exchange is waited on before the block is computed",
           ("every_key_value_exchange_overlaps_a_block_computation",), _M + "exchange_waited_before_compute"),
    Mutant("received_block_read_before_wait", CAPABILITY, "a received K/V block is read before its exchange is waited on",
           ("ring_results_do_not_depend_on_when_messages_arrive",), _M + "received_block_read_before_wait"),
    Mutant("output_left_in_float32", CAPABILITY, "O comes back in float32 for fp16/bf16 inputs",
           ("ring_matches_full_attention_in_fp16_and_bf16",), _M + "output_left_in_float32"),
    Mutant("dkdv_never_summed_across_ranks", CAPABILITY, "dK/dV keep only the owner's share",
           (PARITY,), _M + "dkdv_never_summed_across_ranks"),
    Mutant("dkdv_left_on_the_wrong_rank", CAPABILITY, "the summed dK/dV are never handed to their owner",
           (PARITY,), _M + "dkdv_left_on_the_wrong_rank"),
    Mutant("backward_reads_the_first_steps_kv_again", CAPABILITY, "the backward uses the rank's own K/V at every step",
           (PARITY,), _M + "backward_reads_the_first_steps_kv_again"),
    Mutant("exchanges_unbatched", CAPABILITY,
           "each K/V exchange is an unbatched isend then irecv: right on gloo, hangs on NCCL at W = 2",
           ("point_to_point_calls_cannot_hang_on_nccl",), _M + "exchanges_unbatched"),
    Mutant("neighbours_taken_as_global_ranks", CAPABILITY,
           "the ring's neighbours are group ranks passed as global ranks: right only where the two agree",
           ("ring_on_a_subgroup_of_other_global_ranks_equals_full_attention",), _M + "neighbours_taken_as_global_ranks"),
)
