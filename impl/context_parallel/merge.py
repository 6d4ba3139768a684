"""Merging two attention partials by their log-sum-exp.

A partial (O_b, L_b) is attention of some queries over one block of keys:
L_b = log sum_{j in b} exp(s_j) (natural log) and O_b = sum_j exp(s_j - L_b) v_j.
Two blocks merge into attention over their union:

    L = log(exp(L_1) + exp(L_2)) = m + log(exp(L_1 - m) + exp(L_2 - m)),  m = max(L_1, L_2)
    O = exp(L_1 - L) O_1 + exp(L_2 - L) O_2

Subtracting m keeps every exponent <= 0 (no overflow at any L).  A fully masked block has
L = -inf and contributes weight 0 whatever its O holds; two fully masked blocks give
(0, -inf), never NaN.  (0, -inf) is the identity: merging it leaves (O, L) bit for bit.
"""

from __future__ import annotations

import torch


def _check(o1, lse1, o2, lse2) -> None:
    for name, t in (("o1", o1), ("lse1", lse1), ("o2", o2), ("lse2", lse2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"merge_attention_partials: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"merge_attention_partials: {name} must be floating point, got {t.dtype}")
    if o1.shape != o2.shape:
        raise ValueError(f"merge_attention_partials: o1 {tuple(o1.shape)} and o2 {tuple(o2.shape)} differ")
    if o1.dim() < 1 or lse1.shape != o1.shape[:-1] or lse2.shape != o1.shape[:-1]:
        raise ValueError(
            "merge_attention_partials: lse must have shape o.shape[:-1] = "
            f"{tuple(o1.shape[:-1])}, got {tuple(lse1.shape)} and {tuple(lse2.shape)}"
        )
    devices = {t.device for t in (o1, lse1, o2, lse2)}
    if len(devices) > 1:
        raise ValueError(f"merge_attention_partials: tensors on different devices: {sorted(map(str, devices))}")


def merge_attention_partials(o1, lse1, o2, lse2):
    """(O, L) of the union of two key blocks; see the module docstring.

    O in the promoted dtype of o1 and o2, L in the promoted dtype of lse1 and lse2; the
    arithmetic runs in float32 (float64 when any input is float64).
    """
    _check(o1, lse1, o2, lse2)
    o_dtype = torch.promote_types(o1.dtype, o2.dtype)
    l_dtype = torch.promote_types(lse1.dtype, lse2.dtype)
    work = torch.float64 if torch.float64 in (o_dtype, l_dtype) else torch.float32
    l1, l2 = lse1.to(work), lse2.to(work)
    m = torch.maximum(l1, l2)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # both -inf: any finite shift
    w1 = torch.exp(l1 - m)  # <= 1; exactly 0 for a fully masked block
    w2 = torch.exp(l2 - m)
    total = w1 + w2
    lse = m + torch.log(total)  # -inf where both blocks are fully masked
    w1, w2 = w1[..., None], w2[..., None]
    weighted = torch.where(w1 > 0, w1 * o1.to(work), 0.0) + torch.where(w2 > 0, w2 * o2.to(work), 0.0)
    t = total[..., None]
    o = torch.where(t > 0, weighted / torch.where(t > 0, t, 1.0), 0.0)
    return o.to(o_dtype), lse.to(l_dtype)
