"""FlashAttention forward and backward for Hopper in Gluon: TMA loads by a loader warp,
asynchronous warp-group MMA, the softmax of one key tile overlapped with the P V product
of the one before (the schedule of FlashAttention-3, Shah et al. 2024, section 3.2).

Contract
    FlashAttentionGluon.apply(q, k, v, is_causal=False, scale=None) -> O
    q: (..., N_q, d), k and v: (..., N_k, d), equal leading dims (merged into two levels,
    batch and head, as the Triton flavour does).  N_q, N_k >= 1, any lengths, N_q != N_k
    allowed: TMA fills the rows past a head's end with zeros and the last key tile is
    masked, so ragged tails need no padding.  Head dim d 64 or 128.  dtypes float16 and
    bfloat16 (products accumulate in float32; P and dS are cast to the input dtype for
    their products; softmax statistics are float32).  A CUDA device of compute capability
    9.x (Hopper): wgmma, TMA and warp specialisation exist nowhere else; anything else is a
    clear error before any kernel runs (``GluonUnavailable`` on a machine without one).
    is_causal: query i sees keys j <= i, top-left aligned (absolute indices, as the other
    flavours).  scale: softmax scale, default 1/sqrt(d).
    Strides: TMA reads q, k, v in place when the head dim is contiguous and every other
    stride and the base are multiples of 16 bytes; otherwise the input is copied once.
    Returns O in the input dtype, dense in q's memory order (as the Triton flavour).
    Saved for backward: q, k, v, O and L = logsumexp of the scaled scores (natural log,
    float32, shape q.shape[:-1], contiguous), the only saved tensor of that shape.
    Host path: a plan per call signature (validated once); its whole call (allocations and
    launches) is one C++ pass (native_launch.py), unless that is switched off; the
    Function's repeats find that pass by the call's key in C++, with no plan look-up.  With
    ``LLM_SYSTEMS_CALL_GRAPHS=1`` a call that recurs with its tensors at the same addresses
    instead replays its launches from a CUDA graph (call_graphs.py: D, dQ's float32 sums and the
    split forward's partial sums then live with the graph).

Schedule
    Every kernel: one program per tile, split between two consumer warpgroups (the default
    partition and a 4-warp worker, each its own half of the tile's rows), and a one-warp
    loader partition that issues TMA loads into a STAGES-deep ring of shared-memory slots.
    Each slot has a "ready" mbarrier (TMA completes it) and an "empty" one that counts an
    arrival from each consumer once its MMAs that read the slot have retired; a consumer
    syncs only its own 128 threads, so the two drift and one's softmax overlaps the other's
    products.
    Forward: persistent, at most one program per SM; each walks work items (a 128-row query
    tile of a batch-head, 64 rows a consumer; on grids of at least a wave of 192-row items,
    WIDE_FORWARD_CONFIGS, 192 rows over three consumers, each of which issues one product at a
    time, _fwd_tiles_in_turn, while the others' fill the tensor cores) in rounds
    (_round_item), and its loader brings the next item's Q, K and V while the consumers
    finish the last item's products and store
    its O (Q is reloaded once every consumer's last S has retired; the ring's count runs on
    across items).  Causal grids whose heads run in groups get one program an item instead
    (_forward_programs: static rounds would not balance their items).  Grids whose query
    tiles leave SMs idle (batch 1, one head: CS336's sweep) cut each tile's keys into splits
    (_forward_splits; at d 64 from four key tiles, MIN_KEY_TILES_TO_SPLIT); a split stores its
    unnormalised acc, running max and sum in float32, and the Triton flavour's combine kernel
    merges them into O and L (launched as the forward's
    programmatic dependent where the forward leaves half the SMs idle).  At d 64 a forward
    over at most two key tiles whose query tiles are at most two an SM runs the Triton
    flavour's forward kernel instead (TRITON_FORWARD_KEYS: there a program's work is shorter
    than this kernel's set-up).  Per key tile j a two-consumer forward's consumer
    (_fwd_tiles_overlapped) issues S_j = Q K_j^T, then O += P_{j-1} V_{j-1}, both asynchronous;
    waits for S_j alone, frees K_j's slot, runs the softmax of tile j while the P V product
    is in flight, then waits for it, frees V's slot and rescales O by exp(m_{j-1} - m_j).
    ptxas moves that last wait above the softmax unless a branch stands between them: d 128
    has one (never taken; full attention 1.7-3.5 % faster), d 64 none (level or slower).
    Backward: a dK/dV kernel (one program per key tile, 64 keys a consumer, Q_i and dO_i
    from the ring) that reads D_i = rowsum(dO_i * O_i) and L; P = exp(S - L) is recomputed
    and N_q x N_k is never stored.  Its loader warp also reads each Q_i's rows of L and D
    into a float32 ring beside Q's (mbarrier stats_ready; freed with Q's slot), so the
    consumers take them from shared memory, their global loads out of the loop.
    d 64: five products a tile; the dK/dV kernel also
    forms dS_i K over its keys and adds it into a float32 dQ by a TMA reduction, between a
    kernel that stores D and zeroes dQ and one that scales and casts it.  The consumers
    write their halves of dS_i^T into one of two shared-memory slots (mbarriers ds_full,
    count 2, and ds_free); they take turns by tile parity at the product over both halves,
    and the one whose turn it was stages the partial after issuing the next tile's S and dP.
    d 128: five products too, with scores in query rows (S = Q K^T; a row's L and
    D take a thread 2 registers, not 16); P and dS go through shared memory for the dV and
    dK products, and each consumer adds half of dQ_i's columns.  The consumers see K and V
    through a one-slot ring at an index the compiler cannot fold (_fixed_tile_at), so the
    operands' wgmma descriptors are formed each tile, not held (spilled) in registers.  The
    reductions land in a varying order, so dQ may differ in its last bits between calls; dK
    and dV are the same bits on every call.  Under torch.use_deterministic_algorithms(True):
    seven products, deterministic; a dQ kernel (one program per query tile, K_j and V_j from
    the ring) that first stores D, then the dK/dV kernel without dQ.
    Small grids (ONE_LAUNCH_CONFIGS: at most a wave of SMs at d 64, half one at d 128, dQ and
    dK/dV programs counted together): the backward is the Triton flavour's one-launch kernel
    instead, its dQ programs and dK/dV programs in one grid, each computing the D rows it needs
    from O and dO; one launch and no scratch, deterministic (CS336's sweep at N <= 4096, where a
    backward's launches cost more than its products).
    Grid order: one-dimensional, a group of heads' tiles adjacent (_tile_and_head_at), the
    group as many heads as fill a quarter of L2 with what the programs stream (K and V, or
    Q, dO and dQ's sums), every head where all fit; so the resident programs share their
    operands in L2 instead of reading every head's from HBM again each wave.  Causal
    grids run a group's longest tiles first.  The causal query-row dK/dV kernel keeps a
    (B * H, key tiles) grid, heads fastest (see _BackwardPlan).
    Phases: slot s of tile i waits on parity (i // STAGES) & 1; the loader's first pass
    waits on parity 1 of the empty barrier, which a fresh mbarrier reports complete.
"""

from __future__ import annotations

import functools
import operator
import os
from dataclasses import dataclass

import torch
import triton

from impl.attention import call_graphs, native_launch
from impl.attention.call_graphs import CallGraphs
from impl.attention.flash_triton import BackwardConfig
from impl.attention.host_plans import PlanCache, as_4d, dense_strides_like, signature
from impl.attention.triton_launch import Launch, fast_stream
from impl.attention.validation import validate_attention_inputs

try:  # Gluon ships with Triton >= 3.4; the Hopper modules need nothing of the machine to import
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    GLUON_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - older Triton
    GLUON_IMPORT_ERROR = exc

GLUON_DTYPES = (torch.float16, torch.bfloat16)
GLUON_HEAD_DIMS = (64, 128)
LOG2E = 1.4426950408889634


class GluonUnavailable(RuntimeError):
    """This machine cannot run the Gluon flavour (no Hopper GPU, or no Gluon in Triton)."""


def hopper_reason(device: torch.device | None = None) -> str | None:
    """Why the Gluon kernels cannot run on ``device`` (default: the current CUDA device), or None."""
    if GLUON_IMPORT_ERROR is not None:
        return f"this Triton ({triton.__version__}) has no Gluon Hopper modules: {GLUON_IMPORT_ERROR}"
    if not torch.cuda.is_available():
        return "the Gluon flavour needs a Hopper GPU (compute capability 9.x); this machine has no CUDA device"
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if major != 9:
        name = torch.cuda.get_device_name(index)
        return (f"the Gluon flavour needs a Hopper GPU (compute capability 9.x); cuda:{index} is {name} "
                f"(compute capability {major}.{minor})")
    return None


# ---------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------

if GLUON_IMPORT_ERROR is None:
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """global[tile at coord] += src (shared memory), one bulk TMA reduction done in L2
        (cp.reduce.async.bulk.tensor): Gluon 3.6's builder has the op, its tma module no
        wrapper.  Completion is awaited like a TMA store's (``tma.store_wait``)."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)

    @gluon.jit
    def _let_dependents_launch():
        """griddepcontrol.launch_dependents: a kernel launched after this one as its programmatic
        dependent (launch_pdl: the split forward's combine) may start now; it waits for this
        grid's end itself (griddepcontrol.wait) before it reads what this grid stores."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.constexpr_function
    def _mma_layout(n, num_warps):
        """wgmma accumulator layout: warps stacked along M (16 rows each), n columns an instruction."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])

    @gluon.constexpr_function
    def _operand_a(parent):
        """Register layout of a 16-bit A operand of a wgmma whose accumulator has ``parent``."""
        return gl.DotOperandLayout(operand_index=0, parent=parent, k_width=2)

    @gluon.jit
    def _tile(bufs, slot, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
        """Slot ``slot`` of a ring of (1, 1, BLOCK, HEAD_DIM) TMA tiles, seen as a matrix."""
        return bufs.index(slot).reshape([BLOCK, HEAD_DIM])

    @gluon.jit
    def _fixed_tile_at(one_slot, i, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
        """The tile a program keeps for its whole loop (a ring of one slot), seen as a matrix at
        iteration i through the index i >> 30: 0 for any loop of fewer than 2^30 tiles, but not a
        constant to the compiler.  So the wgmma descriptors of its products' k-steps (64 bits each,
        16 for K and V at d 128) are formed again each iteration from the slot's address, a few
        uniform-register adds, instead of being held in registers across the loop: the d 128
        dK/dV consumers spilled them (68 bytes full, 204 causal; 12-26 reloads an iteration)."""
        return _tile(one_slot, i >> 30, BLOCK, HEAD_DIM)

    @gluon.jit
    def _tile_and_head(n_tiles, group_heads):
        """This program's tile and batch-head in a one-dimensional grid of n_tiles * B * H
        (_tile_and_head_at)."""
        return _tile_and_head_at(gl.program_id(0), gl.num_programs(0) // n_tiles, n_tiles, group_heads)

    @gluon.jit
    def _tile_and_head_at(index, n_heads, n_tiles, group_heads):
        """Work item ``index`` of n_tiles * n_heads: its tile and batch-head, heads in groups
        of group_heads, a group's items adjacent, tile-major inside it.  The programs resident
        at once stream only their group's operands, which the host sizes to fit in L2 (with
        every head at once, B4 H16 N4096 d128 read K and V from HBM again each wave); inside a
        group tile 0 comes first, the longest when causal (the caller maps tiles so), and the
        order ends on a group's shortest tiles."""
        per_group = group_heads * n_tiles
        first_head = (index // per_group) * group_heads
        heads = gl.minimum(group_heads, n_heads - first_head)
        r = index % per_group
        return r // heads, first_head + r % heads

    @gluon.jit
    def _release(empty_bars, slot):
        """This consumer's warps are all past the wait of the MMAs that read the slot: hand it
        back (one thread arrives for the warpgroup; the barrier is the partition's own, its
        128 threads; the slot is free once both consumers have arrived)."""
        gl.thread_barrier()
        mbarrier.arrive(empty_bars.index(slot), count=1)

    @gluon.jit
    def _load_pair(a_desc, b_desc, a_bufs, b_bufs, a_ready, a_empty, b_ready, b_empty, b_i, h_i, row, slot, phase):
        """The loader warp's one step of a ring: the tiles of A and B at ``row`` into ring slot
        ``slot``, each once its consumers have freed the slot (empty barrier, phase ``phase ^ 1``)."""
        mbarrier.wait(a_empty.index(slot), phase ^ 1)
        mbarrier.expect(a_ready.index(slot), a_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [b_i, h_i, row, 0], a_ready.index(slot), a_bufs.index(slot))
        mbarrier.wait(b_empty.index(slot), phase ^ 1)
        mbarrier.expect(b_ready.index(slot), b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(b_desc, [b_i, h_i, row, 0], b_ready.index(slot), b_bufs.index(slot))

    @gluon.jit
    def _load_ring(a_desc, b_desc, a_bufs, b_bufs, a_ready, a_empty, b_ready, b_empty,
                   b_i, h_i, first_tile, n_tiles, BLOCK: gl.constexpr, STAGES: gl.constexpr):
        """The loader warp: tiles first_tile .. first_tile + n_tiles - 1 of A and B, in order."""
        for i in range(n_tiles):
            _load_pair(a_desc, b_desc, a_bufs, b_bufs, a_ready, a_empty, b_ready, b_empty, b_i, h_i,
                       (first_tile + i) * BLOCK, i % STAGES, (i // STAGES) & 1)

    @gluon.jit
    def _load_ring_with_stats(q_desc, do_desc, q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty, stats,
                              stats_ready, lse_ptr, delta_ptr, row0, n_q, b_i, h_i, first_tile, n_tiles,
                              BLOCK: gl.constexpr, STAGES: gl.constexpr):
        """_load_ring of Q and dO for the dK/dV consumers, and each query tile's L (in log2 units;
        inf past the end, so that P is 0 there) and D, read by this warp into ``stats`` (slot s:
        L at 2 s, D at 2 s + 1) and completed on stats_ready.  A slot's L and D are free when its
        Q is (q_empty): each consumer reads them before it releases Q.  One warp's loads, ahead
        of the tile, replace each consumer's own, whose latency sat in its loop before the first
        exp2 (ncu, d 128 dK/dV: perf/results/2026-11-28-h200-dq-staging-and-goals/)."""
        layout: gl.constexpr = gl.BlockedLayout([BLOCK // 32], [32], [1], [0])
        for i in range(n_tiles):
            slot = i % STAGES
            phase = (i // STAGES) & 1
            row = (first_tile + i) * BLOCK
            # Q's empty barrier frees the slot's L and D too
            _load_pair(q_desc, do_desc, q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty, b_i, h_i, row, slot,
                       phase)
            rows = row + gl.arange(0, BLOCK, layout=layout)
            in_q = rows < n_q
            lse = gl.load(lse_ptr + row0 + rows, mask=in_q, other=float("inf"))
            stats.index(2 * slot).store(lse * 1.4426950408889634)
            stats.index(2 * slot + 1).store(gl.load(delta_ptr + row0 + rows, mask=in_q, other=0.0))
            mbarrier.arrive(stats_ready.index(slot), count=1)  # Triton syncs the warp first: all 32 lanes' stores

    @gluon.jit
    def _tile_stats(stats, stats_ready, slot, phase, layout: gl.constexpr, STAGES: gl.constexpr,
                    MUTANT: gl.constexpr):
        """The L (log2 units) and D of the query tile in ring slot ``slot``, in ``layout``."""
        mbarrier.wait(stats_ready.index(slot), phase)
        if MUTANT == 9:  # the kept mutant 9 reads the rows of the slot after its own
            slot = (slot + 1) % STAGES
        return stats.index(2 * slot).load(layout), stats.index(2 * slot + 1).load(layout)

    @gluon.jit
    def _online_softmax(s, m_i, l_i, key_start, q_start, n_k, qk_scale,
                        IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        s_layout: gl.constexpr, SKIP_RESCALE: gl.constexpr):
        """One key tile of the online softmax (raw-score units for m; exp2 with scale*log2 e).
        Masks only tiles that cross the end of the keys or the causal diagonal."""
        crosses_end = key_start + BLOCK_N > n_k
        crosses_diagonal = IS_CAUSAL and key_start + BLOCK_N - 1 > q_start
        if crosses_end or crosses_diagonal:
            cols = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            keep = cols[None, :] < n_k
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        if SKIP_RESCALE:  # a kept mutant: the running output is not rescaled when the max moves
            alpha = gl.full_like(m_new, 1.0)
        else:
            alpha = gl.exp2((m_i - m_new) * qk_scale)
        p = gl.exp2(s * qk_scale - (m_new * qk_scale)[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def _round_item(r):
        """A persistent program's work item in round r: the programs take items r * P ..
        r * P + P - 1 (P programs), program p item p in even rounds and P - 1 - p in odd ones,
        a snake, so that the program with a round's longest causal item has the next round's
        shortest (round-robin, program 0 always had the longest: 10 % slower at the
        leaderboard shape than one program an item)."""
        n_programs = gl.num_programs(0)
        pid = gl.program_id(0)
        return r * n_programs + pid + (r & 1) * (n_programs - 1 - 2 * pid)

    @gluon.jit
    def _rounds(n_items):
        """Rounds in which this persistent program has an item (_round_item) of n_items."""
        n_programs = gl.num_programs(0)
        pid = gl.program_id(0)
        full = n_items // n_programs
        last = pid + (full & 1) * (n_programs - 1 - 2 * pid)  # this program's place in the last round
        n = full
        if last < n_items - full * n_programs:
            n = full + 1
        return n

    @gluon.jit
    def _fwd_work(t, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits, chunk,
                  IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr):
        """Forward work item t: its batch, head, first query row, first key tile and number
        of key tiles, whether its sums count, and its split.  SPLIT: item t is split
        t % n_splits of query tile t // n_splits, key tiles [split chunk, (split + 1) chunk)
        of those the tile sees; a split past them runs key tile 0 and is discarded (its sums
        stored as acc = 0, m = -inf, l = 0, which the combine weighs 0), so every item has
        work and the two partitions' protocol stays the same."""
        split = 0
        if SPLIT:
            split = t % n_splits
            t = t // n_splits
        m_tile, bh = _tile_and_head_at(t, n_bh, n_m_tiles, group_heads)
        if IS_CAUSAL:  # the tiles with the most keys first, so the last round is short ones
            m_tile = n_m_tiles - 1 - m_tile
        q_start = m_tile * BLOCK_M
        if IS_CAUSAL:
            n_tiles = gl.cdiv(gl.minimum(n_k, q_start + BLOCK_M), BLOCK_N)
        else:
            n_tiles = gl.cdiv(n_k, BLOCK_N)
        first = 0
        keep = True
        if SPLIT:
            first = split * chunk
            keep = first < n_tiles
            n_tiles = gl.where(keep, gl.minimum(n_tiles - first, chunk), 1)
            first = gl.where(keep, first, 0)
        return bh // H, bh % H, bh, q_start, first, n_tiles, keep, split

    @gluon.jit
    def _fwd_loader(q_desc, k_desc, v_desc, q_smem, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                    v_empty, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits, chunk,
                    IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    SPLIT: gl.constexpr):
        """The loader warp: per work item of this program, Q once every consumer is done with
        the last one's, then its K and V tiles into the ring (one count across items, so the
        next item's first tiles land while the consumers finish the last one)."""
        Q_PARTS: gl.constexpr = BLOCK_M // q_desc.block_type.shape[2]
        c = 0  # ring uses so far
        n_items = 0
        for r in range(_rounds(n_m_tiles * n_bh * n_splits)):
            t = _round_item(r)
            b_i, h_i, bh, q_start, first, n_tiles, _, _ = _fwd_work(t, n_m_tiles, n_bh, group_heads, H, n_q, n_k,
                                                                    n_splits, chunk, IS_CAUSAL, BLOCK_M, BLOCK_N,
                                                                    SPLIT)
            mbarrier.wait(q_empty.index(0), (n_items & 1) ^ 1)
            mbarrier.expect(q_ready, Q_PARTS * q_desc.block_type.nbytes)
            for part in gl.static_range(Q_PARTS):  # one TMA box a consumer where BLOCK_M is not a power of two
                tma.async_copy_global_to_shared(q_desc, [b_i, h_i, q_start + part * (BLOCK_M // Q_PARTS), 0], q_ready,
                                                q_smem.index(part))
            for j in range(n_tiles):
                _load_pair(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, b_i, h_i,
                           (first + j) * BLOCK_N, c % STAGES, (c // STAGES) & 1)
                c += 1
            n_items += 1

    @gluon.jit
    def _fwd_tiles_overlapped(q_tile, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, lse_ptr,
                              acc, m_i, l_i, c, first, n_tiles, q_start, n_k, qk_scale,
                              IS_CAUSAL: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                              HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, MUTANT: gl.constexpr):
        """A work item's key tiles for one warpgroup of two: S_j issued before P_{j-1} V_{j-1},
        the softmax of tile j under that product (ring uses c .. c + n_tiles - 1).  Q's slot is
        handed back once the item's last S has retired.  Returns acc, m and l."""
        s_layout: gl.constexpr = _mma_layout(BLOCK_N, 4)
        o_layout: gl.constexpr = _mma_layout(HEAD_DIM, 4)
        p_layout: gl.constexpr = _operand_a(o_layout)
        dtype: gl.constexpr = q_tile.dtype
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        # The kept mutant 2 waits on the wrong parity: a fresh barrier reports it complete at once.
        flip: gl.constexpr = 1 if MUTANT == 2 else 0
        # Tile 0: its scores and softmax, no product in flight yet.
        slot = c % STAGES
        mbarrier.wait(k_ready.index(slot), ((c // STAGES) & 1) ^ flip)
        s = warpgroup_mma(q_tile, _tile(k_bufs, slot, BLOCK_N, HEAD_DIM).permute((1, 0)), s_zero,
                          use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        _release(k_empty, slot)
        if MUTANT == 6:  # the kept mutant 6 hands Q back after the item's first scores, not its last
            _release(q_empty, 0)
        p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, first * BLOCK_N, q_start, n_k, qk_scale, IS_CAUSAL,
                                             ROWS, BLOCK_N, s_layout, MUTANT == 3)
        if MUTANT == 1:
            mbarrier.wait(v_ready.index(slot), (c // STAGES) & 1)
            _release(v_empty, slot)
        for j in range(1, n_tiles):
            prev = (c + j - 1) % STAGES
            slot = (c + j) % STAGES
            mbarrier.wait(k_ready.index(slot), (((c + j) // STAGES) & 1) ^ flip)
            s_tok = warpgroup_mma(q_tile, _tile(k_bufs, slot, BLOCK_N, HEAD_DIM).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            if MUTANT != 1:
                mbarrier.wait(v_ready.index(prev), ((c + j - 1) // STAGES) & 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma(p_op, _tile(v_bufs, prev, BLOCK_N, HEAD_DIM), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok, ))  # S_j retired; P_{j-1} V_{j-1} may still run
            _release(k_empty, slot)
            p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, (first + j) * BLOCK_N, q_start, n_k, qk_scale,
                                                 IS_CAUSAL, ROWS, BLOCK_N, s_layout, MUTANT == 3)
            if MUTANT == 1:  # the kept mutant 1 hands V_j's slot back as soon as V_j lands, a product early
                mbarrier.wait(v_ready.index(slot), ((c + j) // STAGES) & 1)
                _release(v_empty, slot)
            if HEAD_DIM > 64:  # ptxas hoists the wait below above the softmax (SASS: no overlap with P V)
                if n_k < 0:  # never taken: a block boundary it does not move the wait across
                    gl.store(lse_ptr + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout)), l_i)
            acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
            if MUTANT != 1:
                _release(v_empty, prev)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        if MUTANT != 6:
            _release(q_empty, 0)  # every S of this item has retired: the loader may bring the next Q
        last = (c + n_tiles - 1) % STAGES
        if MUTANT != 1:
            mbarrier.wait(v_ready.index(last), ((c + n_tiles - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, _tile(v_bufs, last, BLOCK_N, HEAD_DIM), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        if MUTANT != 1:
            _release(v_empty, last)
        return acc, m_i, l_i

    @gluon.jit
    def _fwd_tiles_in_turn(q_tile, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                           acc, m_i, l_i, c, first, n_tiles, q_start, n_q, n_k, qk_scale,
                           IS_CAUSAL: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                           HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, MUTANT: gl.constexpr):
        """A work item's key tiles for one warpgroup of three: one product at a time (S_j,
        its softmax, P_j V_j), the other warpgroups' products filling the tensor cores meanwhile.
        Only the tiles its own rows see are computed: none past the queries' end (a head's last
        item has rows to spare), none past its rows' causal diagonal; the rest it only passes
        through the ring (waits for them, hands them back).  Returns acc, m and l."""
        s_layout: gl.constexpr = _mma_layout(BLOCK_N, 4)
        o_layout: gl.constexpr = _mma_layout(HEAD_DIM, 4)
        p_layout: gl.constexpr = _operand_a(o_layout)
        dtype: gl.constexpr = q_tile.dtype
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        flip: gl.constexpr = 1 if MUTANT == 2 else 0  # the kept mutant 2 (_fwd_tiles_overlapped)
        n_live = n_tiles
        if IS_CAUSAL:
            n_live = gl.minimum(n_tiles, gl.cdiv(gl.minimum(n_k, q_start + ROWS), BLOCK_N) - first)
        if q_start >= n_q:
            n_live = 0
        if MUTANT == 6:  # the kept mutant 6 hands Q back after the item's first scores, not its last
            if n_live == 0:
                _release(q_empty, 0)
        for j in range(n_live):
            slot = (c + j) % STAGES
            mbarrier.wait(k_ready.index(slot), (((c + j) // STAGES) & 1) ^ flip)
            s = warpgroup_mma(q_tile, _tile(k_bufs, slot, BLOCK_N, HEAD_DIM).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s, ))
            _release(k_empty, slot)
            if MUTANT == 6:
                if j == 0:
                    _release(q_empty, 0)
            p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, (first + j) * BLOCK_N, q_start, n_k, qk_scale,
                                                 IS_CAUSAL, ROWS, BLOCK_N, s_layout, MUTANT == 3)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.wait(v_ready.index(slot), ((c + j) // STAGES) & 1)
            if MUTANT == 1:  # the kept mutant 1 hands V_j's slot back as soon as V_j lands, a product early
                _release(v_empty, slot)
            acc = warpgroup_mma(p_op, _tile(v_bufs, slot, BLOCK_N, HEAD_DIM), acc, is_async=True)
            acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
            if MUTANT != 1:
                _release(v_empty, slot)
        for j in range(n_live, n_tiles):
            slot = (c + j) % STAGES
            mbarrier.wait(k_ready.index(slot), ((c + j) // STAGES) & 1)
            _release(k_empty, slot)
            mbarrier.wait(v_ready.index(slot), ((c + j) // STAGES) & 1)
            _release(v_empty, slot)
        if MUTANT != 6:
            _release(q_empty, 0)  # every S of this item has retired
        return acc, m_i, l_i

    @gluon.jit
    def _fwd_consumer(q_tile, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                      o_ptr, lse_ptr, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits, chunk, qk_scale, sm_scale,
                      stride_ob, stride_oh, stride_on,
                      IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                      HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, SPLIT: gl.constexpr,
                      MUTANT: gl.constexpr, OVERLAP: gl.constexpr):
        """One warpgroup's ROWS query rows (rows WG * ROWS .. of each work item's BLOCK_M), over
        every key tile of each of this program's work items (each slot's empty barrier, and
        Q's, counts every consumer's arrival).  OVERLAP: two consumers, each overlapping its
        softmax with its own products (_fwd_tiles_overlapped); else three, each a product at a
        time (_fwd_tiles_in_turn)."""
        s_layout: gl.constexpr = _mma_layout(BLOCK_N, 4)
        o_layout: gl.constexpr = _mma_layout(HEAD_DIM, 4)
        dtype: gl.constexpr = q_tile.dtype
        c = 0  # ring uses so far, as the loader counts them
        n_items = 0
        for r in range(_rounds(n_m_tiles * n_bh * n_splits)):
            t = _round_item(r)
            _, _, _, q_start, first, n_tiles, _, _ = _fwd_work(t, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits,
                                                               chunk, IS_CAUSAL, BLOCK_M, BLOCK_N, SPLIT)
            q_start += WG * ROWS
            m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
            acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

            mbarrier.wait(q_ready, n_items & 1)
            if OVERLAP:
                acc, m_i, l_i = _fwd_tiles_overlapped(q_tile, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                                                      lse_ptr, acc, m_i, l_i, c, first, n_tiles, q_start, n_k, qk_scale,
                                                      IS_CAUSAL, ROWS, BLOCK_N, HEAD_DIM, STAGES, MUTANT)
            else:
                acc, m_i, l_i = _fwd_tiles_in_turn(q_tile, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                                                   acc, m_i, l_i, c, first, n_tiles, q_start, n_q, n_k, qk_scale,
                                                   IS_CAUSAL, ROWS, BLOCK_N, HEAD_DIM, STAGES, MUTANT)
            c += n_tiles

            # O = acc / l; L = m * scale + ln l (natural log, per query row).  The item's batch-head
            # is derived again here rather than kept through the loop (registers).
            b_i, h_i, bh, _, _, _, keep, split = _fwd_work(t, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits,
                                                           chunk, IS_CAUSAL, BLOCK_M, BLOCK_N, SPLIT)
            rows = q_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
            cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
            lse_rows = q_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
            if SPLIT:  # this split's unnormalised acc, running max and sum (the combine kernel's input)
                if MUTANT == 5:  # the kept mutant 5 stores a discarded split's sums (key tile 0 once more)
                    keep = n_tiles > 0
                part = (split * n_bh + bh).to(gl.int64)
                acc = gl.where(keep, acc, 0.0)
                gl.store(o_ptr + part * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + cols[None, :], acc,
                         mask=(rows < n_q)[:, None])
                gl.store(lse_ptr + 2 * part * n_q + lse_rows, gl.where(keep, m_i, float("-inf")),
                         mask=lse_rows < n_q)
                gl.store(lse_ptr + (2 * part + 1) * n_q + lse_rows, gl.where(keep, l_i, 0.0), mask=lse_rows < n_q)
            else:
                l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
                out = (acc / l_o[:, None]).to(dtype)
                o_base = o_ptr + b_i * stride_ob + h_i * stride_oh
                gl.store(o_base + rows[:, None] * stride_on + cols[None, :], out, mask=(rows < n_q)[:, None])
                lse = m_i * sm_scale + gl.log(l_i)
                gl.store(lse_ptr + bh * n_q + lse_rows, lse, mask=lse_rows < n_q)
            n_items += 1

    @gluon.jit
    def _flash_fwd_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, H, n_q, n_k, qk_scale, sm_scale,
                          stride_ob, stride_oh, stride_on, n_bh, group_heads, n_splits, chunk,
                          IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                          num_warps: gl.constexpr, SPLIT: gl.constexpr, MUTANT: gl.constexpr,
                          CONSUMERS: gl.constexpr, OVERLAP: gl.constexpr):
        # Persistent: each program walks work items (a BLOCK_M query tile of a batch-head)
        # program_id, + num_programs, ... in _tile_and_head_at's order.  CONSUMERS consumer
        # warpgroups (the default partition, num_warps=4, and 4-warp workers), BLOCK_M //
        # CONSUMERS rows each, and the loader warp.  Q lands in CONSUMERS TMA boxes where
        # BLOCK_M (192) is not a power of two, in one box otherwise.
        ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        n_m_tiles = gl.cdiv(n_q, BLOCK_M)
        if SPLIT:  # the combine's programs take the idle SMs and wait there (a split grid fits in one wave)
            _let_dependents_launch()

        dtype: gl.constexpr = q_desc.dtype
        Q_PARTS: gl.constexpr = BLOCK_M // q_desc.block_type.shape[2]
        q_smem = gl.allocate_shared_memory(dtype, [Q_PARTS] + q_desc.block_type.shape, q_desc.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(q_empty.index(0), count=CONSUMERS)  # one arrival from each consumer warpgroup
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=CONSUMERS)

        if CONSUMERS == 3:  # Q in three boxes, one a consumer
            gl.warp_specialize([
                (_fwd_consumer, (_tile(q_smem, 0, ROWS, HEAD_DIM), q_ready, q_empty, k_bufs, v_bufs, k_ready,
                                 k_empty, v_ready, v_empty, o_ptr, lse_ptr, n_m_tiles, n_bh, group_heads, H, n_q,
                                 n_k, n_splits, chunk, qk_scale, sm_scale, stride_ob, stride_oh, stride_on,
                                 IS_CAUSAL, BLOCK_M, ROWS, BLOCK_N, HEAD_DIM, STAGES, 0, SPLIT, MUTANT, OVERLAP)),
                (_fwd_consumer, (_tile(q_smem, 1, ROWS, HEAD_DIM), q_ready, q_empty, k_bufs, v_bufs, k_ready,
                                 k_empty, v_ready, v_empty, o_ptr, lse_ptr, n_m_tiles, n_bh, group_heads, H, n_q,
                                 n_k, n_splits, chunk, qk_scale, sm_scale, stride_ob, stride_oh, stride_on,
                                 IS_CAUSAL, BLOCK_M, ROWS, BLOCK_N, HEAD_DIM, STAGES, 1, SPLIT, MUTANT, OVERLAP)),
                (_fwd_consumer, (_tile(q_smem, 2, ROWS, HEAD_DIM), q_ready, q_empty, k_bufs, v_bufs, k_ready,
                                 k_empty, v_ready, v_empty, o_ptr, lse_ptr, n_m_tiles, n_bh, group_heads, H, n_q,
                                 n_k, n_splits, chunk, qk_scale, sm_scale, stride_ob, stride_oh, stride_on,
                                 IS_CAUSAL, BLOCK_M, ROWS, BLOCK_N, HEAD_DIM, STAGES, 2, SPLIT, MUTANT, OVERLAP)),
                (_fwd_loader, (q_desc, k_desc, v_desc, q_smem, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty,
                               v_ready, v_empty, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits, chunk,
                               IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, SPLIT)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        else:
            q_rows = q_smem.index(0).reshape([BLOCK_M, HEAD_DIM])
            gl.warp_specialize([
                (_fwd_consumer, (q_rows.slice(0, ROWS), q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                 v_empty, o_ptr, lse_ptr, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits, chunk,
                                 qk_scale, sm_scale, stride_ob, stride_oh, stride_on,
                                 IS_CAUSAL, BLOCK_M, ROWS, BLOCK_N, HEAD_DIM, STAGES, 0, SPLIT, MUTANT, OVERLAP)),
                (_fwd_consumer, (q_rows.slice(ROWS, ROWS), q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                 v_empty, o_ptr, lse_ptr, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits, chunk,
                                 qk_scale, sm_scale, stride_ob, stride_oh, stride_on,
                                 IS_CAUSAL, BLOCK_M, ROWS, BLOCK_N, HEAD_DIM, STAGES, 1, SPLIT, MUTANT, OVERLAP)),
                (_fwd_loader, (q_desc, k_desc, v_desc, q_smem, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty,
                               v_ready, v_empty, n_m_tiles, n_bh, group_heads, H, n_q, n_k, n_splits, chunk,
                               IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, SPLIT)),
            ], [4, 1], [CONSUMER_REGS, 24])

    @gluon.jit
    def _bwd_dq_consumer(q_tile, do_tile, fixed_bar, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                         o_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, b_i, h_i, q_start, n_q, n_k, n_tiles,
                         qk_scale, sm_scale, stride_ob, stride_oh, stride_on, stride_gb, stride_gh, stride_gn,
                         stride_qb, stride_qh, stride_qn, row0,
                         IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """One warpgroup's BLOCK_M query rows from q_start (half of the program's)."""
        s_layout: gl.constexpr = _mma_layout(BLOCK_N, 4)
        o_layout: gl.constexpr = _mma_layout(HEAD_DIM, 4)
        ds_layout: gl.constexpr = _operand_a(o_layout)
        dtype: gl.constexpr = q_tile.dtype
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        # D_i = rowsum(dO_i * O_i), float32, stored for the dK/dV kernel.
        rows_o = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        in_rows = (rows_o < n_q)[:, None]
        o = gl.load(o_ptr + b_i * stride_ob + h_i * stride_oh + rows_o[:, None] * stride_on + cols_o[None, :],
                    mask=in_rows, other=0.0)
        do = gl.load(do_ptr + b_i * stride_gb + h_i * stride_gh + rows_o[:, None] * stride_gn + cols_o[None, :],
                     mask=in_rows, other=0.0)
        delta_o = gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1)
        gl.store(delta_ptr + row0 + rows_o, delta_o, mask=rows_o < n_q)
        delta = gl.convert_layout(delta_o, row_layout)
        rows = q_start + gl.arange(0, BLOCK_M, layout=row_layout)
        lse2 = gl.load(lse_ptr + row0 + rows, mask=rows < n_q, other=float("inf")) * 1.4426950408889634

        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        mbarrier.wait(fixed_bar, 0)
        for j in range(n_tiles):
            slot = j % STAGES
            phase = (j // STAGES) & 1
            k_tile = _tile(k_bufs, slot, BLOCK_N, HEAD_DIM)
            mbarrier.wait(k_ready.index(slot), phase)
            s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(slot), phase)
            dp = warpgroup_mma(do_tile, _tile(v_bufs, slot, BLOCK_N, HEAD_DIM).permute((1, 0)), s_zero,
                               use_acc=False, is_async=True)
            s, dp = warpgroup_mma_wait(0, deps=(s, dp))
            _release(v_empty, slot)
            p = gl.exp2(s * qk_scale - lse2[:, None])
            key_start = j * BLOCK_N
            if key_start + BLOCK_N > n_k or (IS_CAUSAL and key_start + BLOCK_N - 1 > q_start):
                cols = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                keep = cols[None, :] < n_k
                if IS_CAUSAL:
                    keep = keep & (cols[None, :] <= rows[:, None])
                p = gl.where(keep, p, 0.0)
            ds = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), ds_layout)
            dq = warpgroup_mma(ds, k_tile, dq, is_async=True)
            dq, ds = warpgroup_mma_wait(0, deps=(dq, ds))
            _release(k_empty, slot)
        dq = (dq * sm_scale).to(dtype)
        gl.store(dq_ptr + b_i * stride_qb + h_i * stride_qh + rows_o[:, None] * stride_qn + cols_o[None, :], dq,
                 mask=in_rows)

    @gluon.jit
    def _flash_bwd_dq_kernel(q_desc, do_desc, k_desc, v_desc, o_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr,
                             H, n_q, n_k, qk_scale, sm_scale,
                             stride_ob, stride_oh, stride_on, stride_gb, stride_gh, stride_gn,
                             stride_qb, stride_qh, stride_qn, group_heads,
                             IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                             HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                             num_warps: gl.constexpr):
        # Two consumer warpgroups of BLOCK_M // 2 query rows each, as the forward's.
        ROWS: gl.constexpr = BLOCK_M // 2
        n_m_tiles = gl.cdiv(n_q, BLOCK_M)
        m_tile, bh = _tile_and_head(n_m_tiles, group_heads)
        if IS_CAUSAL:
            m_tile = n_m_tiles - 1 - m_tile
        b_i = bh // H
        h_i = bh % H
        q_start = m_tile * BLOCK_M
        if IS_CAUSAL:
            n_tiles = gl.cdiv(gl.minimum(n_k, q_start + BLOCK_M), BLOCK_N)
        else:
            n_tiles = gl.cdiv(n_k, BLOCK_N)

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        fixed_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(fixed_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # one arrival from each consumer warpgroup
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=2)
        mbarrier.expect(fixed_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b_i, h_i, q_start, 0], fixed_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [b_i, h_i, q_start, 0], fixed_bar, do_smem)

        q_tile = q_smem.reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_smem.reshape([BLOCK_M, HEAD_DIM])
        gl.warp_specialize([
            (_bwd_dq_consumer, (q_tile.slice(0, ROWS), do_tile.slice(0, ROWS), fixed_bar,
                                k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                                o_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, b_i, h_i, q_start, n_q, n_k, n_tiles,
                                qk_scale, sm_scale, stride_ob, stride_oh, stride_on, stride_gb, stride_gh, stride_gn,
                                stride_qb, stride_qh, stride_qn, bh * n_q,
                                IS_CAUSAL, ROWS, BLOCK_N, HEAD_DIM, STAGES)),
            (_bwd_dq_consumer, (q_tile.slice(ROWS, ROWS), do_tile.slice(ROWS, ROWS), fixed_bar,
                                k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                                o_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, b_i, h_i, q_start + ROWS, n_q, n_k,
                                n_tiles, qk_scale, sm_scale, stride_ob, stride_oh, stride_on,
                                stride_gb, stride_gh, stride_gn, stride_qb, stride_qh, stride_qn, bh * n_q,
                                IS_CAUSAL, ROWS, BLOCK_N, HEAD_DIM, STAGES)),
            (_load_ring, (k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                          b_i, h_i, 0, n_tiles, BLOCK_N, STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])

    @gluon.jit
    def _stage_dq(dq, dq_smem, dqacc_desc, b_i, h_i, q_start, col, BLOCK_M: gl.constexpr, COLS: gl.constexpr):
        """dQ[q_start : q_start + BLOCK_M, col : col + COLS] += dq (float32, a partial of this
        warpgroup's): through dq_smem, once the previous reduction has read it, by one TMA
        reduction."""
        tma.store_wait(0)  # the issuing thread's previous reduction has read dq_smem ...
        gl.thread_barrier()  # ... and every thread of the warpgroup knows it
        dq_smem.reshape([BLOCK_M, COLS]).store(dq)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(dqacc_desc, [b_i, h_i, q_start, col], dq_smem)

    @gluon.jit
    def _bwd_dkdv_consumer(k_tile, v_tile, fixed_bar, q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty,
                           dk_ptr, dv_ptr, stats, stats_ready, b_i, h_i, key_start, first_tile, n_q, n_k, n_tiles,
                           qk_scale, sm_scale, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                           k_full, ds_bufs, ds_full, ds_free, dq_smem, dqacc_desc,
                           IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, FUSE_DQ: gl.constexpr,
                           WG: gl.constexpr, MUTANT: gl.constexpr):
        """One warpgroup's BLOCK_N keys from key_start (half of the program's; WG says which).
        FUSE_DQ: also dQ_i += dS_i K over the program's keys (five products a tile).  Each
        consumer writes its dS^T half into a slot of ds_bufs and arrives on ds_full; the two
        take turns (tile parity) at the product over both halves, which frees the slot
        (ds_free), and at staging its float32 partial through dq_smem into dqacc_desc by a TMA
        reduction: one product, one partial, one reduction a tile."""
        # Transposed scores: rows are this warpgroup's keys, columns a tile of queries.
        st_layout: gl.constexpr = _mma_layout(BLOCK_M, 4)
        kv_layout: gl.constexpr = _mma_layout(HEAD_DIM, 4)
        op_layout: gl.constexpr = _operand_a(kv_layout)
        dtype: gl.constexpr = k_tile.dtype
        col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
        keys = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))

        st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
        if FUSE_DQ:
            dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, kv_layout)
            dq = dq_zero  # tile i - 1's partial, staged under tile i's first products
        mbarrier.wait(fixed_bar, 0)
        for i in range(n_tiles):
            slot = i % STAGES
            phase = (i // STAGES) & 1
            q_start = (first_tile + i) * BLOCK_M
            queries = q_start + gl.arange(0, BLOCK_M, layout=col_layout)
            in_q = queries < n_q
            q_tile = _tile(q_bufs, slot, BLOCK_M, HEAD_DIM)
            do_tile = _tile(do_bufs, slot, BLOCK_M, HEAD_DIM)
            mbarrier.wait(q_ready.index(slot), phase)
            st = warpgroup_mma(k_tile, q_tile.permute((1, 0)), st_zero, use_acc=False, is_async=True)
            mbarrier.wait(do_ready.index(slot), phase)
            dpt = warpgroup_mma(v_tile, do_tile.permute((1, 0)), st_zero, use_acc=False, is_async=True)
            lse2, delta = _tile_stats(stats, stats_ready, slot, phase, col_layout, STAGES, MUTANT)  # from the loader warp
            if FUSE_DQ:
                if i > 0:
                    if (i - 1) % 2 == WG:  # tile i - 1's dQ partial, this consumer's turn (retired there)
                        _stage_dq(dq, dq_smem, dqacc_desc, b_i, h_i, q_start - BLOCK_M, 0, BLOCK_M, HEAD_DIM)
            st, dpt = warpgroup_mma_wait(0, deps=(st, dpt))
            pt = gl.exp2(st * qk_scale - lse2[None, :])
            # d 64: masks only on tiles that cross the end of the queries or keys, or the
            # diagonal.  d 128 masks every tile: there the branch costs ptxas registers the
            # kernel has none of (more spills; 6 to 8 % slower, measured on an H200).
            crosses_end = q_start + BLOCK_M > n_q or key_start + BLOCK_N > n_k
            crosses_diagonal = IS_CAUSAL and key_start + BLOCK_N - 1 > q_start
            if HEAD_DIM > 64 or crosses_end or crosses_diagonal:
                keep = in_q[None, :] & (keys[:, None] < n_k)
                if IS_CAUSAL:
                    keep = keep & (keys[:, None] <= queries[None, :])
                pt = gl.where(keep, pt, 0.0)
            dst = (pt * (dpt - delta[None, :])).to(dtype)
            pt_op = gl.convert_layout(pt.to(dtype), op_layout)
            dst_op = gl.convert_layout(dst, op_layout)
            dv = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
            dk = warpgroup_mma(dst_op, q_tile, dk, is_async=True)
            if FUSE_DQ:  # dS^T to shared memory under those two: dQ's product reads it as A = dS
                ds_slot = i % 2
                ds_use = i // 2
                mbarrier.wait(ds_free.index(ds_slot), (ds_use & 1) ^ 1)  # tile i - 2's product has read it
                ds_bufs.index(ds_slot).slice(WG * BLOCK_N, BLOCK_N).store(dst)
                fence_async_shared()
                _release(ds_full, ds_slot)
            dv, dk, pt_op, dst_op = warpgroup_mma_wait(0, deps=(dv, dk, pt_op, dst_op))
            if FUSE_DQ:
                if i % 2 == WG:  # this consumer's turn: both halves, all the program's keys
                    mbarrier.wait(ds_full.index(ds_slot), ds_use & 1)
                    dq_next = warpgroup_mma(ds_bufs.index(ds_slot).permute((1, 0)), k_full, dq_zero, use_acc=False,
                                            is_async=True)
                    dq = warpgroup_mma_wait(0, deps=(dq_next,))
                    _release(ds_free, ds_slot)
            _release(do_empty, slot)
            _release(q_empty, slot)
        if FUSE_DQ:
            # the kept mutant 4 never stages the last tile's partial
            if n_tiles > 0 and (n_tiles - 1) % 2 == WG and MUTANT != 4:
                _stage_dq(dq, dq_smem, dqacc_desc, b_i, h_i, (first_tile + n_tiles - 1) * BLOCK_M, 0, BLOCK_M,
                          HEAD_DIM)
            tma.store_wait(0)
        rows = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
        in_rows = (rows < n_k)[:, None]
        gl.store(dk_ptr + b_i * stride_kb + h_i * stride_kh + rows[:, None] * stride_kn + cols[None, :],
                 (dk * sm_scale).to(dtype), mask=in_rows)
        gl.store(dv_ptr + b_i * stride_vb + h_i * stride_vh + rows[:, None] * stride_vn + cols[None, :],
                 dv.to(dtype), mask=in_rows)

    @gluon.jit
    def _bwd_dkdv_rows_consumer(k_slot, v_slot, fixed_bar, q_bufs, do_bufs, q_ready, q_empty, do_ready,
                                do_empty, dk_ptr, dv_ptr, stats, stats_ready, b_i, h_i, key_start, first_tile, n_q,
                                n_k, n_tiles, qk_scale, sm_scale, stride_kb, stride_kh, stride_kn,
                                stride_vb, stride_vh, stride_vn, p_smem, ds_bufs, ds_full, ds_free, dq_smem,
                                dqacc_desc, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
                                MUTANT: gl.constexpr):
        """The five-product dK/dV consumer with scores in query rows (S = Q K^T, not K Q^T):
        one warpgroup's BLOCK_N keys.  A row's L and D take a thread 2 registers, not 16, which
        d 128 needs beside dK and dV.  P and dS go through shared memory, where the dV and dK
        products read them transposed; dS fills this consumer's half (its keys) of a slot of
        ds_bufs, and once both halves are in (ds_full), each consumer forms dQ_i's columns
        WG * d/2 .. (WG + 1) * d/2 over all the program's keys and adds them into dQ by a TMA
        reduction; the slot is free once both products have retired (ds_free, count 2).
        k_slot and v_slot: the program's K and V (both consumers' keys), rings of one slot
        (_fixed_tile_at)."""
        s_layout: gl.constexpr = _mma_layout(BLOCK_N, 4)  # rows: a tile of queries; columns: this consumer's keys
        kv_layout: gl.constexpr = _mma_layout(HEAD_DIM, 4)
        DQ_COLS: gl.constexpr = HEAD_DIM // 2
        dq_layout: gl.constexpr = _mma_layout(DQ_COLS, 4)
        dtype: gl.constexpr = k_slot.dtype
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        keys = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        dq_zero = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, dq_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
        mbarrier.wait(fixed_bar, 0)
        for i in range(n_tiles):
            slot = i % STAGES
            phase = (i // STAGES) & 1
            q_start = (first_tile + i) * BLOCK_M
            queries = q_start + gl.arange(0, BLOCK_M, layout=row_layout)
            in_q = queries < n_q
            q_tile = _tile(q_bufs, slot, BLOCK_M, HEAD_DIM)
            do_tile = _tile(do_bufs, slot, BLOCK_M, HEAD_DIM)
            k_all = _fixed_tile_at(k_slot, i, 2 * BLOCK_N, HEAD_DIM)
            k_tile = k_all.slice(WG * BLOCK_N, BLOCK_N)  # this consumer's keys
            v_tile = _fixed_tile_at(v_slot, i, 2 * BLOCK_N, HEAD_DIM).slice(WG * BLOCK_N, BLOCK_N)
            # dQ's columns of this consumer: K's rows of each consumer's keys, this consumer's columns
            k_lo = k_all.slice(0, BLOCK_N, dim=0).slice(WG * DQ_COLS, DQ_COLS, dim=1)
            k_hi = k_all.slice(BLOCK_N, BLOCK_N, dim=0).slice(WG * DQ_COLS, DQ_COLS, dim=1)
            mbarrier.wait(q_ready.index(slot), phase)
            s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(do_ready.index(slot), phase)
            dp = warpgroup_mma(do_tile, v_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            lse2, delta = _tile_stats(stats, stats_ready, slot, phase, row_layout, STAGES, MUTANT)  # from the loader warp
            s, dp = warpgroup_mma_wait(0, deps=(s, dp))
            p = gl.exp2(s * qk_scale - lse2[:, None])
            crosses_end = q_start + BLOCK_M > n_q or key_start + BLOCK_N > n_k
            crosses_diagonal = IS_CAUSAL and key_start + BLOCK_N - 1 > q_start
            if crosses_end or crosses_diagonal:
                keep = in_q[:, None] & (keys[None, :] < n_k)
                if IS_CAUSAL:
                    keep = keep & (keys[None, :] <= queries[:, None])
                p = gl.where(keep, p, 0.0)
            ds = (p * (dp - delta[:, None])).to(dtype)
            ds_slot = i % 2
            ds_use = i // 2
            ds_mine = ds_bufs.index(2 * ds_slot + WG)
            p_smem.store(p.to(dtype))  # the last tile's dV product, its reader, has retired
            mbarrier.wait(ds_free.index(ds_slot), (ds_use & 1) ^ 1)  # tile i - 2's dQ products have read it
            ds_mine.store(ds)
            fence_async_shared()
            _release(ds_full, ds_slot)  # also: every thread's P and dS are in before the products below
            dv = warpgroup_mma(p_smem.permute((1, 0)), do_tile, dv, is_async=True)
            dk = warpgroup_mma(ds_mine.permute((1, 0)), q_tile, dk, is_async=True)
            # dQ's two products queued behind dV's and dK's, no wait between them (at B4 H16 N4096
            # d128 full 2.89 against 3.02 ms waiting for dV and dK first, on an H200)
            mbarrier.wait(ds_full.index(ds_slot), ds_use & 1)  # the other consumer's half is in
            dq = warpgroup_mma(ds_bufs.index(2 * ds_slot), k_lo, dq_zero, use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_bufs.index(2 * ds_slot + 1), k_hi, dq, is_async=True)
            dv, dk = warpgroup_mma_wait(2, deps=(dv, dk))  # groups retire in order: dV's and dK's are done
            _release(do_empty, slot)
            _release(q_empty, slot)
            dq = warpgroup_mma_wait(0, deps=(dq, ))
            _release(ds_free, ds_slot)
            if MUTANT != 4 or i < n_tiles - 1:  # the kept mutant 4 never adds the last tile's partial
                _stage_dq(dq, dq_smem, dqacc_desc, b_i, h_i, q_start, WG * DQ_COLS, BLOCK_M, DQ_COLS)
        tma.store_wait(0)
        rows = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
        in_rows = (rows < n_k)[:, None]
        gl.store(dk_ptr + b_i * stride_kb + h_i * stride_kh + rows[:, None] * stride_kn + cols[None, :],
                 (dk * sm_scale).to(dtype), mask=in_rows)
        gl.store(dv_ptr + b_i * stride_vb + h_i * stride_vh + rows[:, None] * stride_vn + cols[None, :],
                 dv.to(dtype), mask=in_rows)

    @gluon.jit
    def _flash_bwd_dkdv_kernel(k_desc, v_desc, q_desc, do_desc, dqacc_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr,
                               H, n_q, n_k, qk_scale, sm_scale,
                               stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, group_heads,
                               IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                               FUSE_DQ: gl.constexpr, MUTANT: gl.constexpr, num_warps: gl.constexpr):
        # Two consumer warpgroups of BLOCK_N // 2 keys each over the same query tiles.
        # FUSE_DQ: each also adds its dS K into the float32 dQ (dqacc_desc; unread otherwise),
        # at d 128 with scores in query rows (_bwd_dkdv_rows_consumer).
        KEYS: gl.constexpr = BLOCK_N // 2
        ROWS: gl.constexpr = FUSE_DQ and HEAD_DIM > 64
        if ROWS and IS_CAUSAL:  # a (B * H, key tiles) grid, heads fastest (see _BackwardPlan)
            bh = gl.program_id(0)
            n_tile = gl.program_id(1)
        else:
            n_tile, bh = _tile_and_head(gl.cdiv(n_k, BLOCK_N), group_heads)
        b_i = bh // H
        h_i = bh % H
        key_start = n_tile * BLOCK_N
        n_q_tiles = gl.cdiv(n_q, BLOCK_M)
        first_tile = 0
        if IS_CAUSAL:  # queries before key_start see none of these keys
            first_tile = gl.minimum(key_start // BLOCK_M, n_q_tiles)
        n_tiles = n_q_tiles - first_tile

        dtype: gl.constexpr = k_desc.dtype
        k_slot = gl.allocate_shared_memory(dtype, [1] + k_desc.block_type.shape, k_desc.layout)  # rings of one
        v_slot = gl.allocate_shared_memory(dtype, [1] + v_desc.block_type.shape, v_desc.layout)  # (_fixed_tile_at)
        k_smem = k_slot.index(0)
        v_smem = v_slot.index(0)
        q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
        do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
        fixed_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(fixed_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=2)  # one arrival from each consumer warpgroup
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(do_empty.index(i), count=2)
        # Each Q slot's L and D (float32 rows), filled by the loader warp (_load_ring_with_stats)
        stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M],
                                          gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        stats_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(stats_ready.index(i), count=1)
        if ROWS:  # P of each consumer; dS in two slots of two halves (one a consumer); dQ's staging buffers
            pds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, KEYS], dtype)
            p_0 = gl.allocate_shared_memory(dtype, [BLOCK_M, KEYS], pds_layout)
            p_1 = gl.allocate_shared_memory(dtype, [BLOCK_M, KEYS], pds_layout)
            ds_bufs = gl.allocate_shared_memory(dtype, [4, BLOCK_M, KEYS], pds_layout)
            ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(2):
                mbarrier.init(ds_full.index(i), count=2)  # each consumer's half written
                mbarrier.init(ds_free.index(i), count=2)  # each consumer's dQ product has read both
            dq_0 = gl.allocate_shared_memory(gl.float32, dqacc_desc.block_type.shape, dqacc_desc.layout)
            dq_1 = gl.allocate_shared_memory(gl.float32, dqacc_desc.block_type.shape, dqacc_desc.layout)
        mbarrier.expect(fixed_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b_i, h_i, key_start, 0], fixed_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [b_i, h_i, key_start, 0], fixed_bar, v_smem)

        k_tile = k_smem.reshape([BLOCK_N, HEAD_DIM])
        v_tile = v_smem.reshape([BLOCK_N, HEAD_DIM])
        if ROWS:
            gl.warp_specialize([
                (_bwd_dkdv_rows_consumer, (k_slot, v_slot, fixed_bar,
                                           q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty,
                                           dk_ptr, dv_ptr, stats, stats_ready, b_i, h_i, key_start, first_tile, n_q,
                                           n_k, n_tiles, qk_scale, sm_scale, stride_kb, stride_kh, stride_kn,
                                           stride_vb, stride_vh, stride_vn, p_0, ds_bufs, ds_full, ds_free,
                                           dq_0, dqacc_desc, IS_CAUSAL, BLOCK_M, KEYS, HEAD_DIM, STAGES, 0, MUTANT)),
                (_bwd_dkdv_rows_consumer, (k_slot, v_slot, fixed_bar,
                                           q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty,
                                           dk_ptr, dv_ptr, stats, stats_ready, b_i, h_i, key_start + KEYS,
                                           first_tile, n_q, n_k, n_tiles, qk_scale, sm_scale,
                                           stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                                           p_1, ds_bufs, ds_full, ds_free,
                                           dq_1, dqacc_desc, IS_CAUSAL, BLOCK_M, KEYS, HEAD_DIM, STAGES, 1, MUTANT)),
                (_load_ring_with_stats, (q_desc, do_desc, q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty,
                                         stats, stats_ready, lse_ptr, delta_ptr, bh * n_q, n_q, b_i, h_i, first_tile,
                                         n_tiles, BLOCK_M, STAGES)),
            ], [4, 1], [CONSUMER_REGS, 24])
        else:
            if FUSE_DQ:  # dS^T of the program's keys in two slots, and a consumer's partial on its way
                ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
                ds_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
                ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
                ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
                for i in gl.static_range(2):
                    mbarrier.init(ds_full.index(i), count=2)  # each consumer's half written
                    mbarrier.init(ds_free.index(i), count=1)  # the product over both has retired
                dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dqacc_desc.block_type.shape, dqacc_desc.layout)
                dq_0, dq_1 = dq_smem.index(0), dq_smem.index(1)
            else:
                ds_bufs, ds_full, ds_free, dq_0, dq_1 = None, None, None, None, None
            gl.warp_specialize([
                (_bwd_dkdv_consumer, (k_tile.slice(0, KEYS), v_tile.slice(0, KEYS), fixed_bar,
                                      q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty,
                                      dk_ptr, dv_ptr, stats, stats_ready, b_i, h_i, key_start, first_tile, n_q, n_k,
                                      n_tiles, qk_scale, sm_scale, stride_kb, stride_kh, stride_kn,
                                      stride_vb, stride_vh, stride_vn, k_tile, ds_bufs, ds_full, ds_free,
                                      dq_0, dqacc_desc, IS_CAUSAL, BLOCK_M, KEYS, HEAD_DIM, STAGES, FUSE_DQ, 0, MUTANT)),
                (_bwd_dkdv_consumer, (k_tile.slice(KEYS, KEYS), v_tile.slice(KEYS, KEYS), fixed_bar,
                                      q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty,
                                      dk_ptr, dv_ptr, stats, stats_ready, b_i, h_i, key_start + KEYS, first_tile, n_q,
                                      n_k, n_tiles, qk_scale, sm_scale, stride_kb, stride_kh, stride_kn,
                                      stride_vb, stride_vh, stride_vn, k_tile, ds_bufs, ds_full, ds_free,
                                      dq_1, dqacc_desc, IS_CAUSAL, BLOCK_M, KEYS, HEAD_DIM, STAGES, FUSE_DQ, 1, MUTANT)),
                (_load_ring_with_stats, (q_desc, do_desc, q_bufs, do_bufs, q_ready, q_empty, do_ready, do_empty,
                                         stats, stats_ready, lse_ptr, delta_ptr, bh * n_q, n_q, b_i, h_i, first_tile,
                                         n_tiles, BLOCK_M, STAGES)),
            ], [4, 1], [CONSUMER_REGS, 24])


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GluonConfig:
    """Tiles of one kernel: BLOCK_M query rows and BLOCK_N keys a tile (each kernel splits its
    program's tile between ``consumers`` consumer warpgroups), STAGES ring slots, num_warps the
    default partition's warps (one warpgroup, the first consumer; the other consumers and
    the loader warp come on top), maxnreg the per-thread register cap at launch that warp
    specialisation redistributes (loader 24, each worker consumer consumer_regs, the default
    partition the rest).  consumers 3: the forward's one-product-at-a-time consumers
    (_fwd_tiles_in_turn); a block of 16 warps (the loader warp padded to a warpgroup) launches
    with at most 128 registers a thread."""

    block_m: int
    block_n: int
    stages: int
    num_warps: int = 4
    maxnreg: int = 168
    consumer_regs: int = 240
    consumers: int = 2


# From perf.tune.gluon_configs on an H200 (perf/results/2026-11-27-h200-gluon-attention/).
FORWARD_CONFIGS = {64: GluonConfig(128, 128, 2), 128: GluonConfig(128, 128, 2)}
# Grids of at least a wave of 192-row items (so no key splits): three consumers of 64 rows,
# each a product at a time, 160 registers each, no spills (ptxas).  A K/V tile serves 192 query
# rows, not 128.  On an H200, do_bench: B4 H16 N4096 d 128 full 2.5 % and the leaderboard shape
# 6 % faster than FORWARD_CONFIGS; at the 700 W power cap level with them
# (perf/results/2026-11-29-h200-three-consumer-forward/).  Smaller grids keep the table above:
# a consumer without overlap waits out its own latencies where nothing else runs, and a causal
# split of 192 rows could hold no keys of its own (block_n % block_m).
WIDE_FORWARD_CONFIGS = {64: GluonConfig(192, 128, 3, maxnreg=128, consumer_regs=160, consumers=3),
                        128: GluonConfig(192, 128, 2, maxnreg=128, consumer_regs=160, consumers=3)}
# LLM_SYSTEMS_GLUON_WIDE_FORWARD=0: every forward on FORWARD_CONFIGS (the tier's laws_kernels
# step holds the two-consumer kernel to the laws at grids of many items that way).
WIDE_FORWARD = os.environ.get("LLM_SYSTEMS_GLUON_WIDE_FORWARD", "1") != "0"
BACKWARD_DQ_CONFIGS = {64: GluonConfig(128, 128, 2), 128: GluonConfig(128, 64, 2)}
BACKWARD_DKDV_CONFIGS = {64: GluonConfig(64, 128, 3), 128: GluonConfig(64, 128, 2)}
# The five-product backward (dQ added by TMA reductions): untuned, the dK/dV kernel's tiles;
# d 128 runs the query-row form (_bwd_dkdv_rows_consumer), two slots as its shared memory
# holds.
BACKWARD_FUSED_CONFIGS = {64: GluonConfig(64, 128, 3), 128: GluonConfig(64, 128, 2)}

# Kept mutants of the schedule and the host path (conformance.mutants.attention; the last one is
# the host-plan test's, properties/test_gluon_host_plans.py): 0 is the kernel.
MUTANTS = {"v_slot_freed_before_its_product": 1, "ready_phase_off_by_one": 2, "rescale_skipped": 3,
           "last_dq_partial_never_added": 4, "discarded_split_counted": 5, "q_freed_before_its_last_scores": 6,
           "graph_keyed_without_outputs": 7, "bound_key_without_strides": 8,
           "stats_read_from_the_next_slot": 9, "combine_reads_before_the_forward_ends": 10}
GRAPH_KEYED_WITHOUT_OUTPUTS = 7  # host mutants: the kernels are the unmutated ones
BOUND_KEY_WITHOUT_STRIDES = 8
# The forward plan's combine launched early without its wait (kernels unmutated): rejected by the
# host-plan test on the CPU; the GPU laws see the race too seldom to hold it (see that test).
COMBINE_READS_EARLY = 10
# show only when a call recurs
HOST_MUTANTS = ("graph_keyed_without_outputs", "bound_key_without_strides", "combine_reads_before_the_forward_ends")


_GL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, _GL_DTYPES[dtype]))


def _tma_ok(t4: torch.Tensor) -> bool:
    """TMA can read this (B, H, N, d) tensor in place: head dim contiguous, base and every
    other stride a positive multiple of 16 bytes."""
    size = t4.element_size()
    return (t4.stride(-1) == 1 and t4.data_ptr() % 16 == 0
            and all(s > 0 and (s * size) % 16 == 0 for s in t4.stride()[:-1]))


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy in a fresh allocation (16-byte aligned, as every torch allocation):
    ``contiguous()`` would hand back a contiguous tensor that starts off alignment unchanged."""
    return t.clone(memory_format=torch.contiguous_format)


def _descriptor(t4: torch.Tensor, block_rows: int, block_cols: int | None = None):
    """A host TMA descriptor of a (B, H, N, d) tensor in (1, 1, block_rows, block_cols) tiles
    (default: all d columns); rows past N read as zeros."""
    block = (1, 1, block_rows, block_cols or t4.shape[-1])
    return TensorDescriptor(t4, list(t4.shape), list(t4.stride()), list(block), _smem_layout(block, t4.dtype))


# The share of L2 a group of heads' streamed operands may fill (_tile_and_head), where all
# heads' do not fit: a quarter was the fastest of 1, 1/2, 1/4 and one head a group on an H200.
L2_SHARE = 0.25


@functools.lru_cache(maxsize=None)
def _l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 50 << 20  # the launch-binding tests on the CPU: an H100's
    return torch.cuda.get_device_properties(device).L2_cache_size


def _group_heads(n_heads: int, per_head_bytes: int, device: torch.device) -> int:
    """How many heads' programs run adjacent (_tile_and_head).  All of them where all heads'
    streamed operands fit in L2: heads fastest, so that causal grids run every head's longest
    tiles first.  Otherwise as many as fit L2_SHARE of it."""
    l2 = _l2_bytes(device)
    if n_heads * per_head_bytes <= l2:
        return n_heads
    return max(1, min(n_heads, int(L2_SHARE * l2) // max(per_head_bytes, 1)))


@functools.lru_cache(maxsize=None)
def _resident_programs(device: torch.device) -> int:
    """Programs of a persistent kernel: one per SM (registers and shared memory hold one)."""
    if device.type != "cuda":
        return 132  # the launch-binding tests on the CPU: an H100's
    return torch.cuda.get_device_properties(device).multi_processor_count


def _forward_programs(items: int, causal: bool, all_heads_one_group: bool, device: torch.device) -> int:
    """Programs of the persistent forward: one an SM where its static rounds share the work out
    evenly, else one an item (the hardware hands out items as SMs free up).  Full attention's
    items are all alike.  Causal items shorten down the order; the snake rounds balance that
    when the order is one run longest to shortest (every head one group), not when it starts
    again at each group of heads: at the leaderboard shape (groups of 3 heads) the rounds
    left 20 % more work on the busiest program than on the average one
    (perf/scripts/persistent_schedule.py) and the forward ran 10 % slower on an H200."""
    if causal and not all_heads_one_group:
        return items
    return min(items, _resident_programs(device))


# Fewest key tiles a split of the forward's keys gets (_forward_splits), and the query rows a
# program of the combine kernel merges.  On an H200 at B1 H1 (perf/scripts/gluon_small_grids.py,
# forward and combine, us): 16-row combine programs against 64, N 2048: 10.6-11.4 against 12.4
# (d 64), 13.6-14.4 against 16.5 (d 128).  Splits of one key tile (perf/scripts/
# gluon_forward_splits.py --kernels, the combine unrolled): the forward and combine kernels take
# 0.6-2.2 us less than two-tile splits at N 512 and 1024, and at N 256 two splits take 0.7-1.3 us
# less than none, which the combine's launch as a programmatic dependent no longer gives back
# (kernels only: what a split costs the host is weighed in MIN_KEY_TILES_TO_SPLIT).
MIN_SPLIT_TILES = 1
COMBINE_ROWS = 16
# The combine launched as the forward's programmatic dependent (launch_pdl): the forward lets it
# launch at once (_let_dependents_launch) and it waits on the SMs the forward leaves idle, so no
# launch gap lies between the two: 0.5-1.3 us less a call where the forward's grid leaves half the
# SMs idle or more.  On a grid of 128 programs it cost 0.8-1.0 us (its programs then wait beside
# the forward's), so there it is launched plainly.
COMBINE_PDL = True
# Fewest key tiles a query tile must see for its keys to be split, by head dim.  A split costs
# the host a second launch and two scratch allocations; at d 64 a program walks 2-3 key tiles in
# about the time of the launch, so splitting them gains no device time: at B1 H1 N 256 one split
# and two were level (10.40 and 10.45 us, do_bench), while the split's host time was 34.5 us
# against flash's unsplit 24.0 (medians of 21 rounds; 1.11 x paired), the sweep's only short
# misses on the host (perf/results/2026-11-29-h200-tier-at-head-and-split-mutant).  At d 128 a key tile takes twice
# as long, and at N 256 the unsplit causal kernel took 10.1 us against 7.1 + 1.5 split.
MIN_KEY_TILES_TO_SPLIT = {64: 4, 128: 2}


def _forward_splits(items: int, key_tiles: int, device: torch.device, head_dim: int | None = None) -> int:
    """Into how many splits the forward cuts each query tile's keys (split-KV): the largest
    power of two that keeps items x splits within a program an SM and each split at least
    MIN_SPLIT_TILES key tiles; 1 (no split) on a grid that fills the GPU, or with fewer key
    tiles than MIN_KEY_TILES_TO_SPLIT gives the head dim.  At batch 1 and one head (CS336's
    sweep), N 4096 gives 32 query tiles for 132 SMs, and each program's key loop is the whole
    time: SDPA flash splits such grids and ran 23 us against our 40 on an H100
    (perf/scripts/gluon_small_grids.py)."""
    splits, programs = 1, _resident_programs(device)
    if key_tiles < MIN_KEY_TILES_TO_SPLIT.get(head_dim, 2):
        return splits
    while items * splits * 2 <= programs and key_tiles // (splits * 2) >= MIN_SPLIT_TILES:
        splits *= 2
    return splits


# The one-launch backward on grids that leave SMs idle: the Triton flavour's kernel whose dQ and
# dK/dV programs share one grid, each computing the D rows it needs (flash_triton.
# _flash_bwd_one_launch_kernel).  One launch and three allocations a backward instead of three and
# five, deterministic, and twice the programs of the dK/dV kernel alone.  Measured on an H200 at
# B1 H1, N 128-4096 (perf/scripts/gluon_one_launch.py, perf/results/2026-11-29-h200-one-launch-backward):
# d 64 with 64 x 64 tiles took less device time than the three launches at every N (87 against
# 103 us at N 4096 causal) and at up to 384 programs wider; d 128 (64 x 32 tiles) did up to
# N 1024, was level at N 2048 (64 programs) and 3-14 % slower at N 4096.  The host issued a
# backward a median of 28 us sooner.  Per head dim: (config, the most programs, dQ's and dK/dV's
# together, that take it, in SMs: d 64 one wave, d 128 half).  LLM_SYSTEMS_GLUON_ONE_LAUNCH=0
# switches it off (the gate and the tier run the flavour's laws so too, so that the Gluon kernels
# meet them at small grids as well).
ONE_LAUNCH_CONFIGS: dict = {64: (BackwardConfig(64, 64, 64, 64, 4, 2, one_launch=True), 1.0),
                            128: (BackwardConfig(64, 32, 64, 32, 4, 2, one_launch=True), 0.5)}
# The forward over at most this many keys (by head dim) on a grid of at most TRITON_FORWARD_WAVES
# 128-row query tiles an SM: the Triton flavour's forward kernel (its own plan's config, pointer
# loads, no split), deterministic like the Gluon one.  Over one or two key tiles a program's
# work is shorter than the warp-specialised kernel's set-up.  Device time on an H200, d 64
# (perf/scripts/gluon_triton_forward.py, perf/results/2026-11-29-h200-short-forward-route):
# Triton / Gluon 0.87-0.98 at N 128 and at N 256 full, from B1 H1 to B8 H16 (256 programs:
# 0.88-0.89 at N 256); 1.03-1.04 at N 256 causal on 2 and 32 programs, still 0.93-0.97 of SDPA
# flash there.  At d 128 it took 0.8-2.8 us more than the Gluon kernel, so d 128 keeps it.
# Switched off with the one launch.
TRITON_FORWARD_KEYS: dict = {64: 256}
TRITON_FORWARD_WAVES = 2  # the most 128-row query tiles a forward it takes has, in SMs
if os.environ.get("LLM_SYSTEMS_GLUON_ONE_LAUNCH", "1") == "0":
    ONE_LAUNCH_CONFIGS = {}
    TRITON_FORWARD_KEYS = {}


def _one_launch_config(batch_heads: int, n_q: int, n_k: int, d: int, device: torch.device, mutant: int):
    """The one-launch backward's config for this grid, or None (the Gluon kernels').  A kept
    mutant of the Gluon kernels always takes the Gluon kernels (its bug lives there)."""
    entry = ONE_LAUNCH_CONFIGS.get(d)
    if entry is None or mutant:
        return None
    cfg, share = entry
    programs = batch_heads * (triton.cdiv(n_q, cfg.dq_block_m) + triton.cdiv(n_k, cfg.dkdv_block_n))
    return cfg if programs <= share * _resident_programs(device) else None


def _triton_forward(batch_heads: int, n_q: int, n_k: int, d: int, device: torch.device, mutant: int) -> bool:
    """Whether this forward runs the Triton flavour's kernel (TRITON_FORWARD_KEYS): few keys, at
    most TRITON_FORWARD_WAVES 128-row query tiles an SM.  A kept mutant of the Gluon kernels
    never does."""
    keys = TRITON_FORWARD_KEYS.get(d)
    return (keys is not None and not mutant and n_k <= keys
            and batch_heads * triton.cdiv(n_q, 128) <= TRITON_FORWARD_WAVES * _resident_programs(device))


def _validate(q, k, v, is_causal, scale) -> float:
    scale = validate_attention_inputs(q, k, v, is_causal, scale, dtypes=GLUON_DTYPES)
    d = q.shape[-1]
    if d not in GLUON_HEAD_DIMS:
        raise ValueError(f"attention (Gluon): unsupported head dim {d}; supported: 64, 128")
    if q.device.type != "cuda":
        raise ValueError(f"attention (Gluon): tensors must be on a CUDA device (Hopper), got {q.device}")
    reason = hopper_reason(q.device)
    if reason:
        raise GluonUnavailable(f"attention (Gluon): {reason}")
    return scale


_PLANS = PlanCache(512)  # (kind, scalars, signature) -> plan, as the Triton flavour's
_plan = _PLANS.get


def _key(kind, tensors, is_causal, scale, extra=()):
    """A plan's key, or None where the arguments cannot have one (validated on every call)."""
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    try:
        key = (kind, type(is_causal), is_causal, type(scale), scale, extra, signature(*tensors))
        hash(key)
    except TypeError:
        return None
    return key


def _launch(kernel, grid, rest, constexprs, cfg: GluonConfig, device, descriptor_rows: tuple):
    """A Launch whose leading arguments are (B, H, N, d) tensors read through TMA in tiles of
    ``descriptor_rows`` rows each, or of (rows, columns) (the launcher encodes their
    descriptors, cached by address)."""
    descriptors = tuple(functools.partial(_descriptor, block_rows=rows[0], block_cols=rows[1]) if isinstance(rows, tuple)
                        else functools.partial(_descriptor, block_rows=rows) for rows in descriptor_rows)
    return Launch(kernel, grid, tuple(rest), {**constexprs, "num_warps": cfg.num_warps}, {"maxnreg": cfg.maxnreg},
                  device, descriptors=descriptors)


class _Pass:
    """What the forward and backward plans share: the call's launches as data, each with the
    names of the tensors it takes (``TENSORS``: inputs, outputs, then scratch), which the Python
    path issues (``_issue``) and the C++ pass registers, from this one list."""

    TENSORS: tuple = ()
    N_INPUTS = 0

    def _steps(self, *steps, scratch: tuple, like: torch.Tensor) -> None:
        self.steps = tuple((step, tuple(self.TENSORS.index(name) for name in names)) for step, names in steps)
        # itemgetter of one index returns the item, not a 1-tuple
        self.picks = tuple((step, operator.itemgetter(*where) if len(where) > 1 else lambda named, i=where[0]: (named[i],))
                           for step, where in self.steps)
        self.scratch = scratch
        self.device_index = like.device.index
        self.native = None  # the C++ pass's id, registered once every launch has a C++ one
        self.native_tried = False
        self.graphs = CallGraphs(like.device, tuple(step for step, _ in self.steps), scratch)

    def _issue(self, key, tensors: tuple) -> None:
        """The launches with ``tensors`` (inputs and outputs, in TENSORS' order), through the
        call graphs (which hand over the scratch)."""
        def launch(*scratch):
            stream = fast_stream(self.device_index)
            named = tensors + scratch
            for step, pick in self.picks:
                step.issue(stream, *pick(named))

        self.graphs.run(key, launch)

    def _native_call(self, inputs: tuple):
        """The outputs from the C++ pass, or None where it cannot launch here or the call graphs
        were switched on after it was registered (``call_graphs.ENABLED`` is read per call)."""
        if call_graphs.ENABLED:
            return None
        stream = fast_stream(self.device_index)
        return None if stream is None else native_launch.run_pass(self.native, stream, inputs)

    def _register_native(self, outputs: tuple) -> None:
        """After a call through Python bound every launch (once a plan): the whole call as one C++
        pass, where the launcher is on, the tensors need no view or copy and no call graph would
        take the call.  ``outputs``: (shape, strides, dtype) of each."""
        self.native_tried = True
        if self.plain and not call_graphs.ENABLED and native_launch.enabled():
            self.native = native_launch.register_pass(self.N_INPUTS, self.steps, outputs, self.scratch)


class _ForwardPlan(_Pass):
    """A forward over inputs of one signature: inputs validated once, outputs' strides and
    the launch (grid, scalars, constexprs) fixed; a call makes the descriptors and launches."""

    def __init__(self, q, k, v, is_causal, scale, mutant):
        self.scale = _validate(q, k, v, is_causal, scale)
        self.inputs_only_key = mutant == GRAPH_KEYED_WITHOUT_OUTPUTS
        combine_waits = mutant != COMBINE_READS_EARLY
        mutant = 0 if self.inputs_only_key or not combine_waits else mutant
        self.is_causal = bool(is_causal)
        self.copy = tuple(not _tma_ok(as_4d(t)) for t in (q, k, v))
        self.plain = all(t.dim() == 4 for t in (q, k, v)) and not any(self.copy)  # as the kernel reads them: no view, no copy
        q4 = as_4d(q)
        B, H, n_q, d = q4.shape
        n_k = k.shape[-2]
        self.cfg = cfg = FORWARD_CONFIGS[d]
        self.o_strides = dense_strides_like(q)
        o4_strides = as_4d(torch.empty_strided(q.shape, self.o_strides, device="meta")).stride()
        self.lse_shape = q.shape[:-1]
        self.parts = self.combine = None
        if _triton_forward(B * H, n_q, n_k, d, q.device, mutant):
            from impl.attention.flash_triton import _ForwardPlan as TritonForwardPlan

            # Pointer loads take any strides: every tensor as it came, none copied.  Its plan's
            # launch, whose strides it fixed from these tensors, and its O strides, ours.
            triton_plan = TritonForwardPlan(q, k, v, is_causal, self.scale)
            assert triton_plan.combine is None and triton_plan.o_strides == self.o_strides
            self.copy = (False,) * 3
            self.plain = all(t.dim() == 4 for t in (q, k, v))
            self.launch = triton_plan.launch
            self._steps((self.launch, ("q", "k", "v", "o", "lse", "lse", "lse")), scratch=(), like=q)  # no split buffers
            return
        group = _group_heads(B * H, 2 * n_k * d * q.element_size(), q.device)  # K and V stream
        items = B * H * triton.cdiv(n_q, cfg.block_m)
        key_tiles = triton.cdiv(n_k, cfg.block_n)
        # A causal split that has keys starts at or before its query tile's first row only where
        # a key tile is a whole number of query tiles (128 and 128 in the table); otherwise a row
        # could see no key of a split, and its running max stay -inf (NaN sums).  So no split there.
        splits = (_forward_splits(items, key_tiles, q.device, head_dim=d)
                  if not self.is_causal or cfg.block_n % cfg.block_m == 0 else 1)
        wide = WIDE_FORWARD_CONFIGS[d]
        if WIDE_FORWARD and splits == 1 and B * H * triton.cdiv(n_q, wide.block_m) >= _resident_programs(q.device):
            self.cfg = cfg = wide  # a wave of 192-row items at least
            items = B * H * triton.cdiv(n_q, cfg.block_m)
        self.launch = _launch(
            _flash_fwd_kernel, (_forward_programs(items * splits, self.is_causal, group == B * H, q.device),),
            (H, n_q, n_k, self.scale * LOG2E, self.scale, *o4_strides[:3], B * H, group, splits,
             triton.cdiv(key_tiles, splits)),
            dict(IS_CAUSAL=self.is_causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d, STAGES=cfg.stages,
                 CONSUMER_REGS=cfg.consumer_regs, SPLIT=splits > 1, MUTANT=mutant, CONSUMERS=cfg.consumers,
                 OVERLAP=cfg.consumers == 2), cfg, q.device,
            (cfg.block_m // cfg.consumers if cfg.block_m & (cfg.block_m - 1) else cfg.block_m, cfg.block_n,
             cfg.block_n))
        if splits > 1:
            # The splits' unnormalised sums and (max, sum) rows, merged by the Triton flavour's
            # combine kernel (the same layout: (splits B H, N, d) and (splits B H, 2, N)).
            from impl.attention.flash_triton import _flash_fwd_combine_kernel, _options

            rows = COMBINE_ROWS
            self.parts = ((splits * B * H, n_q, d), (splits * B * H, 2, n_q))
            # Its loops unrolled for the count (SPLITS); launched as the forward's programmatic
            # dependent where the forward's grid leaves half the SMs idle (COMBINE_PDL).
            options = _options(q.device, 4, 1)
            pdl = options is not None and COMBINE_PDL and 2 * self.launch.grid[0] <= _resident_programs(q.device)
            if options is not None:
                options["launch_pdl"] = pdl
            self.combine = Launch(_flash_fwd_combine_kernel, (triton.cdiv(n_q, rows) * B * H,),
                                  (*o4_strides, H, n_q, triton.cdiv(n_q, rows), splits, self.scale,
                                   self.scale * LOG2E),
                                  dict(HEAD_DIM=d, BLOCK_M=rows, BLOCK_D=d, SPLITS=splits,
                                       WAIT_PRIOR=pdl and combine_waits),
                                  options, q.device)
        if self.combine is None:
            self._steps((self.launch, ("q", "k", "v", "o", "lse")), scratch=(), like=q)
        else:  # the splits' sums: the graph's scratch
            self._steps((self.launch, ("q", "k", "v", "o_part", "ml_part")),
                        (self.combine, ("o_part", "ml_part", "o", "lse")),
                        scratch=tuple((shape, torch.float32) for shape in self.parts), like=q)

    TENSORS = ("q", "k", "v", "o", "lse", "o_part", "ml_part")
    N_INPUTS = 3

    def __call__(self, q, k, v):
        if self.native is not None:
            outputs = self._native_call((q, k, v))
            if outputs is not None:
                return tuple(outputs)
        if self.plain:
            q4, k4, v4 = q, k, v
        else:
            q4, k4, v4 = (as_4d(_aligned_copy(t) if c else t) for t, c in zip((q, k, v), self.copy))
        o = torch.empty_strided(q.shape, self.o_strides, dtype=q.dtype, device=q.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=q.device)
        key = (q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), o.data_ptr(), lse.data_ptr())
        if self.inputs_only_key:
            key = key[:3]
        self._issue(key, (q4, k4, v4, o, lse))  # O by pointer, its strides fixed in the launch
        if not self.native_tried:
            self._register_native(((tuple(q.shape), self.o_strides, q.dtype),
                                   (tuple(self.lse_shape), lse.stride(), torch.float32)))
        return o, lse


class _BackwardPlan(_Pass):
    """A backward over tensors of one signature (q, k, v, O, L, dO), its launches fixed.

    Five products (head dims in BACKWARD_FUSED_CONFIGS, unless torch's deterministic
    algorithms are on): D and a zeroed float32 dQ (the Triton flavour's preprocess kernel),
    the dK/dV kernel adding each tile's dS K into dQ by TMA reductions (their order varies:
    dQ may differ in its last bits between calls), dQ scaled and cast (the Triton flavour's
    convert kernel).  Otherwise seven, deterministic: the dQ kernel (which stores D) then
    the dK/dV kernel."""

    def __init__(self, q, k, v, o, lse, grad_o, is_causal, scale, mutant=0):
        self.scale = _validate(q, k, v, is_causal, scale)
        self.inputs_only_key = mutant == GRAPH_KEYED_WITHOUT_OUTPUTS
        mutant = 0 if self.inputs_only_key else mutant
        for name, t, like in (("O", o, q), ("dO", grad_o, q)):
            if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
                raise ValueError(f"attention backward (Gluon): {name} must match q's shape, dtype and device; got "
                                 f"{tuple(t.shape)} {t.dtype} {t.device}")
        if lse.shape != q.shape[:-1] or lse.dtype != torch.float32 or not lse.is_contiguous():
            raise ValueError(f"attention backward (Gluon): L must be contiguous float32 of shape {tuple(q.shape[:-1])}")
        self.copy = tuple(not _tma_ok(as_4d(t)) for t in (q, k, v, grad_o))
        # every tensor as the kernels read it, no view and no copy (O and dO have q's shape, L is contiguous)
        self.plain = all(t.dim() == 4 for t in (q, k, v)) and not any(self.copy)
        q4, o4 = as_4d(q), as_4d(o)
        B, H, n_q, d = q4.shape
        n_k = k.shape[-2]
        do4 = as_4d(_aligned_copy(grad_o) if self.copy[3] else grad_o)
        self.strides = tuple(dense_strides_like(t) for t in (q, k, v))
        dq4s, dk4s, dv4s = (as_4d(torch.empty_strided(t.shape, s, device="meta")).stride()
                            for t, s in zip((q, k, v), self.strides))
        causal = bool(is_causal)
        one = _one_launch_config(B * H, n_q, n_k, d, q.device, mutant)
        if one is not None:
            from impl.attention.flash_triton import _options, one_launch_backward

            # Pointer loads take any strides: every tensor as it came, none copied (the Gluon
            # kernels' copies of layouts TMA cannot read would not have the strides fixed here).
            self.copy = (False,) * 4
            self.plain = all(t.dim() == 4 for t in (q, k, v))
            self.fused = False
            self.one = one_launch_backward((q4, as_4d(k), as_4d(v), o4, as_4d(grad_o)), (dq4s, dk4s, dv4s), one,
                                           causal, self.scale, False,
                                           _options(q.device, one.num_warps, one.num_stages))
            self._steps((self.one, ("q", "k", "v", "o", "do", "lse", "dq", "dk", "dv")), scratch=(), like=q)
            return
        # Five products at both head dims (d 128 in query rows: at B4 H16 N4096 full 3.03 against
        # 3.33 ms for seven on an H200 once the grid runs a group of heads at a time; with every
        # head at once it had lost, 3.69 against 3.48).
        self.fused = d in BACKWARD_FUSED_CONFIGS and not torch.are_deterministic_algorithms_enabled()
        if self.fused:
            from impl.attention.flash_triton import (_flash_bwd_dq_convert_kernel, _flash_bwd_preprocess_kernel,
                                                     _options)

            cfg = self.dkdv_cfg = BACKWARD_FUSED_CONFIGS[d]
            rows, dev = 64, q.device
            n_p = triton.cdiv(n_q, rows)
            small = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_M=rows)
            self.pre = Launch(_flash_bwd_preprocess_kernel, (n_p * B * H,), (*o4.stride(), *do4.stride(), H, n_q, n_p),
                              small, _options(dev, 4, 1), dev)
            self.convert = Launch(_flash_bwd_dq_convert_kernel, (n_p * B * H,), (*dq4s, H, n_q, n_p, self.scale),
                                  small, _options(dev, 4, 1), dev)
            self.dq_acc_shape = (B, H, n_q, d)
            # Q, dO and dQ's float32 sums stream.  Causal, the query-row form (d 128) keeps a
            # two-dimensional grid, heads fastest: the one-dimensional grid's index arithmetic cost
            # its consumers registers (ptxas spilled 272-284 bytes, not 236) and 16 % at B2 H16
            # N8192 on an H200 (3.84 against 3.24 ms), whatever the grouping.
            heads_fastest = d > 64 and causal
            group = B * H if heads_fastest else _group_heads(B * H, n_q * d * (2 * q.element_size() + 4), dev)
            n_tiles = triton.cdiv(n_k, cfg.block_n)
            self.dkdv = _launch(
                _flash_bwd_dkdv_kernel, (B * H, n_tiles) if heads_fastest else (B * H * n_tiles,),
                (H, n_q, n_k, self.scale * LOG2E, self.scale, *dk4s[:3], *dv4s[:3], group),
                dict(IS_CAUSAL=causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d, STAGES=cfg.stages,
                     CONSUMER_REGS=cfg.consumer_regs, FUSE_DQ=True, MUTANT=mutant), cfg, dev,
                # d 128 (scores in query rows): each consumer adds half of dQ's columns
                (cfg.block_n, cfg.block_n, cfg.block_m, cfg.block_m, (cfg.block_m, d // 2 if d > 64 else d)))
            # D and dQ's float32 sums: the graph's scratch
            self._steps((self.pre, ("o", "do", "delta", "dq_acc")),
                        (self.dkdv, ("k", "v", "q", "do", "dq_acc", "dk", "dv", "lse", "delta")),
                        (self.convert, ("dq_acc", "dq")),
                        scratch=((tuple(lse.shape), torch.float32), (self.dq_acc_shape, torch.float32)), like=q)
            return
        cfg = self.dq_cfg = BACKWARD_DQ_CONFIGS[d]
        self.dq = _launch(
            _flash_bwd_dq_kernel, (B * H * triton.cdiv(n_q, cfg.block_m),),
            (H, n_q, n_k, self.scale * LOG2E, self.scale, *o4.stride()[:3], *do4.stride()[:3], *dq4s[:3],
             _group_heads(B * H, 2 * n_k * d * q.element_size(), q.device)),  # K and V stream
            dict(IS_CAUSAL=causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d, STAGES=cfg.stages,
                 CONSUMER_REGS=cfg.consumer_regs), cfg, q.device, (cfg.block_m, cfg.block_m, cfg.block_n, cfg.block_n))
        cfg = self.dkdv_cfg = BACKWARD_DKDV_CONFIGS[d]
        self.dkdv = _launch(
            _flash_bwd_dkdv_kernel, (B * H * triton.cdiv(n_k, cfg.block_n),),
            (H, n_q, n_k, self.scale * LOG2E, self.scale, *dk4s[:3], *dv4s[:3],
             _group_heads(B * H, 2 * n_q * d * q.element_size(), q.device)),
            dict(IS_CAUSAL=causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d, STAGES=cfg.stages,
                 CONSUMER_REGS=cfg.consumer_regs, FUSE_DQ=False, MUTANT=mutant), cfg, q.device,
            (cfg.block_n, cfg.block_n, cfg.block_m, cfg.block_m, cfg.block_m))
        self._steps((self.dq, ("q", "do", "k", "v", "o", "do", "dq", "lse", "delta")),
                    (self.dkdv, ("k", "v", "q", "do", "q", "dk", "dv", "lse", "delta")),  # q stands in for the unread dQ
                    scratch=((tuple(lse.shape), torch.float32),), like=q)  # D

    TENSORS = ("q", "k", "v", "o", "lse", "do", "dq", "dk", "dv", "delta", "dq_acc")
    N_INPUTS = 6

    def __call__(self, q, k, v, o, lse, grad_o):
        if self.native is not None:
            outputs = self._native_call((q, k, v, o, lse, grad_o))
            if outputs is not None:
                return tuple(outputs)
        dq, dk, dv = (torch.empty_strided(t.shape, s, dtype=t.dtype, device=t.device)
                      for t, s in zip((q, k, v), self.strides))
        if self.plain:
            q4, k4, v4, do4, o4, dq4, dk4, dv4 = q, k, v, grad_o, o, dq, dk, dv
        else:
            q4, k4, v4, do4 = (as_4d(_aligned_copy(t) if c else t) for t, c in zip((q, k, v, grad_o), self.copy))
            o4, dq4, dk4, dv4 = as_4d(o), as_4d(dq), as_4d(dk), as_4d(dv)
        key = (q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), o.data_ptr(), lse.data_ptr(), do4.data_ptr(),
               dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
        if self.inputs_only_key:
            key = key[:6]
        self._issue(key, (q4, k4, v4, o4, lse, do4, dq4, dk4, dv4))
        if not self.native_tried:
            self._register_native(tuple((tuple(t.shape), s, t.dtype) for t, s in zip((q, k, v), self.strides)))
        return dq, dk, dv


def _forward_key(tensors, is_causal, scale, mutant=0):
    return _key("fwd", tensors, is_causal, scale, mutant)


def _backward_key(tensors, is_causal, scale, mutant=0):
    return _key("bwd", tensors, is_causal, scale, (torch.are_deterministic_algorithms_enabled(), mutant))


def native_pass(kind: str, tensors: tuple, is_causal, scale) -> int:
    """The C++ pass (``native_launch.register_pass``) of the plan that a call of ``flash_forward``
    (kind "fwd", tensors q, k, v) or ``flash_backward`` ("bwd", q, k, v, O, L, dO) with these
    arguments took, or -1: what the custom ops' C++ kernels bind to the call's key."""
    key = (_forward_key if kind == "fwd" else _backward_key)(tensors, is_causal, scale)
    plan = None if key is None else _PLANS.plans.get(key)
    return -1 if plan is None or plan.native is None else plan.native


def _forward_plan(q, k, v, is_causal, scale, mutant):
    """(the forward's plan, its key or None)."""
    key = _forward_key((q, k, v), is_causal, scale, mutant)
    build = lambda: _ForwardPlan(q, k, v, is_causal, scale, mutant)  # noqa: E731
    return (build() if key is None else _plan(key, build)), key


def flash_forward(q, k, v, is_causal: bool = False, scale: float | None = None, *, mutant: int = 0):
    """O and L (natural-log logsumexp, float32, q.shape[:-1]) of attention(q, k, v)."""
    return _forward_plan(q, k, v, is_causal, scale, mutant)[0](q, k, v)


def flash_backward(q, k, v, o, lse, grad_o, is_causal: bool = False, scale: float | None = None, *, mutant: int = 0):
    """dQ, dK, dV of attention(q, k, v) given O, L and dO."""
    key = _backward_key((q, k, v, o, lse, grad_o), is_causal, scale, mutant)
    build = lambda: _BackwardPlan(q, k, v, o, lse, grad_o, is_causal, scale, mutant)  # noqa: E731
    return (build() if key is None else _plan(key, build))(q, k, v, o, lse, grad_o)


def _keyed_scalars(is_causal, scale) -> bool:
    """Whether the C++ key (``native_launch.bind``) tells this call's scalars apart as the plan's
    key does: a bool, and a float or None (sent as 0: a real scale is positive)."""
    return type(is_causal) is bool and (scale is None or type(scale) is float)


def _without_strides(tensors) -> list:
    """The kept mutant bound_key_without_strides's key: each tensor as a contiguous meta tensor
    of its shape and dtype (its layout forgotten)."""
    return [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]


def _bound_call(kind: int, tensors: tuple, is_causal, scale, mutant: int = 0):
    """The outputs of the C++ pass bound to this call's key (kind 0 forward, 1 backward), run in
    one call (``native_launch.run_bound``); None where none is bound, the launcher is not built,
    the call graphs are on (read per call, as the plans read it), the stream check declines or
    the scalars are of other types: the plan's path then serves (and binds)."""
    run_bound = native_launch.run_bound
    if run_bound is None or call_graphs.ENABLED or not _keyed_scalars(is_causal, scale):
        return None
    first = tensors[0]  # a CPU tensor's device is -1, which is never the current CUDA device
    stream = fast_stream(first.get_device()) if isinstance(first, torch.Tensor) else None
    if stream is None:
        return None
    scale = 0.0 if scale is None else scale
    try:
        if mutant == BOUND_KEY_WITHOUT_STRIDES:  # looked up by the coarse key, run on the call's tensors
            found = native_launch.bound_pass(kind, _without_strides(tensors), is_causal, scale)
            return None if found < 0 else native_launch.run_pass(found, stream, tensors)
        return run_bound(kind, stream, tensors, is_causal, scale)
    except (TypeError, AttributeError):  # an argument that is no tensor: the plan's path names it
        return None


def _bind(kind: int, tensors: tuple, is_causal, scale, plan, mutant: int = 0) -> None:
    """After the plan's path served a call: its C++ pass bound to the call's key, if it has one."""
    if plan.native is not None and native_launch.bind is not None and _keyed_scalars(is_causal, scale):
        keyed = _without_strides(tensors) if mutant == BOUND_KEY_WITHOUT_STRIDES else tensors
        native_launch.bind(kind, keyed, is_causal, 0.0 if scale is None else scale, plan.native)


def _attention_function(mutant: int):
    # The kernel's repeats take the bound C++ pass (_bound_call); a mutant's keep the plan's path,
    # so that no pass of one is ever bound where the kernel's calls would find it (the host mutant
    # of the key binds the kernel's passes under keys of its own, which no kernel's call has).
    bound = mutant in (0, BOUND_KEY_WITHOUT_STRIDES)
    key_mutant, mutant = mutant, 0 if mutant == BOUND_KEY_WITHOUT_STRIDES else mutant

    class FlashAttentionGluon(torch.autograd.Function):
        """FlashAttention on Hopper in Gluon (see the module contract)."""

        @staticmethod
        def forward(ctx, q, k, v, is_causal=False, scale=None):
            outputs = _bound_call(0, (q, k, v), is_causal, scale, key_mutant) if bound else None
            if outputs is None:
                plan, key = _forward_plan(q, k, v, is_causal, scale, mutant)
                o, lse = plan(q, k, v)
                if bound:
                    _bind(0, (q, k, v), is_causal, scale, plan, key_mutant)
            else:
                (o, lse), key = outputs, None
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal, ctx.scale, ctx.plan_key = bool(is_causal), scale, key
            return o

        @staticmethod
        def backward(ctx, grad_o):
            q, k, v, o, lse = ctx.saved_tensors
            if grad_o.dtype != q.dtype:
                grad_o = grad_o.to(q.dtype)
            tensors = (q, k, v, o, lse, grad_o)
            outputs = _bound_call(1, tensors, ctx.is_causal, ctx.scale, key_mutant) if bound else None
            if outputs is not None:
                dq, dk, dv = outputs
                return dq, dk, dv, None, None
            if ctx.plan_key is None:
                key = _backward_key(tensors, ctx.is_causal, ctx.scale, mutant)
            else:  # O and L came from the forward's plan, which their signatures follow: only dO's is added
                key = ("bwd", ctx.plan_key, signature(grad_o), torch.are_deterministic_algorithms_enabled())
            build = lambda: _BackwardPlan(*tensors, ctx.is_causal, ctx.scale, mutant)  # noqa: E731
            plan = build() if key is None else _plan(key, build)
            dq, dk, dv = plan(*tensors)
            if bound:
                _bind(1, tensors, ctx.is_causal, ctx.scale, plan, key_mutant)
            return dq, dk, dv, None, None

    return FlashAttentionGluon


FlashAttentionGluon = _attention_function(0)


def mutant_function(name: str):
    """The autograd.Function of a kept mutant of the schedule (see MUTANTS)."""
    fn = _attention_function(MUTANTS[name])
    fn.__name__ = fn.__qualname__ = f"FlashAttentionGluon_{name}"
    return fn
