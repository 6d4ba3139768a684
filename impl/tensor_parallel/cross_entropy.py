"""Cross-entropy on vocabulary-sharded logits, without gathering them.

Contract
    ``vocab_parallel_cross_entropy(local_logits, targets, group=None, *, vocab_size=None,
    ignore_index=-100, reduction="mean")``

    local_logits  (..., V_r): rank r's logits for vocabulary ids [start_r, end_r) of the
                  chunk layout (``comm.shard_range``: ceil(V / W) ids a rank, the last
                  shards shorter or empty); float16/bfloat16/float32/float64.
    targets       (...) int64, replicated on every rank; ``ignore_index`` marks tokens
                  that do not count; any other id must lie in [0, V).
    vocab_size    V; None means W * V_r (equal shards, asserted by shape).
    returns       'none': the per-token loss (...), 0 where ignored; 'sum'; 'mean': the
                  sum over the tokens that count divided by their number (all ranks hold
                  the same targets, so the count needs no communication; no token
                  counting gives NaN, as F.cross_entropy does).  The same on every rank.

    Math, per token (m, s and z are all-reduced across the group):
        m = max_v x_v                    (all-reduce MAX: the global max)
        s = sum_v exp(x_v - m)           (all-reduce SUM)
        z = x_t - m                      (all-reduce SUM; only the owner of t contributes)
        loss = log s - z
    Backward: d loss / d x_v = softmax_v - [v == t], computed on the rank's own shard from
    the saved exp(x - m) / s: the logits' gradient stays sharded, no communication.
    Computed in float32 at least; the loss has the logits' dtype.  Saves the shard's
    softmax (float32), the one-hot position and the mask of tokens that count.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import comm

REDUCTIONS = ("none", "sum", "mean")


def _all_reduce(t, op, group):
    if comm.group_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, targets, group, start, end, ignore_index):
        x = local_logits.to(torch.promote_types(local_logits.dtype, torch.float32))
        width = end - start
        if width:
            m = x.amax(dim=-1)
        else:
            m = x.new_full(x.shape[:-1], float("-inf"))
        m = _all_reduce(m.contiguous(), dist.ReduceOp.MAX, group)  # global max over the vocabulary
        shifted = x - m.unsqueeze(-1)
        counts = targets != ignore_index
        owned = counts & (targets >= start) & (targets < end)
        local_t = torch.where(owned, targets - start, torch.zeros_like(targets))
        if width:
            z = torch.gather(shifted, -1, local_t.unsqueeze(-1)).squeeze(-1)
            z = torch.where(owned, z, torch.zeros_like(z))
        else:
            z = shifted.new_zeros(shifted.shape[:-1])
        z = _all_reduce(z.contiguous(), dist.ReduceOp.SUM, group)
        e = shifted.exp()
        s = _all_reduce(e.sum(dim=-1).contiguous(), dist.ReduceOp.SUM, group)
        loss = torch.where(counts, s.log() - z, torch.zeros_like(z))
        ctx.save_for_backward(e.div_(s.unsqueeze(-1)), local_t, owned, counts)
        ctx.in_dtype = local_logits.dtype
        return loss.to(local_logits.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_t, owned, counts = ctx.saved_tensors
        grad = softmax.clone()
        if grad.shape[-1]:
            # subtract 1 at the target, on the rank that owns it
            grad.scatter_add_(-1, local_t.unsqueeze(-1), -owned.to(grad.dtype).unsqueeze(-1))
        # ignored tokens get 0 by selection, not by multiplying: a mean over no counted token
        # sends grad_loss = 1/0 = inf, and inf * 0 would be NaN (F.cross_entropy gives 0)
        scale = torch.where(counts, grad_loss.to(grad.dtype), torch.zeros((), dtype=grad.dtype, device=grad.device))
        grad.mul_(scale.unsqueeze(-1))
        return grad.to(ctx.in_dtype), None, None, None, None, None


def vocab_parallel_cross_entropy(local_logits, targets, group=None, *, vocab_size=None, ignore_index=-100, reduction="mean"):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not local_logits.is_floating_point():
        raise TypeError(f"local_logits must be floating point, got {local_logits.dtype}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"targets must be int64 or int32, got {targets.dtype}")
    if tuple(targets.shape) != tuple(local_logits.shape[:-1]):
        raise ValueError(f"targets shape {tuple(targets.shape)} must equal local_logits.shape[:-1] = {tuple(local_logits.shape[:-1])}")
    w, r = comm.group_size(group), comm.group_rank(group)
    if vocab_size is None:
        vocab_size = w * local_logits.shape[-1]
    start, end = comm.shard_range(vocab_size, r, w)
    if local_logits.shape[-1] != end - start:
        raise ValueError(
            f"rank {r} of {w}: local_logits has {local_logits.shape[-1]} vocabulary entries, "
            f"the chunk layout of a vocabulary of {vocab_size} gives it {end - start} ([{start}, {end}))"
        )
    counts = targets != ignore_index
    if bool((counts & ((targets < 0) | (targets >= vocab_size))).any()):
        raise ValueError(f"targets must lie in [0, {vocab_size}) or equal ignore_index={ignore_index}")
    loss = _VocabParallelCrossEntropy.apply(local_logits, targets.long(), group, start, end, ignore_index)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / counts.sum().to(loss.dtype)
