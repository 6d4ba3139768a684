"""The Triton forward of ``attention_logspace``: one program per (64-query tile, batch element).

Each program keeps, per query row, its running logsumexp L and an output normalised by
exp(L) after every 64-key tile:

    L' = max(L, T) + log(1 + exp(min(L, T) - max(L, T))),  T = logsumexp_j S_ij over the tile
    O' = exp(L - L') O + exp(S - L') V

Every key tile is visited (no causal tile skipping); masked scores are -inf.  Inputs are
read through their strides with masks (rows past N, columns past d read 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N = 64, 64
NEG_INF = tl.constexpr(float("-inf"))  # a constexpr global: compiled kernels read no other globals


@triton.jit
def _logspace_fwd(Q, K, V, O, L,
                  s_qb, s_qn, s_qd, s_kb, s_kn, s_kd, s_vb, s_vn, s_vd, s_ob, s_on, s_od,
                  n_q, n_k, scale,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  IS_CAUSAL: tl.constexpr):
    b = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = tl.load(Q + b * s_qb + rows[:, None] * s_qn + dims[None, :] * s_qd,
                mask=(rows[:, None] < n_q) & dim_ok[None, :], other=0.0)
    lse = tl.full([BLOCK_M], NEG_INF, tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, n_k, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv_mask = (keys[:, None] < n_k) & dim_ok[None, :]
        k = tl.load(K + b * s_kb + keys[:, None] * s_kn + dims[None, :] * s_kd, mask=kv_mask, other=0.0)
        v = tl.load(V + b * s_vb + keys[:, None] * s_vn + dims[None, :] * s_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        visible = (keys[None, :] < n_k) & (rows[:, None] >= 0)
        if IS_CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        s = tl.where(visible, s, NEG_INF)
        # T = logsumexp of the tile's scores (-inf for a row that sees none of them)
        tile_max = tl.max(s, 1)
        shift = tl.where(tile_max == NEG_INF, 0.0, tile_max)
        empty = tile_max == NEG_INF
        tile_sum = tl.where(empty, 1.0, tl.sum(tl.exp(s - shift[:, None]), 1))
        tile_lse = tl.where(empty, NEG_INF, shift + tl.log(tile_sum))
        hi = tl.maximum(lse, tile_lse)
        lo = tl.minimum(lse, tile_lse)
        seen = hi != NEG_INF
        hi_safe = tl.where(seen, hi, 0.0)
        new = tl.where(seen, hi_safe + tl.log(1.0 + tl.exp(lo - hi_safe)), NEG_INF)  # logaddexp(L, T)
        new_safe = tl.where(seen, new, 0.0)
        keep = tl.where(seen, tl.exp(lse - new_safe), 0.0)  # exp(L - L')
        p = tl.where(seen[:, None], tl.exp(s - new_safe[:, None]), 0.0)  # exp(S - L')
        acc = acc * keep[:, None] + tl.dot(p, v.to(tl.float32))
        lse = new
    row_ok = rows < n_q
    tl.store(O + b * s_ob + rows[:, None] * s_on + dims[None, :] * s_od, acc.to(O.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(L + b * n_q + rows, lse, mask=row_ok)


def forward_triton(q, k, v, is_causal: bool, scale: float):
    """(O in q.dtype, L in float32), shaped as q and q.shape[:-1]."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"the Triton flavour takes float16, bfloat16 or float32, got {q.dtype}")
    qf, kf, vf = (t.reshape(-1, t.shape[-2], t.shape[-1]) for t in (q, k, v))
    batch, n_q, d = qf.shape
    n_k = kf.shape[1]
    o = torch.empty((batch, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, n_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n_q, BLOCK_M), batch)
    _logspace_fwd[grid](qf, kf, vf, o, lse, *qf.stride(), *kf.stride(), *vf.stride(), *o.stride(),
                        n_q, n_k, scale, HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, IS_CAUSAL=is_causal)
    return o.reshape(q.shape), lse.reshape(q.shape[:-1])
