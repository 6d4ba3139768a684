"""FlashAttention-2 in PyTorch tiles (Dao, 2023, Algorithms 1 and 2).

Contract
    apply(q, k, v, is_causal=False, scale=None) -> O
    q: (..., N_q, d), k and v: (..., N_k, d), equal leading dims, any strides.
    dtypes: float16, bfloat16, float32, float64 (float64 for gradcheck).  Any device.
    Tiles are computed in float32 (float64 for float64 inputs); O is returned in the
    input dtype, the logsumexp L in float32 (float64 for float64 inputs).
    is_causal: query i sees keys j <= i, top-left aligned; for N_q != N_k that is the
    same rule on absolute indices (row i of a short query block sees keys 0..i).
    scale: softmax scale, default 1/sqrt(d).
    Saved for backward: q, k, v, O, and L of shape q.shape[:-1] (the only saved tensor
    of that shape).  Backward recomputes P tile by tile with D = rowsum(dO * O); the
    N_q x N_k matrix is never materialised.
"""

from __future__ import annotations

import torch

from .validation import validate_attention_inputs

TILE_Q = 32
TILE_K = 32


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _flatten_batch(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1])


def _key_tiles_for(q_start: int, q_end: int, n_k: int, tile_k: int, is_causal: bool):
    """Key tile starts that query rows [q_start, q_end) can see."""
    last_key = n_k if not is_causal else min(n_k, q_end)  # row q_end-1 sees keys <= q_end-1
    return range(0, last_key, tile_k)


def flash_forward(q, k, v, is_causal: bool, scale: float, tile_q=TILE_Q, tile_k=TILE_K):
    """Tiled forward with the online softmax; returns (O in q.dtype, L in the work dtype)."""
    work = _work_dtype(q.dtype)
    qf, kf, vf = _flatten_batch(q), _flatten_batch(k), _flatten_batch(v)
    batch, n_q, d = qf.shape
    n_k = kf.shape[1]
    o = torch.empty(batch, n_q, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, n_q, dtype=work, device=q.device)
    for qs in range(0, n_q, tile_q):
        qe = min(qs + tile_q, n_q)
        q_i = qf[:, qs:qe].to(work)
        m_i = torch.full((batch, qe - qs), float("-inf"), dtype=work, device=q.device)  # running max
        l_i = torch.zeros((batch, qe - qs), dtype=work, device=q.device)  # running sum of exp
        acc = torch.zeros((batch, qe - qs, d), dtype=work, device=q.device)  # unnormalised O
        for ks in _key_tiles_for(qs, qe, n_k, tile_k, is_causal):
            ke = min(ks + tile_k, n_k)
            k_j, v_j = kf[:, ks:ke].to(work), vf[:, ks:ke].to(work)
            s_ij = (q_i @ k_j.transpose(1, 2)) * scale
            if is_causal and ke - 1 > qs:  # tile touches the diagonal
                rows = torch.arange(qs, qe, device=q.device)[:, None]
                cols = torch.arange(ks, ke, device=q.device)[None, :]
                s_ij = s_ij.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m_i, s_ij.amax(dim=-1))
            p_ij = torch.exp(s_ij - m_new[..., None])  # exp(S - m_new)
            alpha = torch.exp(m_i - m_new)  # rescale of what was summed under the old max
            l_i = alpha * l_i + p_ij.sum(dim=-1)
            acc = alpha[..., None] * acc + p_ij @ v_j
            m_i = m_new
        o[:, qs:qe] = (acc / l_i[..., None]).to(q.dtype)  # O_i = diag(l_i)^-1 acc
        lse[:, qs:qe] = m_i + torch.log(l_i)  # L_i = m_i + log l_i
    return o.reshape(q.shape), lse.reshape(q.shape[:-1])


def flash_backward(q, k, v, o, lse, grad_o, is_causal: bool, scale: float, tile_q=TILE_Q, tile_k=TILE_K):
    """Tiled backward by recomputation (FlashAttention-2, Algorithm 2)."""
    work = _work_dtype(q.dtype)
    qf, kf, vf = _flatten_batch(q), _flatten_batch(k), _flatten_batch(v)
    of, dof = _flatten_batch(o), _flatten_batch(grad_o)
    lf = lse.reshape(qf.shape[0], qf.shape[1]).to(work)
    batch, n_q, d = qf.shape
    n_k = kf.shape[1]
    d_rows = (dof.to(work) * of.to(work)).sum(dim=-1)  # D_i = rowsum(dO_i * O_i)
    dq = torch.zeros(batch, n_q, d, dtype=work, device=q.device)
    dk = torch.zeros(batch, n_k, d, dtype=work, device=q.device)
    dv = torch.zeros(batch, n_k, d, dtype=work, device=q.device)
    for ks in range(0, n_k, tile_k):
        ke = min(ks + tile_k, n_k)
        k_j, v_j = kf[:, ks:ke].to(work), vf[:, ks:ke].to(work)
        first_q = ks if is_causal else 0  # under causal masking rows < ks see none of these keys
        for qs in range(first_q - first_q % tile_q, n_q, tile_q):
            qe = min(qs + tile_q, n_q)
            q_i, do_i = qf[:, qs:qe].to(work), dof[:, qs:qe].to(work)
            s_ij = (q_i @ k_j.transpose(1, 2)) * scale
            if is_causal:
                rows = torch.arange(qs, qe, device=q.device)[:, None]
                cols = torch.arange(ks, ke, device=q.device)[None, :]
                s_ij = s_ij.masked_fill(cols > rows, float("-inf"))
            p_ij = torch.exp(s_ij - lf[:, qs:qe, None])  # P = exp(S - L)
            dv[:, ks:ke] += p_ij.transpose(1, 2) @ do_i  # dV_j += P^T dO_i
            dp_ij = do_i @ v_j.transpose(1, 2)  # dP = dO_i V_j^T
            ds_ij = p_ij * (dp_ij - d_rows[:, qs:qe, None])  # dS = P * (dP - D_i)
            dq[:, qs:qe] += (ds_ij @ k_j) * scale  # dQ_i += dS K_j * scale
            dk[:, ks:ke] += (ds_ij.transpose(1, 2) @ q_i) * scale  # dK_j += dS^T Q_i * scale
    return (
        dq.to(q.dtype).reshape(q.shape),
        dk.to(k.dtype).reshape(k.shape),
        dv.to(v.dtype).reshape(v.shape),
    )


class FlashAttentionPytorch(torch.autograd.Function):
    """FlashAttention-2 forward and backward in PyTorch tiles (see the module contract)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None):
        scale = validate_attention_inputs(
            q, k, v, is_causal, scale, dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64), max_head_dim=256
        )
        o, lse = flash_forward(q, k, v, bool(is_causal), scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = bool(is_causal)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, lse, grad_o, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None
