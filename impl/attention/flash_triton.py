"""FlashAttention-2 forward and backward in Triton kernels (Dao, 2023, Algorithms 1 and 2).

Contract
    FlashAttentionTriton.apply(q, k, v, is_causal=False, scale=None) -> O
    q: (..., N_q, d), k and v: (..., N_k, d), equal leading dims, any number of them.
    Any strides: the kernels take strides for two batch levels (batch, head), a sequence
    stride and a head-dim stride, so a (B, N, H, d) tensor transposed to (B, H, N, d) is
    read in place.  Three or more leading dims are merged into two by a view where the
    strides allow it and copied only where they do not.
    N_q, N_k >= 1, any lengths, N_q != N_k allowed.  Head dim d in 1..256; tiles are
    BLOCK_D = next power of two >= max(16, d) wide, the padded columns masked to zero.
    dtypes float16, bfloat16, float32.  float32 dots run with input_precision="ieee" (not
    tf32); float16/bfloat16 dots accumulate in float32 and P is cast to the input dtype
    for the P V product.  Softmax statistics are always float32.
    Devices: CUDA, or CPU under the Triton interpreter (TRITON_INTERPRET=1 set before
    triton is imported).  Under the interpreter, bfloat16 dot operands are widened to
    float32 (the interpreter's bf16 dot is wrong; bf16 products are exact in float32, as
    in the GPU's MMA) and scores are summed over d in a fixed order (see _scores).
    is_causal: query i sees keys j <= i, top-left aligned (absolute indices, also for
    N_q != N_k).  scale: softmax scale, default 1/sqrt(d).  The forward keeps the
    running max in raw-score units and folds scale * log2(e) into one multiply before
    exp2; the backward computes exp2((scale s - L) * log2(e)).
    Returns O in the input dtype, shape of q, dense in q's memory order (contiguous for a
    contiguous q; for q stored (B, N, H, d) and seen as (B, H, N, d), O is stored so too, and
    dQ, dK, dV follow q, k, v the same way).  Saved for backward: q, k, v,
    O, and L = logsumexp of the scaled scores (natural log, float32, shape q.shape[:-1],
    contiguous), the only saved tensor of that shape.
    Backward: a dQ kernel (one program per query tile and batch-head, looping over key
    tiles) that first computes and stores D_i = rowsum(dO_i * O_i); then a dK/dV kernel
    (one program per key tile and batch-head, looping over query tiles, from the diagonal
    on under causal) that reads D.  P = exp(S - L) is recomputed; N_q x N_k is never
    materialised; no atomics, so dQ, dK, dV are the same bits on every call.
    One-pass backward (BackwardConfig.dq_atomic; the table's choice for d=64 on grids of up
    to two waves): a kernel stores D and zeroes a float32 dQ; the dK/dV kernel also adds
    each key tile's dS K into it with atomic adds (their order varies on a GPU: dQ may
    differ in its last bits between calls); a last kernel scales and casts dQ.  Never
    taken by the table under torch.use_deterministic_algorithms(True) (see _one_pass).
    One-launch backward (BackwardConfig.one_launch; the choice of both flavours, for 16-bit
    inputs, on grids of at most a few waves of its programs: _ONE_LAUNCH_BWD): the dQ
    kernel's programs and the dK/dV kernel's in one grid, each dK/dV program computing D_i
    for the query tiles it visits from O and dO; no D buffer, no atomics, one launch.
    Split-KV forward (ForwardConfig.split_keys; the table's choice on small grids): each
    program covers one range of keys and stores its unnormalised O, running max and sum in
    float32; a combine kernel merges them.
    Scores s = Q K^T come out bit-identical in the forward and both backward kernels, and
    the kernels compile without fused multiply-add, so the backward's exp(scale s - L) is
    exactly 1 where a row sees one key (see _scores and _launch).
    Tile sizes: a small table per (device kind, dtype, head dim; the backward also per
    causal or not where that measured differently), and for 16-bit inputs on a GPU a
    small-grid backward entry where batch x heads x 128-row key tiles fill at most about
    one wave of SMs, the one launch on the smallest of those (pick_backward_config); ``flash_forward`` and
    ``flash_backward`` take a ``config`` override (ForwardConfig / BackwardConfig or a
    dict of their fields).  Besides tiles, warps and stages a config chooses:
      longest_first  under causal masking, launch the programs with the most key (query)
                     tiles first, batch-heads innermost, so the last wave is short ones;
      tma            load the looped-over tiles through tensor descriptors (TMA on Hopper),
                     where every stride but the last is a multiple of 16 bytes and the last
                     is 1; otherwise, or when Triton lacks descriptors, pointer loads;
      fp_fusion      (forward only) let the compiler fuse multiply-adds; the backward never
                     does (see _launch).
    Descriptors made inside a kernel need scratch memory on the GPU: one buffer per
    (device, stream), kept and grown (triton_launch._tma_scratch).
Host path: a plan per call signature (shapes, strides, dtypes, devices, 16-byte alignment,
is_causal, scale) holds the checked scale, the config and each kernel launch with its
strides fixed; inputs are validated when their plan is made, and launches go to Triton's
C launcher directly (impl/attention/triton_launch.py).  Two launches a backward (three in
one pass, one in one launch), one a forward (two split).

Every key loop runs in stages: key tiles that no row of the query tile masks run without
any masking work; only the tiles that straddle the causal diagonal or the end of the
sequence apply masks.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, fields, replace

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .host_plans import PlanCache, as_4d, dense_strides_like, signature
from .triton_launch import Launch
from .validation import interpreter_enabled, validate_attention_inputs

_LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * log2(e))

# ---------------------------------------------------------------------------------------
# Shared tile helpers
# ---------------------------------------------------------------------------------------


@triton.jit
def _load_tile(base, offs_rows, stride_rows, n_rows, offs_d, stride_d,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """A (rows, BLOCK_D) tile; rows >= n_rows (if checked) and columns >= HEAD_DIM read 0."""
    ptrs = base + offs_rows[:, None] * stride_rows + offs_d[None, :] * stride_d
    if CHECK_ROWS:
        if HEAD_DIM == BLOCK_D:
            tile = tl.load(ptrs, mask=offs_rows[:, None] < n_rows, other=0.0)
        else:
            tile = tl.load(ptrs, mask=(offs_rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if HEAD_DIM == BLOCK_D:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return tile


@triton.jit
def _store_tile(base, tile, offs_rows, stride_rows, n_rows, offs_d, stride_d, HEAD_DIM: tl.constexpr):
    ptrs = base + offs_rows[:, None] * stride_rows + offs_d[None, :] * stride_d
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=(offs_rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _dot(a, b, acc, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """acc + a @ b with a float32 accumulator (operands widened where the interpreter needs it)."""
    if DOT_IN_FP32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _scores(a, b, acc, DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """acc + a @ b^T in float32 for a: (M, D), b: (N, D).

    The forward, dQ and dK/dV kernels must agree on every score to the last bit: the
    backward's P = exp(scale s - L) is then exactly 1 where one key holds all the weight,
    as in the eager softmax (a few ulps of disagreement, times |S| in the hundreds, broke
    the fp32 oracle).  On the GPU, tl.dot over the same d rounds alike for any tile shape
    and operand order (perf/tune/attention_gpu_check.py probes it, fp32/fp16/bf16); numpy's
    BLAS under the interpreter does not, so there each score is a plain sum over d.
    """
    if INTERPRETED:
        s = acc + tl.sum(a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :], 2)  # exact products
    else:
        s = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
    return s


@triton.jit
def _tile_coords(pid, n_row_tiles, H, LONGEST_FIRST: tl.constexpr, WORK_GROWS: tl.constexpr):
    """Program id -> (row tile, batch, head).

    Default: consecutive programs walk one batch-head's tiles (they share its K and V in L2).
    LONGEST_FIRST: consecutive programs walk the batch-heads of one tile, and tiles go from
    the most work to the least (longest-processing-time-first), so the GPU's last wave holds
    short programs instead of a few long ones.  WORK_GROWS: a tile's work grows with its
    index (query tiles under causal masking), else it shrinks (key tiles).
    """
    if LONGEST_FIRST:
        n_bh = tl.num_programs(0) // n_row_tiles
        rank = pid // n_bh
        bh = pid % n_bh
        if WORK_GROWS:
            tile = n_row_tiles - 1 - rank
        else:
            tile = rank
    else:
        tile = pid % n_row_tiles
        bh = pid // n_row_tiles
    return tile, (bh // H).to(tl.int64), (bh % H).to(tl.int64)


@triton.jit
def _tile_source(base, n_rows, stride_rows, BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """What the loops load tiles from: a tensor descriptor of the (n_rows, HEAD_DIM) matrix at
    ``base`` (rows and columns past the ends read 0), or the base pointer itself."""
    if USE_TMA:
        src = tl.make_tensor_descriptor(base, shape=[n_rows, HEAD_DIM], strides=[stride_rows, 1],
                                        block_shape=[BLOCK_ROWS, BLOCK_D])
    else:
        src = base
    return src


@triton.jit
def _load_rows(src, offs_rows, start, stride_rows, n_rows, offs_d, stride_d,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows start .. start + len(offs_rows) of a tile source (see _tile_source and _load_tile)."""
    if USE_TMA:
        tile = src.load([start, 0])
    else:
        tile = _load_tile(src, offs_rows, stride_rows, n_rows, offs_d, stride_d, HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return tile


# ---------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------


@triton.jit
def _fwd_key_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                   offs_m, offs_d, lo, hi, N_K, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr):
    """Online softmax over key tiles [lo, hi); MASKED tiles apply the causal and length masks."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_src, offs_n, start_n, stride_kn, N_K, offs_d, stride_kd, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        v = _load_rows(v_src, offs_n, start_n, stride_vn, N_K, offs_d, stride_vd, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        # Raw scores Q_i K_j^T; the running max m is kept in these unscaled units.
        s = _scores(q, k, tl.zeros([q.shape[0], BLOCK_N], tl.float32), DOT_PRECISION, INTERPRETED)
        if MASKED:
            visible = offs_n[None, :] < N_K
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # running max (every row sees key 0 first)
        # exp(scale (s - m)) = exp2((s - m) * scale * log2(e)); s - m is exact near the max
        p = tl.math.exp2((s - m_new[:, None]) * qk_scale)
        alpha = tl.math.exp2((m_i - m_new) * qk_scale)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)  # l = alpha l + rowsum(P)
        acc = acc * alpha[:, None]
        acc = _dot(p.to(v.dtype), v, acc, DOT_PRECISION, DOT_IN_FP32)  # acc = alpha acc + P V
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["H", "N_Q", "N_K", "n_m_tiles", "n_splits"])
def _flash_fwd_kernel(
    Q, K, V, O, L, OPART, MLPART,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_K, n_m_tiles, n_splits, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, LONGEST_FIRST: tl.constexpr, USE_TMA: tl.constexpr, SPLIT_KEYS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """One program per (query tile, batch-head): O_i and L_i for BLOCK_M query rows.

    SPLIT_KEYS > 0 (split-KV, for grids too small to fill the GPU): program (tile, split s)
    covers keys [s SPLIT_KEYS, (s + 1) SPLIT_KEYS) only and stores its unnormalised acc to
    OPART[s] and its running max and sum to MLPART[s] ((n_splits, B H, 2, N_Q)); a split past
    the tile's last visible key stores acc = 0, m = -inf, l = 0, which the combine weighs 0.
    SPLIT_KEYS is a multiple of BLOCK_M and BLOCK_N, so every row sees the first key of every
    split that has any (no row's running max stays -inf)."""
    pid_m, b, h = _tile_coords(tl.program_id(0), n_m_tiles, H, LONGEST_FIRST, True)
    q_base = Q + b * stride_qb + h * stride_qh
    k_src = _tile_source(K + b * stride_kb + h * stride_kh, N_K, stride_kn, BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)
    v_src = _tile_source(V + b * stride_vb + h * stride_vh, N_K, stride_vn, BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_tile(q_base, offs_m, stride_qn, N_Q, offs_d, stride_qd, HEAD_DIM, BLOCK_D, True)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the raw scores Q K^T
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(scale (s - m))
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # unnormalised O

    full_hi = (N_K // BLOCK_N) * BLOCK_N  # key tiles below this are inside the sequence
    if IS_CAUSAL:
        hi = tl.minimum(N_K, start_m + BLOCK_M)  # tiles past the last row's diagonal are skipped
        bulk_hi = tl.minimum(((start_m + 1) // BLOCK_N) * BLOCK_N, full_hi)  # all keys <= first row
    else:
        hi = N_K
        bulk_hi = full_hi
    lo = 0
    if SPLIT_KEYS > 0:  # this program's keys only; an empty range leaves m = -inf, l = 0, acc = 0
        lo = tl.program_id(1) * SPLIT_KEYS
        hi = tl.minimum(hi, lo + SPLIT_KEYS)
        bulk_hi = tl.maximum(tl.minimum(bulk_hi, hi), lo)
    acc, l_i, m_i = _fwd_key_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                                   offs_m, offs_d, lo, bulk_hi, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, BLOCK_D, False, IS_CAUSAL, USE_TMA,
                                   DOT_PRECISION, DOT_IN_FP32, INTERPRETED)
    acc, l_i, m_i = _fwd_key_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                                   offs_m, offs_d, bulk_hi, hi, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, BLOCK_D, True, IS_CAUSAL, USE_TMA,
                                   DOT_PRECISION, DOT_IN_FP32, INTERPRETED)

    if SPLIT_KEYS > 0:
        part = tl.program_id(1) * (tl.num_programs(0) // n_m_tiles) + b * H + h  # (split, batch-head)
        _store_tile(OPART + part * N_Q * HEAD_DIM, acc, offs_m, HEAD_DIM, N_Q, offs_d, 1, HEAD_DIM)
        tl.store(MLPART + (2 * part) * N_Q + offs_m, m_i, mask=offs_m < N_Q)
        tl.store(MLPART + (2 * part + 1) * N_Q + offs_m, l_i, mask=offs_m < N_Q)
    else:
        o = acc / l_i[:, None]  # O_i = diag(l_i)^-1 acc
        # L_i = scale m_i + log l_i.  The backward recomputes scale * s with the same rounding,
        # so exp(scale s - L) is 1/l exactly where s is the max: no base-2 round trip of L.
        # (A fused multiply-add here is harmless: where l = 1, log l = 0 and fma rounds once.)
        lse = m_i * sm_scale + tl.log(l_i)
        _store_tile(O + b * stride_ob + h * stride_oh, o, offs_m, stride_on, N_Q, offs_d, stride_od, HEAD_DIM)
        tl.store(L + (b * H + h) * N_Q + offs_m, lse, mask=offs_m < N_Q)


@triton.jit
def _split_weight(m_s, m, qk_scale):
    """exp(scale (m_s - m)): a split's sums moved from its own max to the common one."""
    return tl.math.exp2((m_s - m) * qk_scale)


@triton.jit
def _split_max(MLPART, part, N_Q, offs_m, rows, m):
    return tl.maximum(m, tl.load(MLPART + (2 * part) * N_Q + offs_m, mask=rows, other=0.0))


@triton.jit
def _split_add(OPART, MLPART, part, N_Q, offs_m, rows, offs_d, m, l, acc, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """(l, acc) with split ``part``'s sums added under the common max m."""
    m_s = tl.load(MLPART + (2 * part) * N_Q + offs_m, mask=rows, other=0.0)
    alpha = _split_weight(m_s, m, qk_scale)  # 0 for an empty split (m_s = -inf)
    l += alpha * tl.load(MLPART + (2 * part + 1) * N_Q + offs_m, mask=rows, other=0.0)
    acc_s = _load_tile(OPART + part * N_Q * HEAD_DIM, offs_m, HEAD_DIM, N_Q, offs_d, 1, HEAD_DIM, BLOCK_D, True)
    return l, acc + alpha[:, None] * acc_s


@triton.jit(do_not_specialize=["H", "N_Q", "n_m_tiles", "n_splits"])
def _flash_fwd_combine_kernel(
    OPART, MLPART, O, L,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, n_m_tiles, n_splits, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr = 0,
    WAIT_PRIOR: tl.constexpr = False,
):
    """Split-KV forward, second step: per (query tile, batch-head), the splits' partial
    softmax sums merged under their common max m = max_s m_s (raw scores):
    l = sum_s exp(scale (m_s - m)) l_s,  O = sum_s exp(scale (m_s - m)) acc_s / l,
    L = scale m + log l.  One split is weighed exp(0) = 1: its O and L are the unsplit ones.

    SPLITS > 0 is the count (n_splits) fixed at compile time: both loops unrolled, so every
    split's loads are in flight together; a loop over a run-time count waits out one load's
    latency a split (the Gluon flavour's combine on an H200: 3.7-5.5 us at 8 splits and 1.9-2.8
    at 2 with the loop; 2.3-4.5 and 1.3-2.2 unrolled).
    WAIT_PRIOR: launched as a programmatic dependent of the forward (launch_pdl), the kernel
    waits here until the forward's grid is done and its stores are visible."""
    if WAIT_PRIOR:
        gdc_wait()
    pid = tl.program_id(0)
    pid_m, bh = pid % n_m_tiles, (pid // n_m_tiles).to(tl.int64)
    b, h = bh // H, bh % H
    n_bh = tl.num_programs(0) // n_m_tiles
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    rows = offs_m < N_Q
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if SPLITS > 0:
        for s in tl.static_range(SPLITS):
            m = _split_max(MLPART, s * n_bh + bh, N_Q, offs_m, rows, m)
        for s in tl.static_range(SPLITS):
            l, acc = _split_add(OPART, MLPART, s * n_bh + bh, N_Q, offs_m, rows, offs_d, m, l, acc, qk_scale,
                                HEAD_DIM, BLOCK_D)
    else:
        for s in range(n_splits):
            m = _split_max(MLPART, s * n_bh + bh, N_Q, offs_m, rows, m)
        for s in range(n_splits):
            l, acc = _split_add(OPART, MLPART, s * n_bh + bh, N_Q, offs_m, rows, offs_d, m, l, acc, qk_scale,
                                HEAD_DIM, BLOCK_D)
    l = tl.where(rows, l, 1.0)  # rows past N_Q (never stored) summed nothing
    o = acc / l[:, None]
    lse = m * sm_scale + tl.log(l)  # as the unsplit forward's epilogue
    _store_tile(O + b * stride_ob + h * stride_oh, o, offs_m, stride_on, N_Q, offs_d, stride_od, HEAD_DIM)
    tl.store(L + bh * N_Q + offs_m, lse, mask=rows)


# ---------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------


@triton.jit
def _row_dot(o, do):
    """D_i = rowsum(dO_i * O_i) in float32: the softmax backward's correction term."""
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, key_bias, q_src, do_src, o_src, l_base, delta_base, dq_base,
                      stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od,
                      offs_n, offs_d, lo, hi, N_Q, sm_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                      MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, KEYS_EVEN: tl.constexpr, USE_TMA: tl.constexpr,
                      ATOMIC_DQ: tl.constexpr, DELTA_FROM_O: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr):
    """Accumulate dK_j, dV_j over query tiles [lo, hi), in transposed form (keys are rows).

    Rows past N_Q read L = +inf, so their P is exactly 0.  Unless every key tile is full
    (KEYS_EVEN), keys past N_K start from key_bias = -inf, so their P is 0 too; with full
    tiles the accumulator starts at 0 and holds no (BLOCK_N, BLOCK_M) bias in registers.
    ATOMIC_DQ: also add this key tile's share of dQ_i, dS_ij K_j (unscaled), into the float32
    rows at dq_base (HEAD_DIM wide, contiguous) with atomic adds.
    DELTA_FROM_O: D_i = rowsum(dO_i * O_i) computed here from O's tile (at o_src), not read
    from delta_base (the one-launch backward, which has no kernel before it to store D).
    """
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(q_src, offs_m, start_m, stride_qn, N_Q, offs_d, stride_qd, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        do = _load_rows(do_src, offs_m, start_m, stride_don, N_Q, offs_d, stride_dod, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        if MASKED:
            lse = tl.load(l_base + offs_m, mask=offs_m < N_Q, other=float("inf"))
        else:
            lse = tl.load(l_base + offs_m)
        if DELTA_FROM_O:
            o = _load_rows(o_src, offs_m, start_m, stride_on, N_Q, offs_d, stride_od, HEAD_DIM, BLOCK_D, MASKED,
                           USE_TMA)
            delta = _row_dot(o, do)
        elif MASKED:
            delta = tl.load(delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            delta = tl.load(delta_base + offs_m)
        # P^T = exp(scale K Q^T - L) = exp2((scale K Q^T - L) * log2(e))
        if KEYS_EVEN:
            s_t = _scores(k, q, tl.zeros([k.shape[0], BLOCK_M], tl.float32), DOT_PRECISION, INTERPRETED)
        else:
            s_t = _scores(k, q, key_bias, DOT_PRECISION, INTERPRETED)
        if MASKED:
            if IS_CAUSAL:
                s_t = tl.where(offs_m[None, :] >= offs_n[:, None], s_t, float("-inf"))
        p_t = tl.math.exp2((s_t * sm_scale - lse[None, :]) * _LOG2E)
        dv = _dot(p_t.to(do.dtype), do, dv, DOT_PRECISION, DOT_IN_FP32)  # dV_j += P^T dO_i
        # dP^T = V dO^T;  dS^T = P^T * (dP^T - D)
        dp_t = _dot(v, tl.trans(do), tl.zeros([k.shape[0], BLOCK_M], tl.float32), DOT_PRECISION, DOT_IN_FP32)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _dot(ds_t.to(q.dtype), q, dk, DOT_PRECISION, DOT_IN_FP32)  # dK_j += dS^T Q_i (scale applied at the end)
        if ATOMIC_DQ:
            # dQ_i += dS_ij K_j: this program's share, summed over key tiles by atomics
            dq = _dot(tl.trans(ds_t.to(k.dtype)), k, tl.zeros([BLOCK_M, BLOCK_D], tl.float32),
                      DOT_PRECISION, DOT_IN_FP32)
            ptrs = dq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            _add_rows(ptrs, dq, (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM))
    return dk, dv


@triton.jit
def _dkdv_program(
    pid, Q, K, V, O, DO, L, Delta, DK, DV, DQACC,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, N_Q, N_K, n_n_tiles, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, KEYS_EVEN: tl.constexpr, LONGEST_FIRST: tl.constexpr, USE_TMA: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, DELTA_FROM_O: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """dK_j and dV_j for the BLOCK_N keys of program ``pid`` (key tile, batch-head); with
    ATOMIC_DQ also every query row's dQ share from these keys, added into DQACC ((B H, N_Q,
    HEAD_DIM) float32, zeroed before).  D from Delta, or from O (DELTA_FROM_O)."""
    pid_n, b, h = _tile_coords(pid, n_n_tiles, H, LONGEST_FIRST, False)
    q_src = _tile_source(Q + b * stride_qb + h * stride_qh, N_Q, stride_qn, BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA)
    do_src = _tile_source(DO + b * stride_dob + h * stride_doh, N_Q, stride_don, BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA)
    if DELTA_FROM_O:
        o_src = _tile_source(O + b * stride_ob + h * stride_oh, N_Q, stride_on, BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA)
    else:
        o_src = O  # unread
    l_base = L + (b * H + h) * N_Q
    delta_base = Delta + (b * H + h) * N_Q  # unread with DELTA_FROM_O
    dq_base = DQACC + (b * H + h) * N_Q * HEAD_DIM  # unread without ATOMIC_DQ
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    # Key rows past N_K read 0; their dK/dV rows are never stored.
    k = _load_tile(K + b * stride_kb + h * stride_kh, offs_n, stride_kn, N_K, offs_d, stride_kd, HEAD_DIM, BLOCK_D, True)
    v = _load_tile(V + b * stride_vb + h * stride_vh, offs_n, stride_vn, N_K, offs_d, stride_vd, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    if KEYS_EVEN:
        key_bias = 0.0  # unused: every key of every tile is inside the sequence
    else:
        # Scores of padding keys start at -inf (the dot's accumulator), so their P is 0.
        key_bias = tl.where(offs_n < N_K, 0.0, float("-inf"))[:, None] + tl.zeros([BLOCK_N, BLOCK_M], tl.float32)

    full_hi = (N_Q // BLOCK_M) * BLOCK_M  # query tiles below this are inside the sequence
    if IS_CAUSAL:
        # Rows < start_n see none of these keys; start at the tile holding row start_n.
        lo = (start_n // BLOCK_M) * BLOCK_M
        # First query tile whose every row sees every key of this tile (row >= start_n + BLOCK_N - 1).
        diag_hi = tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, key_bias, q_src, do_src, o_src, l_base, delta_base, dq_base,
                                   stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od,
                                   offs_n, offs_d, lo, tl.minimum(diag_hi, N_Q), N_Q, sm_scale,
                                   HEAD_DIM, BLOCK_M, BLOCK_D, True, True, KEYS_EVEN, USE_TMA, ATOMIC_DQ, DELTA_FROM_O,
                                   DOT_PRECISION, DOT_IN_FP32, INTERPRETED)
        tail_lo = tl.maximum(diag_hi, full_hi)
    else:
        diag_hi = 0
        tail_lo = full_hi
    # Full tiles below the diagonal: no masking work.
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, key_bias, q_src, do_src, o_src, l_base, delta_base, dq_base,
                               stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od,
                               offs_n, offs_d, diag_hi, full_hi, N_Q, sm_scale,
                               HEAD_DIM, BLOCK_M, BLOCK_D, False, IS_CAUSAL, KEYS_EVEN, USE_TMA, ATOMIC_DQ, DELTA_FROM_O,
                               DOT_PRECISION, DOT_IN_FP32, INTERPRETED)
    # The partial last query tile, if it was not a diagonal tile.
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, key_bias, q_src, do_src, o_src, l_base, delta_base, dq_base,
                               stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od,
                               offs_n, offs_d, tail_lo, N_Q, N_Q, sm_scale,
                               HEAD_DIM, BLOCK_M, BLOCK_D, True, IS_CAUSAL, KEYS_EVEN, USE_TMA, ATOMIC_DQ, DELTA_FROM_O,
                               DOT_PRECISION, DOT_IN_FP32, INTERPRETED)

    dk = dk * sm_scale  # dK = scale * dS^T Q
    _store_tile(DK + b * stride_dkb + h * stride_dkh, dk, offs_n, stride_dkn, N_K, offs_d, stride_dkd, HEAD_DIM)
    _store_tile(DV + b * stride_dvb + h * stride_dvh, dv, offs_n, stride_dvn, N_K, offs_d, stride_dvd, HEAD_DIM)


@triton.jit
def _add_rows(ptrs, values, mask):
    """ptrs[mask] += values, atomically: programs of other key tiles add to the same rows."""
    tl.atomic_add(ptrs, values, mask=mask, sem="relaxed")


@triton.jit(do_not_specialize=["H", "N_Q", "N_K", "n_n_tiles"])
def _flash_bwd_dkdv_kernel(
    Q, K, V, DO, L, Delta, DK, DV, DQACC,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, N_Q, N_K, n_n_tiles, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, KEYS_EVEN: tl.constexpr, LONGEST_FIRST: tl.constexpr, USE_TMA: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """One program per (key tile, batch-head): dK_j and dV_j for BLOCK_N keys, D read from
    Delta; with ATOMIC_DQ also every query row's dQ share from these keys, added into DQACC
    ((B H, N_Q, HEAD_DIM) float32, zeroed before)."""
    _dkdv_program(tl.program_id(0), Q, K, V, Q, DO, L, Delta, DK, DV, DQACC,  # Q stands in for the unread O
                  stride_qb, stride_qh, stride_qn, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  stride_qb, stride_qh, stride_qn, stride_qd,
                  stride_dob, stride_doh, stride_don, stride_dod,
                  stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                  stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                  H, N_Q, N_K, n_n_tiles, sm_scale,
                  HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, IS_CAUSAL, KEYS_EVEN, LONGEST_FIRST, USE_TMA, ATOMIC_DQ, False,
                  DOT_PRECISION, DOT_IN_FP32, INTERPRETED)


@triton.jit
def _dq_key_tiles(dq, q, do, lse, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                  offs_m, offs_d, lo, hi, N_K, sm_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr):
    """Accumulate dQ_i over key tiles [lo, hi)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_src, offs_n, start_n, stride_kn, N_K, offs_d, stride_kd, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        v = _load_rows(v_src, offs_n, start_n, stride_vn, N_K, offs_d, stride_vd, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        s = _scores(q, k, tl.zeros([q.shape[0], BLOCK_N], tl.float32), DOT_PRECISION, INTERPRETED)
        s = s * sm_scale  # S = scale Q K^T, rounded as in the forward's L
        if MASKED:
            visible = offs_n[None, :] < N_K
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        p = tl.math.exp2((s - lse[:, None]) * _LOG2E)  # P = exp(S - L)
        dp = _dot(do, tl.trans(v), tl.zeros([q.shape[0], BLOCK_N], tl.float32), DOT_PRECISION, DOT_IN_FP32)
        ds = p * (dp - delta[:, None])  # dS = P * (dO V^T - D)
        dq = _dot(ds.to(k.dtype), k, dq, DOT_PRECISION, DOT_IN_FP32)  # dQ_i += dS K_j (scale at the end)
    return dq


@triton.jit
def _dq_program(
    pid, Q, K, V, O, DO, L, Delta, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    H, N_Q, N_K, n_m_tiles, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, LONGEST_FIRST: tl.constexpr, USE_TMA: tl.constexpr, STORE_DELTA: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """D_i = rowsum(dO_i * O_i) (stored in Delta where STORE_DELTA, for a dK/dV kernel that
    runs next) and dQ_i for the BLOCK_M query rows of program ``pid`` (query tile, batch-head)."""
    pid_m, b, h = _tile_coords(pid, n_m_tiles, H, LONGEST_FIRST, True)
    k_src = _tile_source(K + b * stride_kb + h * stride_kh, N_K, stride_kn, BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)
    v_src = _tile_source(V + b * stride_vb + h * stride_vh, N_K, stride_vn, BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_tile(Q + b * stride_qb + h * stride_qh, offs_m, stride_qn, N_Q, offs_d, stride_qd, HEAD_DIM, BLOCK_D, True)
    do = _load_tile(DO + b * stride_dob + h * stride_doh, offs_m, stride_don, N_Q, offs_d, stride_dod,
                    HEAD_DIM, BLOCK_D, True)
    o = _load_tile(O + b * stride_ob + h * stride_oh, offs_m, stride_on, N_Q, offs_d, stride_od, HEAD_DIM, BLOCK_D, True)
    delta = _row_dot(o, do)  # D_i; rows past N_Q read 0
    if STORE_DELTA:
        tl.store(Delta + (b * H + h) * N_Q + offs_m, delta, mask=offs_m < N_Q)
    # Rows past N_Q read L = +inf: their P is 0.
    lse = tl.load(L + (b * H + h) * N_Q + offs_m, mask=offs_m < N_Q, other=float("inf"))
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    full_hi = (N_K // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi = tl.minimum(N_K, start_m + BLOCK_M)
        bulk_hi = tl.minimum(((start_m + 1) // BLOCK_N) * BLOCK_N, full_hi)
    else:
        hi = N_K
        bulk_hi = full_hi
    dq = _dq_key_tiles(dq, q, do, lse, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, 0, bulk_hi, N_K, sm_scale,
                       HEAD_DIM, BLOCK_N, BLOCK_D, False, IS_CAUSAL, USE_TMA, DOT_PRECISION, DOT_IN_FP32, INTERPRETED)
    dq = _dq_key_tiles(dq, q, do, lse, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, bulk_hi, hi, N_K, sm_scale,
                       HEAD_DIM, BLOCK_N, BLOCK_D, True, IS_CAUSAL, USE_TMA, DOT_PRECISION, DOT_IN_FP32, INTERPRETED)

    dq = dq * sm_scale  # dQ = scale * dS K
    _store_tile(DQ + b * stride_dqb + h * stride_dqh, dq, offs_m, stride_dqn, N_Q, offs_d, stride_dqd, HEAD_DIM)


@triton.jit(do_not_specialize=["H", "N_Q", "N_K", "n_m_tiles"])
def _flash_bwd_dq_kernel(
    Q, K, V, O, DO, L, Delta, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    H, N_Q, N_K, n_m_tiles, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, LONGEST_FIRST: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """One program per (query tile, batch-head): D_i = rowsum(dO_i * O_i), stored for the
    dK/dV kernel that runs next, and dQ_i for BLOCK_M query rows."""
    _dq_program(tl.program_id(0), Q, K, V, O, DO, L, Delta, DQ,
                stride_qb, stride_qh, stride_qn, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_ob, stride_oh, stride_on, stride_od,
                stride_dob, stride_doh, stride_don, stride_dod,
                stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                H, N_Q, N_K, n_m_tiles, sm_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, IS_CAUSAL, LONGEST_FIRST, USE_TMA, True,
                DOT_PRECISION, DOT_IN_FP32, INTERPRETED)


@triton.jit
def _one_launch_role(pid, n_dq_programs):
    """(is a dQ program, its index among its kind): the one-launch backward's grid holds the
    dQ programs first, then the dK/dV programs."""
    is_dq = pid < n_dq_programs
    return is_dq, tl.where(is_dq, pid, pid - n_dq_programs)


@triton.jit(do_not_specialize=["H", "N_Q", "N_K", "n_m_tiles", "n_n_tiles", "n_dq_programs"])
def _flash_bwd_one_launch_kernel(
    Q, K, V, O, DO, L, DQ, DK, DV,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, N_Q, N_K, n_m_tiles, n_n_tiles, n_dq_programs, sm_scale,
    HEAD_DIM: tl.constexpr, DQ_BLOCK_M: tl.constexpr, DQ_BLOCK_N: tl.constexpr,
    DKDV_BLOCK_M: tl.constexpr, DKDV_BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, KEYS_EVEN: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """The whole backward in one launch: programs [0, n_dq_programs) are the dQ kernel's (one
    per query tile and batch-head), the rest the dK/dV kernel's (one per key tile and
    batch-head).  Each computes the D rows it needs from O and dO, so no program reads what
    another writes: no D buffer, no float32 dQ, no atomics (deterministic), one launch.  The
    cost is D computed once per (key tile, query tile) pair, which pays where launches cost
    more than that: grids that leave SMs idle.  Programs run in plain order (no longest-first:
    a grid this small runs as one wave)."""
    is_dq, pid = _one_launch_role(tl.program_id(0), n_dq_programs)
    if is_dq:
        _dq_program(pid, Q, K, V, O, DO, L, L, DQ,  # L stands in for the unwritten Delta
                    stride_qb, stride_qh, stride_qn, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_ob, stride_oh, stride_on, stride_od,
                    stride_dob, stride_doh, stride_don, stride_dod,
                    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                    H, N_Q, N_K, n_m_tiles, sm_scale,
                    HEAD_DIM, DQ_BLOCK_M, DQ_BLOCK_N, BLOCK_D, IS_CAUSAL, False, USE_TMA, False,
                    DOT_PRECISION, DOT_IN_FP32, INTERPRETED)
    else:
        _dkdv_program(pid, Q, K, V, O, DO, L, L, DK, DV, L,  # L stands in for the unread Delta and dQ sums
                      stride_qb, stride_qh, stride_qn, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd,
                      stride_ob, stride_oh, stride_on, stride_od,
                      stride_dob, stride_doh, stride_don, stride_dod,
                      stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                      stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                      H, N_Q, N_K, n_n_tiles, sm_scale,
                      HEAD_DIM, DKDV_BLOCK_M, DKDV_BLOCK_N, BLOCK_D, IS_CAUSAL, KEYS_EVEN, False, USE_TMA, False, True,
                      DOT_PRECISION, DOT_IN_FP32, INTERPRETED)


@triton.jit(do_not_specialize=["H", "N_Q", "n_m_tiles"])
def _flash_bwd_preprocess_kernel(
    O, DO, Delta, DQACC,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    H, N_Q, n_m_tiles,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One-pass backward, before it: D_i = rowsum(dO_i * O_i), and the dQ accumulator's
    rows zeroed.  One program per (query tile, batch-head)."""
    pid = tl.program_id(0)
    pid_m, bh = pid % n_m_tiles, (pid // n_m_tiles).to(tl.int64)
    b, h = bh // H, bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(O + b * stride_ob + h * stride_oh, offs_m, stride_on, N_Q, offs_d, stride_od, HEAD_DIM, BLOCK_D, True)
    do = _load_tile(DO + b * stride_dob + h * stride_doh, offs_m, stride_don, N_Q, offs_d, stride_dod,
                    HEAD_DIM, BLOCK_D, True)
    tl.store(Delta + bh * N_Q + offs_m, _row_dot(o, do), mask=offs_m < N_Q)
    _store_tile(DQACC + bh * N_Q * HEAD_DIM, tl.zeros([BLOCK_M, BLOCK_D], tl.float32), offs_m, HEAD_DIM, N_Q,
                offs_d, 1, HEAD_DIM)


@triton.jit(do_not_specialize=["H", "N_Q", "n_m_tiles"])
def _flash_bwd_dq_convert_kernel(
    DQACC, DQ,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    H, N_Q, n_m_tiles, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One-pass backward, after it: dQ = scale * (sum of the atomically added dS K), in q's dtype."""
    pid = tl.program_id(0)
    pid_m, bh = pid % n_m_tiles, (pid // n_m_tiles).to(tl.int64)
    b, h = bh // H, bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    acc = _load_tile(DQACC + bh * N_Q * HEAD_DIM, offs_m, HEAD_DIM, N_Q, offs_d, 1, HEAD_DIM, BLOCK_D, True)
    _store_tile(DQ + b * stride_dqb + h * stride_dqh, acc * sm_scale, offs_m, stride_dqn, N_Q, offs_d, stride_dqd,
                HEAD_DIM)


# ---------------------------------------------------------------------------------------
# Tile configurations
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardConfig:
    block_m: int  # query rows per program
    block_n: int  # keys per loop step
    num_warps: int = 4
    num_stages: int = 2
    longest_first: bool = False  # causal: longest programs first, batch-heads innermost
    tma: bool = False  # key/value tiles through tensor descriptors where the layout allows
    fp_fusion: bool = False  # let the compiler fuse multiply-adds (safe in the forward, see _launch)
    # Split-KV: keys per program (0: one program covers all of a query tile's keys).  A
    # multiple of block_m and block_n; a second kernel merges the splits (small grids).
    split_keys: int = 0


@dataclass(frozen=True)
class BackwardConfig:
    dkdv_block_n: int  # keys per dK/dV program
    dkdv_block_m: int  # query rows per dK/dV loop step
    dq_block_m: int  # query rows per dQ program
    dq_block_n: int  # keys per dQ loop step
    num_warps: int = 4  # dK/dV kernel (and dQ kernel unless dq_num_warps is set)
    num_stages: int = 2
    preprocess_block_m: int = 64  # unused (the dQ kernel computes D); kept so positional configs keep their meaning
    dq_num_warps: int | None = None  # None: num_warps
    dq_num_stages: int | None = None  # None: num_stages
    longest_first: bool = False  # causal: longest programs first, batch-heads innermost
    tma: bool = False  # looped-over tiles (Q, dO for dK/dV; K, V for dQ) through tensor descriptors
    # One pass: the dK/dV kernel also adds each key tile's dS K into a float32 dQ with atomics
    # (5 matmuls a tile pair instead of 7; the dq_* fields then go unused).  The order of the
    # adds varies between runs on a GPU: see _one_pass for torch.use_deterministic_algorithms.
    dq_atomic: bool = False
    # One launch: the dQ programs and the dK/dV programs in one grid, each computing the D rows
    # it needs from O and dO (_flash_bwd_one_launch_kernel): no D, no float32 dQ, no atomics, a
    # single launch a backward.  Takes precedence over dq_atomic; longest_first does not apply.
    one_launch: bool = False


# The interpreter runs one program at a time and pays per tile operation, not per element:
# a few large tiles are faster than many small ones.  longest_first changes only the order
# of programs; it is on here so the CPU suite checks its index arithmetic.
_INTERPRETER_FWD = ForwardConfig(64, 64, 4, 1, longest_first=True)
_INTERPRETER_BWD = BackwardConfig(64, 64, 64, 64, 4, 1, longest_first=True)

# GPU (sm80/sm90): (dtype is 32-bit, head-dim bound) -> config.  Shared memory holds
# num_stages copies of the K and V tiles (forward) or the Q and dO tiles (backward).
# The 16-bit d<=64 and d<=128 entries are the fastest configs that passed the checks in
# perf/tune/tune_attention.py on an H100 (perf/notes/ATTENTION_NOTES.md); the others are first picks.
_GPU_FWD = {
    (False, 64): ForwardConfig(128, 64, 8, 3, longest_first=True),
    (False, 128): ForwardConfig(128, 64, 8, 3, longest_first=True, tma=True),
    (False, 256): ForwardConfig(64, 32, 4, 2),
    (True, 64): ForwardConfig(64, 64, 4, 2),  # fp32 rows: perf/results/2026-11-23-h100-attention-speed/
    (True, 128): ForwardConfig(32, 32, 4, 1),  # (64, 32, 4, 2) took 9.0 ms at N=1024, this 0.71
    (True, 256): ForwardConfig(32, 32, 4, 1),
}
_GPU_BWD = {
    (False, 64): BackwardConfig(128, 32, 64, 64, 4, 3, 128, longest_first=True, tma=True),
    (False, 128): BackwardConfig(64, 32, 64, 32, 4, 2, 128, longest_first=True, tma=True),
    (False, 256): BackwardConfig(32, 32, 32, 32, 4, 1, 64),
    (True, 64): BackwardConfig(32, 32, 32, 32, 4, 2, 64),
    (True, 128): BackwardConfig(32, 32, 32, 32, 4, 1, 64),
    (True, 256): BackwardConfig(32, 16, 32, 16, 4, 1, 32),
}
# Without a causal mask every program has the same work and the 64x64 tiles measured ~8%
# faster at d=64 (fwd+bwd 10.7 vs 11.6 ms, B=1 H=16 N=16384, H100): where they differ.
# d=128: 64x64 tiles beat 64x32 by 12 to 28 % at every grid measured (1 to 64 heads,
# N 1024 to 16384), despite spilling (perf/results/2026-11-23-h100-attention-grids/).
_GPU_BWD_NON_CAUSAL = {
    (False, 64): BackwardConfig(64, 64, 64, 64, 4, 2, 128, tma=True),
    (False, 128): BackwardConfig(64, 64, 64, 64, 4, 2, 128, tma=True),
}

# Small grids: with few programs (CS336's sweep runs one batch and one head) each SM runs one
# program at most, the time is one program's latency, and smaller tiles (more, shorter
# programs) can win.  "Programs" counts 128-row tiles x batch-heads (of the queries for the
# forward, of the keys for the backward) against the GPU's SM count.  Measured on an H100
# (16-bit, d 64 and 128; perf/results/2026-11-23-h100-attention-grids/): the 64x64 causal
# backward 5 to 23 % faster up to one wave, up to 13 % slower beyond; the d=64 non-causal
# backward without tensor descriptors 4 to 13 % faster up to half a wave.  64-row forward
# tiles were 10 to 17 % faster with the inputs in L2 but 15 to 25 % slower in the sweep,
# which empties L2 before each call (twice the programs read K and V from memory): smaller
# tiles alone are no small-grid forward (the split-KV entries below are).
#
# The one-pass backward (dq_atomic) at d=64 under causal masking, measured on an H100 at 1, 2
# and 4 heads, N 1024 to 65536 (perf/results/2026-11-26-h100-one-pass/waves): up to one wave
# the 64x64 one pass is 5 to 25 % faster than the two kernels, up to two waves the 128x64 one
# 13 to 21 % faster; at four waves and beyond the two kernels are faster again (the one
# pass has one critical path where the two kernels have two in a row; on a full GPU its
# float32 atomics cost more than the matmuls they save; the leaderboard shape: 4.50 vs 4.12 ms).
# Each entry: (up to this many waves, config), smallest grids first.
#
# Forward: the split-KV forward (split_keys), measured on an H100 at 1 and 4 heads, N 1024 to
# 16384 (perf/results/2026-11-26-h100-one-pass/split): 64x64 tiles with the keys cut into 8
# splits (d=64) or 4 (d=128), 256 keys at least, were 1.3 to 2.1 x faster than the table up
# to half a wave (and to one wave under causal masking at d=64); at one wave without it the
# table is faster again.  Each entry: (up to this many waves, config, splits of the keys).
_SMALL_GRID_FWD = {
    (True, 64): ((1.0, ForwardConfig(64, 64, 4, 2, longest_first=True), 8),),
    (False, 64): ((0.5, ForwardConfig(64, 64, 4, 2, longest_first=True), 8),),
    (True, 128): ((0.5, ForwardConfig(64, 64, 4, 2, longest_first=True, tma=True), 4),),
    (False, 128): ((0.5, ForwardConfig(64, 64, 4, 2, longest_first=True, tma=True), 4),),
}
_MIN_SPLIT_KEYS = 256  # fewer keys a program than this measured slower (2 or 3 key tiles of work)
_SMALL_GRID_BWD = {
    (True, 64): ((1.0, BackwardConfig(64, 64, 64, 64, 4, 3, 64, longest_first=True, tma=True, dq_atomic=True)),
                 (2.0, BackwardConfig(128, 64, 64, 64, 8, 3, 64, longest_first=True, tma=True, dq_atomic=True))),
    (True, 128): ((1.0, BackwardConfig(64, 64, 64, 64, 4, 2, 128, longest_first=True, tma=True)),),
    # d=64 without a mask: the 64x64 one pass 10 % faster at half a wave, level at 2048 keys,
    # slower from one wave (perf/results/2026-11-26-h100-one-pass/split)
    (False, 64): ((0.5, BackwardConfig(64, 64, 64, 64, 4, 3, 64, longest_first=True, tma=True, dq_atomic=True)),),
}


# The one-launch backward on small grids (16-bit; per (causal, head-dim bucket): its config and
# the most programs, dQ's and dK/dV's together, in waves of SMs).  Measured on an H200 against the
# entries above (perf/scripts/gluon_one_launch.py --flavour triton, device time a backward, L2
# flushed; perf/results/2026-11-29-h200-contract-corner-shuffled-sweep):
#   d 64, 64 x 64 tiles: 19-42 % less at B1 H1 N 128-4096 and at 128-384 programs of short rows;
#     at 256 programs of long rows (B1 N8192) 22 % less causal, 6 % less full; at 512 programs
#     (causal) 19 % less (B1 N16384) and 4 % less (B2 H8 N1024);
#   d 128, 64 x 32 tiles: 10-38 % less up to 128 programs; at 256, 9 % less (B1 N8192 causal) and
#     3 % less (B2 H8 N512 full).
# So up to about the largest grid measured better: 4 waves causal at d 64 (528 programs on 132
# SMs), 2 elsewhere.  One launch and three allocations a backward instead of three and five, and
# deterministic (no atomics).  At equal lengths these bounds cover the grids of the one-pass tiers
# at d 64 (both end at one wave of 128-row tiles causal, half a wave full); those tiers still serve
# many more queries than keys.
_ONE_LAUNCH_BWD = {
    (True, 64): (BackwardConfig(64, 64, 64, 64, 4, 2, one_launch=True), 4.0),
    (False, 64): (BackwardConfig(64, 64, 64, 64, 4, 2, one_launch=True), 2.0),
    (True, 128): (BackwardConfig(64, 32, 64, 32, 4, 2, one_launch=True), 2.0),
    (False, 128): (BackwardConfig(64, 32, 64, 32, 4, 2, one_launch=True), 2.0),
}


def _one_launch_entry(is_causal: bool, bucket: int, batch_heads: int, n_q: int, n_k: int, sm_count: int):
    entry = _ONE_LAUNCH_BWD.get((is_causal, bucket))
    if entry is None:
        return None
    cfg, max_waves = entry
    programs = batch_heads * (triton.cdiv(n_q, cfg.dq_block_m) + triton.cdiv(n_k, cfg.dkdv_block_n))
    return cfg if programs <= max_waves * sm_count else None


def _small_grid_entry(tiers, waves: float):
    for max_waves, cfg, *_ in tiers:
        if waves <= max_waves:
            return cfg
    return None


def _split_forward_entry(tiers, waves: float, n_k: int):
    """The small-grid forward for this grid, its keys cut into the tier's number of splits
    (a power of two, at least _MIN_SPLIT_KEYS each); None where that leaves fewer than 3."""
    for max_waves, cfg, splits in tiers:
        if waves <= max_waves:
            keys = max(_MIN_SPLIT_KEYS, triton.next_power_of_2(triton.cdiv(n_k, splits)))
            return replace(cfg, split_keys=keys) if triton.cdiv(n_k, keys) >= 3 else None
    return None


def _waves(batch_heads: int, n: int, sm_count: int) -> float:
    """Programs of 128-row tiles over ``batch_heads`` sequences of length ``n``, per SM."""
    return batch_heads * triton.cdiv(n, 128) / sm_count


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _device_sm_count(device: torch.device) -> int:
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _head_dim_bucket(block_d: int) -> int:
    return 64 if block_d <= 64 else (128 if block_d <= 128 else 256)


def default_forward_config(dtype: torch.dtype, head_dim: int, device: torch.device,
                           batch_heads: int | None = None, n_q: int | None = None,
                           is_causal: bool = False, n_k: int | None = None) -> ForwardConfig:
    """The table's config; with ``batch_heads`` and ``n_q`` given, the small-grid one where
    the launch would fill few SMs."""
    if device.type != "cuda":
        return _INTERPRETER_FWD
    fp32, bucket = dtype == torch.float32, _head_dim_bucket(_block_d(head_dim))
    if batch_heads is not None and n_q is not None:
        return pick_forward_config(fp32, bucket, batch_heads, n_q, _device_sm_count(device), bool(is_causal),
                                   n_q if n_k is None else n_k)
    return _GPU_FWD[(fp32, bucket)]


def pick_forward_config(fp32: bool, bucket: int, batch_heads: int, n_q: int, sm_count: int,
                        is_causal: bool = False, n_k: int | None = None) -> ForwardConfig:
    tiers = () if fp32 else _SMALL_GRID_FWD.get((is_causal, bucket), ())
    small = _split_forward_entry(tiers, _waves(batch_heads, n_q, sm_count), n_q if n_k is None else n_k)
    return small or _GPU_FWD[(fp32, bucket)]


def default_backward_config(dtype: torch.dtype, head_dim: int, device: torch.device,
                            is_causal: bool = True, batch_heads: int | None = None,
                            n_k: int | None = None, n_q: int | None = None) -> BackwardConfig:
    """The table's config; with ``batch_heads`` and ``n_k`` (and ``n_q``, default ``n_k``)
    given, the small-grid one where the launch would fill few SMs."""
    if device.type != "cuda":
        return _INTERPRETER_BWD
    fp32, bucket = dtype == torch.float32, _head_dim_bucket(_block_d(head_dim))
    if batch_heads is not None and n_k is not None:
        return pick_backward_config(fp32, bucket, bool(is_causal), batch_heads, n_k, _device_sm_count(device), n_q)
    return pick_backward_config(fp32, bucket, bool(is_causal), None, None, None)


def pick_backward_config(fp32: bool, bucket: int, is_causal: bool, batch_heads, n_k, sm_count,
                         n_q: int | None = None) -> BackwardConfig:
    one_launch = (None if fp32 or batch_heads is None
                  else _one_launch_entry(is_causal, bucket, batch_heads, n_k if n_q is None else n_q, n_k, sm_count))
    if one_launch is not None:
        return one_launch
    tiers = () if fp32 or batch_heads is None else _SMALL_GRID_BWD.get((is_causal, bucket), ())
    small = _small_grid_entry(tiers, _waves(batch_heads, n_k, sm_count)) if tiers else None
    if small is not None:
        return small
    key = (fp32, bucket)
    if not is_causal and key in _GPU_BWD_NON_CAUSAL:
        return _GPU_BWD_NON_CAUSAL[key]
    return _GPU_BWD[key]


def _coerce_config(config, cls, default):
    if config is None:
        return default
    if isinstance(config, cls):
        return config
    if isinstance(config, dict):
        names = {f.name for f in fields(cls)}
        unknown = set(config) - names
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}; expected {sorted(names)}")
        return replace(default, **config)
    raise TypeError(f"config must be a {cls.__name__}, a dict of its fields, or None; got {type(config).__name__}")


def _check_blocks(**blocks: int) -> None:
    for name, value in blocks.items():
        if not (isinstance(value, int) and value >= 16 and value & (value - 1) == 0):
            raise ValueError(f"tile size {name}={value!r} must be a power of two >= 16")


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


# ---------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------


def _dot_settings(dtype: torch.dtype) -> dict:
    return dict(
        DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",  # no tf32 for fp32 inputs
        DOT_IN_FP32=dtype == torch.bfloat16 and interpreter_enabled(),
        INTERPRETED=interpreter_enabled(),
    )


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Tensor descriptors can read these (B, H, N, d) tensors: Triton has them, the head dim
    is contiguous, and every base and other stride is a multiple of 16 bytes."""
    if not hasattr(tl, "make_tensor_descriptor"):
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any((stride * size) % 16 for stride in t.stride()[:-1]):
            return False
    return True


def _meta_4d_strides(shape, strides=None) -> tuple:
    """Strides of the (B, H, N, d) view of a tensor of ``shape`` (and ``strides``, default
    contiguous): our outputs."""
    t = torch.empty(shape, device="meta") if strides is None else torch.empty_strided(shape, strides, device="meta")
    return as_4d(t).stride()


_dense_strides_like = dense_strides_like
_signature = signature
_PLANS = PlanCache(512)  # (kind, scalars, signature) -> plan
_cached_plan = _PLANS.get


def _forward_key(q, k, v, is_causal, scale):
    """The forward plan's cache key, or None where the inputs cannot have one (they are then
    validated on every call, which raises the clear error)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return None
    try:
        key = ("fwd", type(is_causal), is_causal, type(scale), scale, _signature(q, k, v))
        hash(key)
    except TypeError:  # an unhashable is_causal or scale: validation will name it
        return None
    return key


class _ForwardPlan:
    """Everything a forward over inputs of one signature needs except the inputs: the checked
    scale, the config, the output shapes and the kernel launch with its strides fixed."""

    def __init__(self, q, k, v, is_causal, scale, config=None):
        self.scale = validate_attention_inputs(q, k, v, is_causal, scale, max_head_dim=256, triton=True)
        self.is_causal = bool(is_causal)
        d = q.shape[-1]
        batch_heads = math.prod(q.shape[:-2])
        cfg = _coerce_config(config, ForwardConfig,
                             default_forward_config(q.dtype, d, q.device, batch_heads, q.shape[-2], is_causal,
                                                    k.shape[-2]))
        _check_blocks(block_m=cfg.block_m, block_n=cfg.block_n)
        self.o_shape, self.lse_shape = q.shape, q.shape[:-1]
        self.o_strides = _dense_strides_like(q)
        self.dtype, self.device = q.dtype, q.device
        self.to_4d = q.dim() > 4  # merging outer batch dims may copy: done per call
        self.launch = self.combine = None
        if q.numel() == 0:  # an empty batch: nothing to compute
            return
        q4, k4, v4 = (as_4d(t) for t in (q, k, v))
        batch, heads, n_q, _ = q4.shape
        n_k = k4.shape[2]
        n_m_tiles = triton.cdiv(n_q, cfg.block_m)
        split = _split_keys(cfg, n_k)
        n_splits = triton.cdiv(n_k, split) if split else 1
        rest = (*q4.stride(), *k4.stride(), *v4.stride(), *_meta_4d_strides(q.shape, self.o_strides),
                heads, n_q, n_k, n_m_tiles, n_splits, self.scale, self.scale * 1.4426950408889634)
        tma = bool(cfg.tma and _tma_ready(k4, v4))
        constexprs = dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=_block_d(d),
                          IS_CAUSAL=self.is_causal, LONGEST_FIRST=bool(cfg.longest_first and is_causal),
                          USE_TMA=tma, SPLIT_KEYS=split, **_dot_settings(q.dtype))
        self.launch = Launch(_flash_fwd_kernel, (n_m_tiles * batch * heads, n_splits), rest, constexprs,
                             _options(q.device, cfg.num_warps, cfg.num_stages, cfg.fp_fusion), q.device, tma)
        if split:
            # The splits' partial sums, then their merge (without fused multiply-adds: L's rounding).
            self.parts = ((n_splits * batch * heads, n_q, d), (n_splits * batch * heads, 2, n_q))
            self.combine = Launch(_flash_fwd_combine_kernel, (n_m_tiles * batch * heads,),
                                  (*_meta_4d_strides(q.shape, self.o_strides), heads, n_q, n_m_tiles, n_splits,
                                   self.scale,
                                   self.scale * 1.4426950408889634),
                                  # the count at run time (no recompile per count), no programmatic launch
                                  dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_D=_block_d(d), SPLITS=0, WAIT_PRIOR=False),
                                  _options(q.device, 4, 1), q.device, False)

    def __call__(self, q, k, v):
        o = torch.empty_strided(self.o_shape, self.o_strides, dtype=self.dtype, device=self.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        if self.launch is not None:
            if self.to_4d:
                q, k, v = as_4d(q), as_4d(k), as_4d(v)
            if self.combine is None:
                self.launch(q, k, v, o, lse, lse, lse)  # lse stands in for the unused split buffers
            else:
                o_part = torch.empty(self.parts[0], dtype=torch.float32, device=self.device)
                ml_part = torch.empty(self.parts[1], dtype=torch.float32, device=self.device)
                self.launch(q, k, v, o, lse, o_part, ml_part)
                self.combine(o_part, ml_part, o, lse)
        return o, lse


class _BackwardPlan:
    """The backward's launches (two, or three in one pass) for one signature of (q, k, v, o, lse, dO)."""

    def __init__(self, q, k, v, o, lse, grad_o, is_causal: bool, scale: float, config=None):
        d = q.shape[-1]
        batch_heads = math.prod(q.shape[:-2])
        cfg = _coerce_config(config, BackwardConfig,
                             default_backward_config(q.dtype, d, q.device, is_causal, batch_heads, k.shape[-2],
                                                     q.shape[-2]))
        _check_blocks(dkdv_block_n=cfg.dkdv_block_n, dkdv_block_m=cfg.dkdv_block_m, dq_block_m=cfg.dq_block_m,
                      dq_block_n=cfg.dq_block_n, preprocess_block_m=cfg.preprocess_block_m)
        self.q_shape, self.k_shape, self.v_shape, self.lse_shape = q.shape, k.shape, v.shape, q.shape[:-1]
        self.dtype, self.device = q.dtype, q.device
        self.to_4d = q.dim() > 4
        self.lse_contiguous = lse.is_contiguous()  # flat (batch * heads * N_q) indexing
        self.launches = None
        self.grad_strides = tuple(_dense_strides_like(t) for t in (q, k, v))  # each gradient laid out like its input
        if q.numel() == 0:
            return
        q4, k4, v4, o4, do4 = (as_4d(t) for t in (q, k, v, o, grad_o))
        dq_s, dk_s, dv_s = (_meta_4d_strides(t.shape, st) for t, st in zip((q, k, v), self.grad_strides))
        batch, heads, n_q, _ = q4.shape
        n_k = k4.shape[2]
        common = dict(HEAD_DIM=d, BLOCK_D=_block_d(d))
        masks = dict(IS_CAUSAL=bool(is_causal), LONGEST_FIRST=bool(cfg.longest_first and is_causal))
        dots = _dot_settings(q.dtype)
        dq_warps = cfg.num_warps if cfg.dq_num_warps is None else cfg.dq_num_warps
        dq_stages = cfg.num_stages if cfg.dq_num_stages is None else cfg.dq_num_stages
        dev = q.device

        n_n_tiles = triton.cdiv(n_k, cfg.dkdv_block_n)
        self.one_launch = cfg.one_launch
        if self.one_launch:
            tma = bool(cfg.tma and _tma_ready(q4, k4, v4, o4, do4))
            self.atomic_dq = False
            self.launches = (one_launch_backward(
                (q4, k4, v4, o4, do4), (dq_s, dk_s, dv_s), cfg, bool(is_causal), scale, tma,
                _options(dev, cfg.num_warps, cfg.num_stages)),)
            return
        self.atomic_dq = _one_pass(cfg, requested=config is not None)
        tma = bool(cfg.tma and _tma_ready(q4, do4))
        dkdv = Launch(_flash_bwd_dkdv_kernel, (n_n_tiles * batch * heads,),
                      (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk_s, *dv_s,
                       heads, n_q, n_k, n_n_tiles, scale),
                      dict(common, BLOCK_M=cfg.dkdv_block_m, BLOCK_N=cfg.dkdv_block_n, **masks,
                           KEYS_EVEN=n_k % cfg.dkdv_block_n == 0, USE_TMA=tma, ATOMIC_DQ=self.atomic_dq, **dots),
                      _options(dev, cfg.num_warps, cfg.num_stages), dev, tma)
        if self.atomic_dq:
            # D and a zeroed float32 dQ first; the one-pass dK/dV kernel adds into it; then dQ.
            n_p_tiles = triton.cdiv(n_q, cfg.preprocess_block_m)
            rows = dict(common, BLOCK_M=cfg.preprocess_block_m)
            pre = Launch(_flash_bwd_preprocess_kernel, (n_p_tiles * batch * heads,),
                         (*o4.stride(), *do4.stride(), heads, n_q, n_p_tiles), rows, _options(dev, 4, 1), dev, False)
            convert = Launch(_flash_bwd_dq_convert_kernel, (n_p_tiles * batch * heads,),
                             (*dq_s, heads, n_q, n_p_tiles, scale), rows, _options(dev, 4, 1), dev, False)
            self.dq_acc_shape = (batch * heads, n_q, d)
            self.launches = (pre, dkdv, convert)
            return

        n_m_tiles = triton.cdiv(n_q, cfg.dq_block_m)
        tma = bool(cfg.tma and _tma_ready(k4, v4))
        dq = Launch(_flash_bwd_dq_kernel, (n_m_tiles * batch * heads,),
                    (*q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), *do4.stride(), *dq_s,
                     heads, n_q, n_k, n_m_tiles, scale),
                    dict(common, BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n, **masks, USE_TMA=tma, **dots),
                    _options(dev, dq_warps, dq_stages), dev, tma)
        self.launches = (dq, dkdv)  # dQ first: it computes D, which dK/dV reads

    def __call__(self, q, k, v, o, lse, grad_o):
        dq, dk, dv = (torch.empty_strided(shape, strides, dtype=self.dtype, device=self.device)
                      for shape, strides in zip((self.q_shape, self.k_shape, self.v_shape), self.grad_strides))
        if self.launches is None:
            return dq, dk, dv
        if self.one_launch:
            if not self.lse_contiguous:
                lse = lse.contiguous()
            if self.to_4d:
                q, k, v, o, grad_o = (as_4d(t) for t in (q, k, v, o, grad_o))
            self.launches[0](q, k, v, o, grad_o, lse, dq, dk, dv)
            return dq, dk, dv
        delta = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        if not self.lse_contiguous:
            lse = lse.contiguous()
        if self.to_4d:
            q, k, v, o, grad_o = (as_4d(t) for t in (q, k, v, o, grad_o))
        if self.atomic_dq:
            pre, dkdv, convert = self.launches
            dq_acc = torch.empty(self.dq_acc_shape, dtype=torch.float32, device=self.device)
            pre(o, grad_o, delta, dq_acc)
            dkdv(q, k, v, grad_o, lse, delta, dk, dv, dq_acc)
            convert(dq_acc, dq)
            return dq, dk, dv
        dq_launch, dkdv = self.launches
        dq_launch(q, k, v, o, grad_o, lse, delta, dq)
        dkdv(q, k, v, grad_o, lse, delta, dk, dv, delta)  # delta stands in for the unused dQ accumulator
        return dq, dk, dv


def one_launch_backward(tensors4, grad_strides4, cfg: BackwardConfig, is_causal: bool, scale: float, tma: bool,
                        options) -> Launch:
    """The Launch of ``_flash_bwd_one_launch_kernel`` for (B, H, N, d) views of q, k, v, O, dO
    (``tensors4``, for their strides and shapes) and the 4-d strides of dQ, dK, dV; a call
    takes (q, k, v, O, dO, L, dQ, dK, dV).  Its tiles: cfg's dq_block_m x dq_block_n for the
    dQ programs, dkdv_block_n x dkdv_block_m for the dK/dV ones."""
    q4, k4, v4, o4, do4 = tensors4
    batch, heads, n_q, d = q4.shape
    n_k = k4.shape[2]
    n_m_tiles, n_n_tiles = triton.cdiv(n_q, cfg.dq_block_m), triton.cdiv(n_k, cfg.dkdv_block_n)
    n_dq = n_m_tiles * batch * heads
    return Launch(_flash_bwd_one_launch_kernel, (n_dq + n_n_tiles * batch * heads,),
                  (*q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), *do4.stride(), *grad_strides4[0],
                   *grad_strides4[1], *grad_strides4[2], heads, n_q, n_k, n_m_tiles, n_n_tiles, n_dq, scale),
                  dict(HEAD_DIM=d, DQ_BLOCK_M=cfg.dq_block_m, DQ_BLOCK_N=cfg.dq_block_n,
                       DKDV_BLOCK_M=cfg.dkdv_block_m, DKDV_BLOCK_N=cfg.dkdv_block_n, BLOCK_D=_block_d(d),
                       IS_CAUSAL=is_causal, KEYS_EVEN=n_k % cfg.dkdv_block_n == 0, USE_TMA=tma,
                       **_dot_settings(q4.dtype)),
                  options, q4.device, tma)


def _split_keys(cfg: ForwardConfig, n_k: int) -> int:
    """The config's keys per split program, checked; 0 where one split would cover every key."""
    split = cfg.split_keys
    if not split:
        return 0
    if not (isinstance(split, int) and split > 0 and split % cfg.block_m == 0 and split % cfg.block_n == 0):
        raise ValueError(f"split_keys={split!r} must be a positive multiple of block_m={cfg.block_m} "
                         f"and block_n={cfg.block_n}")
    return split if split < n_k else 0


def _determinism() -> tuple:
    """torch's deterministic-algorithms setting, which decides the backward's plan (_one_pass)."""
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _one_pass(cfg: BackwardConfig, requested: bool) -> bool:
    """Whether to run the one-pass backward, whose atomic dQ adds land in a varying order on a
    GPU.  As torch does for its own kernels under ``torch.use_deterministic_algorithms``:
    the default table's one pass quietly gives way to the two deterministic kernels; a
    config the caller passed (``requested``) that asks for it is an error, or under
    ``warn_only`` a warning and the one pass."""
    if not cfg.dq_atomic or not torch.are_deterministic_algorithms_enabled():
        return bool(cfg.dq_atomic)
    if not requested:
        return False
    message = ("attention backward: config dq_atomic=True adds dQ with atomics, which is not deterministic; "
               "pass dq_atomic=False under torch.use_deterministic_algorithms(True)")
    if not torch.is_deterministic_algorithms_warn_only_enabled():
        raise RuntimeError(message)
    warnings.warn(message, UserWarning, stacklevel=5)
    return True


def _options(device: torch.device, num_warps: int, num_stages: int, fp_fusion: bool = False):
    """Triton launch options; none under the interpreter, which takes none.

    enable_fp_fusion=False for the backward: scale * s must round to the same bits in the
    forward's L and in the backward's exp(scale s - L); a fused multiply-add there skips
    that rounding (seen on an H100: fp32, d=80, a row with one visible key got P = 1 - 2e-6,
    not 1).  The forward may fuse (ForwardConfig.fp_fusion): its only multiply-adds are
    l = alpha l + rowsum(P) and L = scale m + log l, and where one key holds all the weight
    (l = 1, log l = 0) the fused L = fma(m, scale, 0) rounds like scale * m.
    """
    if device.type != "cuda":
        return None
    return dict(num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=fp_fusion)


def _forward_plan(q, k, v, is_causal, scale, key=None) -> _ForwardPlan:
    if key is None:
        return _ForwardPlan(q, k, v, is_causal, scale)  # uncached; validation raises on bad input
    return _cached_plan(key, lambda: _ForwardPlan(q, k, v, is_causal, scale))


def _forward(q, k, v, is_causal: bool, scale: float, config: ForwardConfig | None = None):
    """O, L (plans are checked when made; see flash_forward)."""
    return flash_forward(q, k, v, is_causal, scale, config)


def _backward(q, k, v, o, lse, grad_o, is_causal: bool, scale: float, config: BackwardConfig | None = None,
              forward_key=None):
    """dQ, dK, dV for checked inputs.  ``forward_key``: the key of the forward plan that made
    ``o`` and ``lse`` from these q, k, v (it decides their signatures; only dO's is added)."""
    if config is not None:  # a config override gets plans of its own
        config = _coerce_config(config, BackwardConfig,
                                default_backward_config(q.dtype, q.shape[-1], q.device, is_causal))
        key = ("bwd", bool(is_causal), float(scale), config, _signature(q, k, v, o, lse, grad_o), _determinism())
        plan = _cached_plan(key, lambda: _BackwardPlan(q, k, v, o, lse, grad_o, bool(is_causal), float(scale), config))
        return plan(q, k, v, o, lse, grad_o)
    deterministic = _determinism()
    if forward_key is not None:
        key = ("bwd", forward_key, _signature(grad_o), deterministic)
    else:
        key = ("bwd", bool(is_causal), float(scale), _signature(q, k, v, o, lse, grad_o), deterministic)
    plan = _cached_plan(key, lambda: _BackwardPlan(q, k, v, o, lse, grad_o, bool(is_causal), float(scale)))
    return plan(q, k, v, o, lse, grad_o)


def flash_forward(q, k, v, is_causal: bool = False, scale: float | None = None, config=None):
    """FlashAttention-2 forward: (O in q.dtype, L float32 of shape q.shape[:-1]).

    ``config``: a ForwardConfig or a dict of its fields overriding the default table.
    """
    key = _forward_key(q, k, v, is_causal, scale)
    if config is not None:  # a config override gets plans of its own
        config = _coerce_config(config, ForwardConfig, default_forward_config(q.dtype, q.shape[-1], q.device))
        if key is None:
            return _ForwardPlan(q, k, v, is_causal, scale, config)(q, k, v)
        return _cached_plan((key, config), lambda: _ForwardPlan(q, k, v, is_causal, scale, config))(q, k, v)
    return _forward_plan(q, k, v, is_causal, scale, key)(q, k, v)


def flash_backward(q, k, v, o, lse, grad_o, is_causal: bool = False, scale: float | None = None, config=None):
    """FlashAttention-2 backward: (dQ, dK, dV) in the input dtypes.

    ``o``, ``lse`` are flash_forward's outputs; ``config`` a BackwardConfig or a dict of
    its fields overriding the default table.
    """
    scale = validate_attention_inputs(q, k, v, is_causal, scale, max_head_dim=256, triton=True)
    _check_like("o", o, q.shape, q.dtype, q.device)
    _check_like("grad_o", grad_o, q.shape, q.dtype, q.device)
    _check_like("lse", lse, q.shape[:-1], torch.float32, q.device)
    return _backward(q, k, v, o, lse, grad_o, bool(is_causal), scale, config)


def _check_like(name, t, shape, dtype, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"attention backward: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != shape:
        raise ValueError(f"attention backward: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.dtype != dtype:
        raise TypeError(f"attention backward: {name} has dtype {t.dtype}, expected {dtype}")
    if t.device != device:
        raise ValueError(f"attention backward: {name} is on {t.device}, expected {device}")


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 forward and backward in Triton kernels (see the module contract).

    The host path is kept short for short sequences: inputs are validated once per
    signature (shapes, strides, dtypes, devices, alignment, is_causal, scale), when its
    plan is made, and the kernels are launched from the plan (``triton_launch.Launch``).
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None):
        key = _forward_key(q, k, v, is_causal, scale)
        plan = _forward_plan(q, k, v, is_causal, scale, key)
        o, lse = plan(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale, ctx.plan_key = plan.is_causal, plan.scale, key
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        if grad_o.dtype != q.dtype:
            grad_o = grad_o.to(q.dtype)
        dq, dk, dv = _backward(q, k, v, o, lse, grad_o, ctx.is_causal, ctx.scale, forward_key=ctx.plan_key)
        return dq, dk, dv, None, None
