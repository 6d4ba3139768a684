"""Memory accounting for data-parallel training with a (sharded) optimizer.

Per rank, the memory of a training step splits into four terms:

    parameters     P  = sum_p numel(p) * bytes(p)                  (replicated on every rank)
    gradients      G  = sum_p numel(p) * bytes(grad p)              (replicated; DDP all-reduces them)
    optimizer      S  = state bytes per element x elements owned    (the shard, for ZeRO-1)
    activations    A  = tensors autograd saves for backward         (per micro-batch)

Formulas this module states and the tests check on small models:

    AdamW / Adam (fp32 state): S = 2 x 4 x n + 4 x k      exp_avg and exp_avg_sq, plus one
                                                           fp32 "step" scalar per parameter
    SGD with momentum:          S = 4 x n                  momentum_buffer
    unsharded: n = all elements, k = all parameters.  Sharded over W ranks by the greedy
    largest-first assignment: n_r <= N/W + largest parameter, so
        S_r <= 2 x 4 x (N/W + n_max) + 4 x k_r.

    GPT activations (``impl.models.gpt``, fp32 on the CPU, SDPA attention), counted as the
    distinct storages autograd saves for backward in one forward pass; B x T tokens,
    width C, MLP width F, H heads, L blocks (``gpt_activation_bytes`` says which is which):
        per block  10 BTC + 2 BT + BHT + 2 BTF   floats
        after      3 BTC + BT                     floats   (final norm; the head saves its input)
        indices    BT + T                         int64    (token ids, positions)

``optimizer_state_bytes`` measures S for any optimizer: the tensors in its ``state`` and in
the ``state`` of any optimizer it holds as an attribute (ZeroRedundancyOptimizer's
``optim``, our ``ShardedOptimizer``'s local one), each storage counted once.
"""

from __future__ import annotations

import contextlib

import torch


# --- measuring ---------------------------------------------------------------------------


def _tensors_in(obj, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors_in(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors_in(v, out)


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        key = (t.device, storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def optimizer_state_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state and of the optimizers it holds (one level down)."""
    tensors: list[torch.Tensor] = []
    holders = [optimizer]
    for value in vars(optimizer).values():
        candidates = value if isinstance(value, (list, tuple)) else [value]
        holders.extend(c for c in candidates if isinstance(c, torch.optim.Optimizer) and c is not optimizer)
    for holder in holders:
        for state in getattr(holder, "state", {}).values():
            _tensors_in(state, tensors)
    return tensors


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of optimizer state held on this rank (each storage once)."""
    return _storage_bytes(optimizer_state_tensors(optimizer))


def parameter_bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def gradient_bytes(params) -> int:
    return _storage_bytes([p.grad for p in params if p.grad is not None])


@contextlib.contextmanager
def saved_activation_bytes(exclude=()):
    """Count the bytes of distinct storages autograd saves for backward inside the block.

    ``exclude``: tensors not to count (the parameters).  Yields a dict whose "bytes" entry
    is filled in when the block exits (while the graph is alive).
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved: list[torch.Tensor] = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            saved.append(t)
        return t

    result = {"bytes": 0}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result
    result["bytes"] = _storage_bytes(saved)


# --- formulas ----------------------------------------------------------------------------

def adam_state_bytes(n_elements: int, n_params: int, state_dtype_bytes: int = 4) -> int:
    """exp_avg + exp_avg_sq in the parameters' dtype, and one fp32 step scalar per parameter."""
    return 2 * state_dtype_bytes * n_elements + 4 * n_params


def sharded_adam_state_bound(total_elements: int, largest_elements: int, world_size: int, n_params_owned: int, state_dtype_bytes: int = 4) -> float:
    """Upper bound on one rank's AdamW state under the greedy largest-first assignment."""
    return 2 * state_dtype_bytes * (total_elements / world_size + largest_elements) + 4 * n_params_owned


def gpt_activation_bytes(cfg, batch: int, seq: int, float_bytes: int = 4) -> int:
    """Bytes autograd saves in one forward of ``impl.models.gpt.GPT`` (fp32, SDPA, ids in their own storage).

    Per block, T = seq, C = d_model, F = d_ff, H = heads:
      each RMSNorm (2):  its input x (the residual stream, BTC), r = rsqrt(mean x^2 + eps)
                         (BT), x * r before the gain (BTC), and its output, saved by the
                         next linear as its input (BTC)                    -> 2 (3 BTC + BT)
      attention:         the qkv output (q, k, v are views of one BT x 3C storage), SDPA's
                         output (also the proj input: a view) and its logsumexp (B H T)
                                                                          -> 4 BTC + BHT
      MLP:               the up output (GELU input) and GELU output (down input) -> 2 BTF
    After the blocks the final norm saves 3 BTC + BT (its output is the head's input);
    the embeddings save the token ids (BT) and the positions (T) as int64.  The logits
    are not saved by the model (a loss saves its own: log_softmax keeps B T V more).
    """
    b, t, c, f, h = batch, seq, cfg.d_model, cfg.d_ff, cfg.n_heads
    norm = 3 * b * t * c + b * t
    per_block = 2 * norm + 4 * b * t * c + b * h * t + 2 * b * t * f
    floats = cfg.n_layers * per_block + norm
    return float_bytes * floats + 8 * (b * t + t)


def gib(n: float) -> float:
    return n / 2**30


# --- per-rank model states by ZeRO stage ---------------------------------------------------

ZERO_STAGES = {0: "DDP", 1: "ZeRO-1 (optimizer state sharded)", 2: "ZeRO-2 (+ gradients)", 3: "ZeRO-3 / FSDP full shard (+ parameters)"}


def zero_model_state_bytes(n_params: int, world_size: int, stage: int, *, param_bytes: int = 2, grad_bytes: int = 2,
                           optimizer_bytes: int = 12) -> dict[str, float]:
    """Per-rank bytes of parameters, gradients and optimizer state for Psi = ``n_params``.

    The ZeRO paper's accounting (Rajbhandari et al., 2020): mixed-precision Adam holds
    2 + 2 + K bytes a parameter, fp16/bf16 parameters and gradients and K = 12 of fp32
    master copy, momentum and variance.  Stage s shards the first s of (optimizer state,
    gradients, parameters) over W ranks:

        stage 0 (DDP)     (2 + 2 + K) Psi
        stage 1           (2 + 2) Psi + K Psi / W
        stage 2           2 Psi + (2 + K) Psi / W
        stage 3           (2 + 2 + K) Psi / W

    fp32 training without a master copy is ``param_bytes=4, grad_bytes=4, optimizer_bytes=8``
    (AdamW's two moments).  Activations and temporary buffers are not model states: the
    full parameters a ZeRO-3 rank gathers for one unit at a time are its working set, not
    its resident memory (``zero3_working_set_bytes``)."""
    if stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {sorted(ZERO_STAGES)}, got {stage!r}")
    if world_size < 1 or n_params < 0:
        raise ValueError(f"need world_size >= 1 and n_params >= 0, got {world_size}, {n_params}")
    w = world_size
    p = param_bytes * n_params / (w if stage >= 3 else 1)
    g = grad_bytes * n_params / (w if stage >= 2 else 1)
    o = optimizer_bytes * n_params / (w if stage >= 1 else 1)
    return {"parameters": p, "gradients": g, "optimizer": o, "total": p + g + o}


def zero3_working_set_bytes(largest_unit_params: int, param_bytes: int = 2, prefetch: int = 1) -> int:
    """Full parameters a ZeRO-3 rank holds while computing: the current unit and ``prefetch``
    units gathered ahead (bounded by the largest unit)."""
    return (1 + prefetch) * param_bytes * largest_unit_params
