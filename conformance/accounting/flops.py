"""Model FLOPs of the GPT-style model (``impl.models.gpt``) and model FLOPs utilisation.

Matmul FLOPs only (2 per multiply-add), as a FLOP counter counts them.  With L blocks,
width C, MLP width F, vocabulary V and context T:

    N_mm = L (4 C^2 + 2 C F) + C V        weights that multiply: qkv (3C^2), proj (C^2),
                                          up and down (2CF), the head (CV); the token and
                                          position embeddings are look-ups, not matmuls
    forward, per token   2 N_mm + 4 L T C   (scores Q K^T and P V: 2 T C each per token)
    training, per token  6 N_mm + 12 L T C  (backward = 2 x forward: dX and dW per matmul;
                                             dS, dP, dQ, dK, dV for attention)

The attention term counts the whole T x T square, as PaLM's appendix and torch's FLOP
counter do; a causal kernel that skips masked tiles does about half of it.  MFU is the
model FLOPs a second the step achieves over the device's peak:

    MFU = flops_per_token x tokens_per_second / peak_flops
"""

from __future__ import annotations


def matmul_params(cfg) -> int:
    """N_mm: the parameters of the model's matmuls (embeddings excluded)."""
    c, f = cfg.d_model, cfg.d_ff
    return cfg.n_layers * (4 * c * c + 2 * c * f) + c * cfg.vocab_size


def attention_flops_per_token(cfg, seq: int, training: bool = True) -> int:
    forward = 4 * cfg.n_layers * seq * cfg.d_model
    return 3 * forward if training else forward


def flops_per_token(cfg, seq: int, training: bool = True) -> int:
    """Model FLOPs per token: 6 N_mm + 12 L T C for a training step, 2 N_mm + 4 L T C forward."""
    return (6 if training else 2) * matmul_params(cfg) + attention_flops_per_token(cfg, seq, training)


def mfu(flops_per_token_: float, tokens_per_s: float, peak_flops: float) -> float:
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    return flops_per_token_ * tokens_per_s / peak_flops
