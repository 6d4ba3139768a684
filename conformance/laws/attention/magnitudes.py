"""The oracle's yardstick for attention: the magnitudes of the terms summed into each
output and gradient element (the rounding floor ``conformance.oracle`` adds), the eager
forward a low-precision FlashAttention is measured against, and the calibration that
shows the tiled PyTorch FlashAttention-2 sits well inside the bound.

FlashAttention's contract for fp16 and bf16 inputs is to accumulate in float32: the
handout's kernels keep the running max, the softmax denominator l and the O accumulator
in float32, round P to the input dtype for the P V matmul, and round O once at the end.
So the forward's yardstick in low precision is that arithmetic done eagerly
(``mixed_precision_forward``), and O's rounding floor is float32 ulps of the terms summed
plus one input-dtype ulp of O itself (the final rounding costs half), not input-dtype ulps
of every term.  Measured on the CPU (bf16, N = 2048, d = 16): the tiled PyTorch FA2 uses
0.13 of that bound; a kernel accumulating in bf16 1.86 of it.
An implementation that accumulates in the input precision makes an error that grows with
the number of keys (``conformance.mutants.attention``: ``input_precision_accumulators``,
rejected by the contract law on sequences in the thousands).

``python -m conformance.laws.attention.magnitudes`` prints the calibration.
"""

from __future__ import annotations

import math

import torch

from conformance import oracle
from impl.attention.reference import attention_reference, attention_scores, causal_mask, default_scale


def attention_magnitudes(q, k, v, grad_o, is_causal: bool, scale: float, dtype=None) -> dict[str, torch.Tensor]:
    """Float64 magnitudes of the terms summed into each attention output and gradient.

        |S| ~ scale |Q| |K|^T         O = P V         ->  mag_O  = P |V| + c_d (P |S|) (|V| + |O|)
        L = max S + log sum exp(...)                   ->  mag_L  = |L| + max_j scale (|Q| |K|^T)_ij
        dS = P * (dO V^T - D),  D = rowsum(dO * O)     ->  mag_dS = P' * (|dO| |V|^T + rowsum|dO * O|)
        dQ = scale dS K,  dK = scale dS^T Q,  dV = P'^T dO  (magnitudes with |.| inside)

    Backward recomputes P = exp(S - L) from the saved float32 L (the FlashAttention-2
    contract), so the exponent carries an absolute rounding error of about
    eps32 (|S| + |L|): P' = P (1 + (eps32 / eps) (|S| + |L|)) folds that in, expressed in
    units of the tested dtype's eps (``dtype``, default float32).  The scores' own float32
    rounding, up to about c_d = log2(d) + 1 ulps of scale |Q| |K|^T, moves O through P.
    """
    q, k, v, do = (t.detach().to(torch.float64) for t in (q, k, v, grad_o))  # on their device (GPU float64 is fast)
    s = attention_scores(q, k, is_causal, scale)
    p = torch.softmax(s, dim=-1)
    o = p @ v
    mag_s = scale * (q.abs() @ k.abs().transpose(-1, -2))
    if is_causal:
        mag_s = mag_s.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), 0.0)
    lse = torch.logsumexp(s, dim=-1)
    exp_arg_ulps = oracle.eps(torch.float32) / oracle.eps(dtype or torch.float32)
    # GPUs flush float32 results below the smallest normal to zero (ex2.approx.ftz, FTZ
    # multiplies): every unmasked P and dS element may be off by up to that much, absolutely.
    # In units of the tested dtype's eps, as the judge scales magnitudes; seen on an H100: a
    # dK of 4.4e-37 (an extreme softmax scale) read as 0 against a bound of 4.7e-38.
    ftz = oracle.tiny(torch.float32) / oracle.eps(dtype or torch.float32)
    seen = torch.ones_like(s) if not is_causal else (~causal_mask(q.shape[-2], k.shape[-2], q.device)).to(s.dtype)
    p_ftz = p + ftz * seen
    p_recomputed = p_ftz * (1 + exp_arg_ulps * (mag_s + lse.abs()[..., None]))
    mag_ds = p_recomputed * (do.abs() @ v.abs().transpose(-1, -2) + (do * o).abs().sum(-1, keepdim=True)) + ftz * seen
    # A score is a float32 dot product of d terms: summed blockwise it errs by up to about
    # (log2 d + 1) u32 mag_s (pairwise summation's bound), which moves O_i by
    # sum_j P_ij (V_j - O_i) dS_ij.  Where q and k are large (scores in the hundreds) this is
    # O's largest rounding term, and eager's error is a single draw of it: seen on an H100,
    # fp32, one query and two keys, ours 1.6e-5 against eager's 3.4e-6 (4.8x).
    # sum_j P_ij mag_s_ij |V_j - O_i| <= max_j mag_s_ij sqrt(sum_j P_ij (V_j - O_i)^2) (Cauchy-Schwarz,
    # sum_j P_ij = 1), and sum_j P_ij (V_j - O_i)^2 = (P V^2)_i - O_i^2: no N x N x d tensor.
    score_ulps = exp_arg_ulps * (math.ceil(math.log2(q.shape[-1])) + 1)
    spread = ((p @ (v * v)) - o * o).clamp_min(0).sqrt()
    mag_o_scores = score_ulps * torch.nan_to_num(mag_s.amax(dim=-1, keepdim=True)) * spread
    mag_o = p_ftz @ v.abs() + mag_o_scores
    if dtype in (torch.float16, torch.bfloat16):
        # accumulated in float32 and rounded once (half an ulp of O): the floor is FLOOR_ULPS
        # float32 ulps of the terms summed plus one ulp of O in the tested dtype
        mag_o = exp_arg_ulps * (p @ v.abs()) + ftz * (seen @ v.abs()) + mag_o_scores + o.abs() / oracle.FLOOR_ULPS
    return {
        "O": mag_o,
        "L": lse.abs() + mag_s.amax(dim=-1),
        "dQ": scale * (mag_ds @ k.abs()),
        "dK": scale * (mag_ds.transpose(-1, -2) @ q.abs()),
        "dV": p_recomputed.transpose(-1, -2) @ do.abs(),
    }


def mixed_precision_forward(q, k, v, is_causal: bool, scale=None):
    """(O, L) from low-precision inputs the way a FlashAttention kernel computes them: float32
    scores, max, denominator and accumulation; P rounded to the input dtype before P V; O
    rounded to the input dtype at the end; L kept in float32."""
    s = attention_scores(q.float(), k.float(), is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    m = s.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)  # a fully masked row stays finite
    p = torch.exp(s - m)
    o = (p.to(q.dtype).float() @ v.float()) / p.sum(dim=-1, keepdim=True)
    return o.to(q.dtype), lse


def _calibrate() -> None:  # pragma: no cover - a measurement script, not a test
    """Print how close the tiled PyTorch FA2 comes to the bound: max over elements of
    (|err| - floor) / eager error.  FACTOR must sit well above what correct code reaches."""
    from impl.attention.flash_pytorch import FlashAttentionPytorch

    g = torch.Generator().manual_seed(0)
    worst: dict[str, float] = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for trial in range(40):
            n_q, n_k = (int(x) for x in torch.randint(1, 150, (2,), generator=g))
            d, causal = 64, bool(trial % 2)
            q, k, v = (torch.randn(2, n, d, generator=g, dtype=torch.float64) for n in (n_q, n_k, n_k))
            do = torch.randn(2, n_q, d, generator=g, dtype=torch.float64)
            low = [t.to(dtype) for t in (q, k, v, do)]
            q, k, v, do = (t.double() for t in low)  # the reference sees the rounded inputs
            ref = _fwd_bwd(attention_reference, q, k, v, do, causal)
            eager = _fwd_bwd(attention_reference, *low, causal)
            tiled = _fwd_bwd(FlashAttentionPytorch.apply, *low, causal)
            mags = attention_magnitudes(q, k, v, do, causal, default_scale(d), dtype)
            for key in ref:
                e = oracle.max_abs_error(eager[key], ref[key])
                diff = (tiled[key].double() - ref[key]).abs()
                excess = float((diff - oracle.FLOOR_ULPS * oracle.eps(dtype) * mags[key]).max())
                ratio = max(excess, 0.0) / max(e, 1e-300)
                name = f"{str(dtype).replace('torch.', '')} {key}"
                worst[name] = max(worst.get(name, 0.0), ratio)
    for key, ratio in sorted(worst.items()):
        print(f"{key:16s} worst (|err| - floor) / eager error = {ratio:.2f}")


def _fwd_bwd(fn, q, k, v, do, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal)
    o = out[0] if isinstance(out, tuple) else out
    lse = out[1] if isinstance(out, tuple) else o.grad_fn.saved_tensors[-1]
    o.backward(do)
    return {"O": o.detach(), "L": lse.detach(), "dQ": q.grad, "dK": k.grad, "dV": v.grad}


if __name__ == "__main__":  # pragma: no cover
    _calibrate()
