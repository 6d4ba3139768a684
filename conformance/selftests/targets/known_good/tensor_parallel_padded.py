"""Tensor parallelism of another design than impl's: equal padded shards everywhere.

    --target conformance.selftests.targets.known_good.tensor_parallel_padded

Rank r of W in ``group`` owns items [r P, r P + n_r) of every sharded dimension of size n,
P = ceil(n / W) (the protocol's chunk layout), and stores P of them, the missing ones zero
(Megatron-LM pads its vocabulary the same way): every rank's shard has the same shape, so
every gather moves equal pieces and is cut back to n after.  Where impl and torch choose,
this one chooses otherwise:

- the conjugate operators (identity / all-reduce, all-reduce / identity, gather / keep) are
  written here, the gather on ``dist.all_gather`` into a list;
- column-parallel computes its padded rows and slices them off; row-parallel takes any
  in_features, divisible by W or not (the last shards narrower);
- the embedding looks ids outside the shard up in a constant zero row appended to the
  table (impl and torch mask the rows after the lookup);
- attention keeps Q, K and V as three sharded weights cut from the fused one (impl and
  torch regroup the fused rows), behind one copy operator: one all-reduce backward;
- cross-entropy all-gathers each rank's (max, sum of exponentials) pair and combines them
  on every rank, then all-reduces the target logit: two collectives, where impl
  all-reduces the max, the sum of exponentials and the target logit;
- attention is ``F.scaled_dot_product_attention``, not the model's own code.

Sequence parallelism (an extra of the protocol) is not offered.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# --- the group ---------------------------------------------------------------------------


def _where(group) -> tuple[int, int]:
    """(rank in the group, group size)."""
    return dist.get_rank(group), dist.get_world_size(group)


def _span(n: int, group) -> tuple[int, int, int]:
    """(start, width, padded width P) of this rank's shard of n items."""
    rank, size = _where(group)
    per = -(-n // size)
    start = min(rank * per, n)
    return start, min(per, n - start), per


def _pad_to(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    missing = size - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def _gather_padded(t: torch.Tensor, dim: int, n: int, group) -> torch.Tensor:
    """Every rank's equal padded shard along ``dim``, concatenated and cut to n."""
    _, size = _where(group)
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim).narrow(dim, 0, n)


# --- conjugate operators -----------------------------------------------------------------


class _Enter(torch.autograd.Function):
    """Identity forward; the gradient summed over the ranks backward (the input is used by
    every rank's shard of the next layer)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Sum(torch.autograd.Function):
    """The ranks' partial results summed forward; the replicated gradient passed on."""

    @staticmethod
    def forward(ctx, partial, group):
        total = partial.contiguous().clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    """Padded shards of the last dim gathered and cut to n; backward keeps this rank's own
    padded piece."""

    @staticmethod
    def forward(ctx, padded, n, group):
        ctx.group, ctx.per = group, padded.shape[-1]
        return _gather_padded(padded, padded.dim() - 1, n, group)

    @staticmethod
    def backward(ctx, grad):
        rank, _ = _where(ctx.group)
        full = _pad_to(grad, grad.dim() - 1, ctx.per * _where(ctx.group)[1])
        return full[..., rank * ctx.per:(rank + 1) * ctx.per].contiguous(), None, None


class _Keep(torch.autograd.Function):
    """This rank's [start, start + width) of the last dim; backward gathers the gradient."""

    @staticmethod
    def forward(ctx, x, n, group):
        start, width, per = _span(n, group)
        ctx.n, ctx.per, ctx.group = n, per, group
        return x[..., start:start + width].contiguous()

    @staticmethod
    def backward(ctx, grad):
        padded = _pad_to(grad, grad.dim() - 1, ctx.per)
        return _gather_padded(padded, grad.dim() - 1, ctx.n, ctx.group), None, None


# --- layers ------------------------------------------------------------------------------


class _Sharded:
    """How a module's sharded parameters map to the dense module's: (dense name suffix,
    parameters concatenated along dim 0 after gathering, dim, full size of each)."""

    def dense_entries(self):
        return []


class ColumnLinear(nn.Module, _Sharded):
    def __init__(self, linear: nn.Linear, group=None, gather_output=False, rows: torch.Tensor | None = None):
        super().__init__()
        self.group, self.gather_output, self.out_features = group, gather_output, linear.out_features
        self.start, self.width, self.per = _span(self.out_features, group)
        weight = linear.weight.detach() if rows is None else rows
        self.weight = nn.Parameter(_pad_to(weight[self.start:self.start + self.width].clone(), 0, self.per))
        self.bias = None
        if linear.bias is not None:
            self.bias = nn.Parameter(_pad_to(linear.bias.detach()[self.start:self.start + self.width].clone(), 0, self.per))

    def forward(self, x):
        y = F.linear(_Enter.apply(x, self.group), self.weight, self.bias)  # (..., P): padded rows give 0
        if self.gather_output:
            return _Gather.apply(y, self.out_features, self.group)
        return y[..., :self.width]

    def dense_entries(self):
        out = [("weight", [self.weight], 0, self.out_features)]
        return out + ([("bias", [self.bias], 0, self.out_features)] if self.bias is not None else [])


class RowLinear(nn.Module, _Sharded):
    def __init__(self, linear: nn.Linear, group=None, input_is_parallel=True):
        super().__init__()
        self.group, self.input_is_parallel, self.in_features = group, input_is_parallel, linear.in_features
        self.start, self.width, self.per = _span(self.in_features, group)
        cols = linear.weight.detach()[:, self.start:self.start + self.width]
        self.weight = nn.Parameter(_pad_to(cols.clone(), 1, self.per))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())  # replicated

    def forward(self, x):
        if not self.input_is_parallel:
            x = _Keep.apply(x, self.in_features, self.group)
        if x.shape[-1] != self.width:
            raise ValueError(f"row-parallel input has {x.shape[-1]} features; this rank's shard of "
                             f"{self.in_features} in_features has {self.width}")
        y = _Sum.apply(F.linear(x, self.weight[:, :self.width]), self.group)
        return y if self.bias is None else y + self.bias  # once, after the sum

    def dense_entries(self):
        return [("weight", [self.weight], 1, self.in_features)]


class VocabEmbedding(nn.Module, _Sharded):
    def __init__(self, embedding: nn.Embedding, group=None):
        super().__init__()
        self.group, self.num_embeddings = group, embedding.num_embeddings
        self.start, self.width, self.per = _span(self.num_embeddings, group)
        rows = embedding.weight.detach()[self.start:self.start + self.width]
        self.weight = nn.Parameter(_pad_to(rows.clone(), 0, self.per))

    def forward(self, ids):
        local = ids - self.start
        outside = (local < 0) | (local >= self.width)
        local = torch.where(outside, torch.full_like(local, self.per), local)  # row P: the zero row
        table = torch.cat([self.weight, self.weight.new_zeros(1, self.weight.shape[1])])
        return _Sum.apply(F.embedding(local, table), self.group)

    def dense_entries(self):
        return [("weight", [self.weight], 0, self.num_embeddings)]


class RMSNorm(nn.Module):
    """Replicated: the dense norm's weight, its own copy."""

    def __init__(self, norm):
        super().__init__()
        self.eps = norm.eps
        self.weight = nn.Parameter(norm.weight.detach().clone())

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module, _Sharded):
    """Q, K and V of this rank's heads as three weights; one copy operator for all three."""

    def __init__(self, attn, group=None):
        super().__init__()
        _, size = _where(group)
        c = attn.proj.out_features
        if attn.n_heads % size:
            raise ValueError(f"n_heads {attn.n_heads} is not divisible by the tensor-parallel size {size}")
        self.group, self.d_model, self.local_heads = group, c, attn.n_heads // size
        start, width, _ = _span(c, group)
        fused = attn.qkv.weight.detach()
        self.q_weight, self.k_weight, self.v_weight = (nn.Parameter(fused[part * c + start:part * c + start + width].clone())
                                                       for part in range(3))
        self.proj = RowLinear(attn.proj, group)

    def forward(self, x):
        b, n, _ = x.shape
        x = _Enter.apply(x, self.group)
        q, k, v = (F.linear(x, w).view(b, n, self.local_heads, -1).transpose(1, 2) for w in (self.q_weight, self.k_weight, self.v_weight))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, -1))

    def dense_entries(self):
        return [("qkv.weight", [self.q_weight, self.k_weight, self.v_weight], 0, self.d_model)]


class MLP(nn.Module):
    def __init__(self, mlp, group=None):
        super().__init__()
        _, size = _where(group)
        if mlp.up.out_features % size:
            raise ValueError(f"d_ff {mlp.up.out_features} is not divisible by the tensor-parallel size {size}")
        self.up, self.down = ColumnLinear(mlp.up, group), RowLinear(mlp.down, group)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, block, group=None):
        super().__init__()
        self.ln1, self.attn = RMSNorm(block.ln1), Attention(block.attn, group)
        self.ln2, self.mlp = RMSNorm(block.ln2), MLP(block.mlp, group)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, model, group=None):
        super().__init__()
        self.context_length = model.cfg.context_length
        self.tok = VocabEmbedding(model.tok, group)
        self.pos = nn.Embedding.from_pretrained(model.pos.weight.detach().clone(), freeze=False)
        self.blocks = nn.ModuleList(Block(b, group) for b in model.blocks)
        self.ln_f = RMSNorm(model.ln_f)
        self.head = ColumnLinear(model.head, group)  # logits: this rank's vocabulary shard

    def forward(self, idx):
        n = idx.shape[1]
        if n > self.context_length:
            raise ValueError(f"sequence length {n} exceeds context_length {self.context_length}")
        x = self.tok(idx) + self.pos(torch.arange(n, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# --- cross-entropy -------------------------------------------------------------------------


class _CrossEntropy(torch.autograd.Function):
    """Per token, each rank's (max m_r, sum of exp(x - m_r)) gathered in one all-gather:
    M = max_r m_r, s = sum_r s_r exp(m_r - M); the target's x_t - M from its owner in one
    all-reduce; loss = log s - (x_t - M).  x - M is exact for logits of one magnitude, so a
    constant added to every logit moves nothing (as in F.cross_entropy).
    Backward: exp(x - M) / s - [v == t] on the rank's own shard."""

    @staticmethod
    def forward(ctx, local, targets, group, start, ignore_index):
        x = local.to(torch.promote_types(local.dtype, torch.float32))
        width = x.shape[-1]
        if width:
            m = x.amax(dim=-1)
            pair = torch.stack([m, torch.exp(x - m.unsqueeze(-1)).sum(-1)])
        else:
            pair = torch.stack([x.new_full(x.shape[:-1], float("-inf")), x.new_zeros(x.shape[:-1])])
        _, size = _where(group)
        every = [torch.empty_like(pair) for _ in range(size)]
        dist.all_gather(every, pair.contiguous(), group=group)
        maxes, sums = torch.stack(every).unbind(1)  # (W, tokens...) each
        top = maxes.amax(dim=0)
        total = (sums * torch.exp(maxes - top)).sum(dim=0)
        counts = targets != ignore_index
        owned = counts & (targets >= start) & (targets < start + width)
        index = torch.where(owned, targets - start, torch.zeros_like(targets))
        z = (torch.gather(x, -1, index.unsqueeze(-1)).squeeze(-1) - top) if width else x.new_zeros(x.shape[:-1])
        z = torch.where(owned, z, torch.zeros_like(z)).contiguous()
        dist.all_reduce(z, group=group)
        ctx.save_for_backward(x, top, total, index, owned, counts)
        ctx.dtype = local.dtype
        return torch.where(counts, total.log() - z, torch.zeros_like(z)).to(local.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        x, top, total, index, owned, counts = ctx.saved_tensors
        grad = torch.exp(x - top.unsqueeze(-1)) / total.unsqueeze(-1)
        if grad.shape[-1]:
            grad.scatter_add_(-1, index.unsqueeze(-1), -owned.to(grad.dtype).unsqueeze(-1))
        # an ignored token's gradient is 0 by selection (grad_loss may be inf: a mean over none)
        weight = torch.where(counts, grad_loss.to(grad.dtype), torch.zeros((), dtype=grad.dtype, device=grad.device))
        return (grad * weight.unsqueeze(-1)).to(ctx.dtype), None, None, None, None


# --- the protocol's entry points -------------------------------------------------------------


def get_column_parallel_linear(linear, group=None, gather_output=False):
    return ColumnLinear(linear, group, gather_output)


def get_row_parallel_linear(linear, group=None, input_is_parallel=True):
    return RowLinear(linear, group, input_is_parallel)


def get_vocab_parallel_embedding(embedding, group=None):
    return VocabEmbedding(embedding, group)


def vocab_parallel_cross_entropy(local_logits, targets, group=None, *, vocab_size=None, ignore_index=-100, reduction="mean"):
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    _, size = _where(group)
    vocab_size = vocab_size if vocab_size is not None else size * local_logits.shape[-1]
    start, width, _ = _span(vocab_size, group)
    if local_logits.shape[-1] != width:
        raise ValueError(f"local_logits holds {local_logits.shape[-1]} vocabulary entries; this rank's shard of "
                         f"{vocab_size} has {width}")
    loss = _CrossEntropy.apply(local_logits, targets.long(), group, start, ignore_index)
    if reduction == "none":
        return loss
    total = loss.sum()
    return total if reduction == "sum" else total / (targets != ignore_index).sum().to(total.dtype)


def get_tensor_parallel_block(block, group=None, sequence_parallel=False):
    if sequence_parallel:
        raise NotImplementedError("sequence parallelism is not offered by this target")
    return Block(block, group)


def get_tensor_parallel_gpt(model, group=None, sequence_parallel=False):
    if sequence_parallel:
        raise NotImplementedError("sequence parallelism is not offered by this target")
    return GPT(model, group)


def _dense(module: nn.Module, grads: bool) -> dict:
    """The dense module's parameters (or gradients) by its names, on every rank."""
    out, claimed = {}, set()
    for prefix, sub in module.named_modules():
        if not isinstance(sub, _Sharded):
            continue
        for suffix, params, dim, n in sub.dense_entries():
            claimed.update(id(p) for p in params)
            pieces = [p.grad if grads else p for p in params]
            name = f"{prefix}.{suffix}" if prefix else suffix
            if any(t is None for t in pieces):
                out[name] = None
                continue
            out[name] = torch.cat([_gather_padded(_pad_to(t.detach(), dim, -(-n // _where(sub.group)[1])), dim, n, sub.group)
                                   for t in pieces], dim=0)
    for name, p in module.named_parameters():
        if id(p) not in claimed:
            t = p.grad if grads else p
            out[name] = None if t is None else t.detach().clone()
    return out


def tensor_parallel_gather_full_params(module):
    return _dense(module, grads=False)


def tensor_parallel_gather_full_grads(module):
    return _dense(module, grads=True)
