"""Megatron-style tensor-parallel layers: column- and row-parallel linear, vocab-parallel
embedding.  Each is built from a dense module (on every rank, with the same weights) and
keeps only its rank's shard.

Contract (W ranks in ``group``; r this rank; shards in the chunk layout of
``comm.shard_range``: ceil(n / W) rows a rank, the last shards shorter):

ColumnParallelLinear(linear, group, gather_output=False, sequence_parallel=False)
    weight rows (output features) [start_r, end_r) and the same bias entries.  Input
    (..., in) replicated on every rank (sequence_parallel: (B, N / W, in), gathered along
    dim 1 first).  Output (..., end_r - start_r), the rank's output features; with
    ``gather_output`` the full (..., out) on every rank.  Communication: forward none
    (sp: one all-gather), backward one all-reduce of the input gradient (sp: one
    reduce-scatter); gather_output adds one all-gather forward.  Uneven shards are stored
    padded to ceil(out / W) rows (the padding is never read; its gradient stays zero).
RowParallelLinear(linear, group, input_is_parallel=True, sequence_parallel=False)
    weight columns (input features) [start_r, end_r); in_features must be divisible by W.
    Input (..., in / W), the rank's input features (``input_is_parallel=False``: the full
    input, split here).  Output (..., out) replicated: the partial products are summed by
    one all-reduce forward (sp: a reduce-scatter along dim 1, output (B, N / W, out)), then
    the bias is added once.  Backward: no communication (sp: one all-gather).
VocabParallelEmbedding(embedding, group)
    rows [start_r, end_r) of the table, stored padded to ceil(V / W) rows.  Input: token ids
    of any shape, replicated; ids outside the rank's range look up a zero row; one
    all-reduce forward sums the rows; backward none.  Ids outside [0, V) raise ValueError.

Every sharded parameter carries ``tp_shard = (dim, full_size)`` and every module its
``tp_group``: ``gather.gather_full`` rebuilds the dense parameters and gradients from them.
Nothing is saved for backward beyond what F.linear / F.embedding save.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import comm


def _mark(p: nn.Parameter, dim: int, full_size: int) -> nn.Parameter:
    p.tp_shard = (dim, full_size)
    return p


def _padded_rows(t: torch.Tensor, start: int, end: int, rows: int) -> torch.Tensor:
    """t[start:end] along dim 0, zero-padded to ``rows`` rows (a fresh tensor)."""
    out = t.new_zeros((rows,) + tuple(t.shape[1:]))
    out[: end - start] = t[start:end]
    return out


def _check_linear(linear, what: str):
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{what} takes an nn.Linear, got {type(linear).__name__}")


class ColumnParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, group=None, gather_output: bool = False,
                 sequence_parallel: bool = False, row_permutation: torch.Tensor | None = None):
        super().__init__()
        _check_linear(linear, "ColumnParallelLinear")
        if gather_output and sequence_parallel:
            raise ValueError("ColumnParallelLinear: gather_output and sequence_parallel exclude each other")
        self.tp_group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        w, r = comm.group_size(group), comm.group_rank(group)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.start, self.end = comm.shard_range(self.out_features, r, w)
        self.rows = -(-self.out_features // w)
        weight = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach()
        # row_permutation: the stored (full) rows are dense[perm] (a fused QKV regrouped by rank)
        if row_permutation is not None:  # on the weight's device: FSDP broadcasts buffers over NCCL
            row_permutation = row_permutation.to(weight.device)
        self.register_buffer("row_permutation", row_permutation, persistent=False)
        if row_permutation is not None:
            weight = weight[row_permutation]
            bias = None if bias is None else bias[row_permutation]
        self.weight = _mark(nn.Parameter(_padded_rows(weight, self.start, self.end, self.rows)), 0, self.out_features)
        self.bias = None if bias is None else _mark(nn.Parameter(_padded_rows(bias, self.start, self.end, self.rows)), 0, self.out_features)

    def forward(self, x):
        n = self.end - self.start
        if self.sequence_parallel:
            x = comm.gather_from_sp_region(x, self.tp_group)
        else:
            x = comm.copy_to_tp_region(x, self.tp_group)
        y = F.linear(x, self.weight[:n], None if self.bias is None else self.bias[:n])
        if self.gather_output:
            y = comm.gather_from_tp_region(F.pad(y, (0, self.rows - n)), self.tp_group)[..., : self.out_features]
        return y

    def extra_repr(self):
        return f"in={self.in_features}, out={self.out_features}, shard=[{self.start}, {self.end}), gather_output={self.gather_output}, sp={self.sequence_parallel}"


class RowParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, group=None, input_is_parallel: bool = True, sequence_parallel: bool = False):
        super().__init__()
        _check_linear(linear, "RowParallelLinear")
        w, r = comm.group_size(group), comm.group_rank(group)
        if linear.in_features % w:
            raise ValueError(f"RowParallelLinear: in_features {linear.in_features} is not divisible by the tensor-parallel size {w}")
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel needs input_is_parallel=True")
        self.tp_group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.start, self.end = comm.shard_range(self.in_features, r, w)
        self.weight = _mark(nn.Parameter(linear.weight.detach()[:, self.start:self.end].clone()), 1, self.in_features)
        # the bias is replicated: added once, after the reduction
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        if not self.input_is_parallel:
            x = comm.scatter_to_tp_region(x, self.tp_group)
        if x.shape[-1] != self.end - self.start:
            raise ValueError(f"RowParallelLinear: input has {x.shape[-1]} features, this rank's shard has {self.end - self.start}")
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = comm.reduce_scatter_to_sp_region(partial, self.tp_group)
            # each rank adds the bias to its own tokens: the gradient is partial over tokens
            return y if self.bias is None else y + comm.all_reduce_grad(self.bias, self.tp_group)
        y = comm.reduce_from_tp_region(partial, self.tp_group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return f"in={self.in_features}, out={self.out_features}, shard=[{self.start}, {self.end}), sp={self.sequence_parallel}"


class VocabParallelEmbedding(nn.Module):
    def __init__(self, embedding: nn.Embedding, group=None):
        super().__init__()
        if not isinstance(embedding, nn.Embedding):
            raise TypeError(f"VocabParallelEmbedding takes an nn.Embedding, got {type(embedding).__name__}")
        if embedding.max_norm is not None or embedding.sparse:
            raise ValueError("VocabParallelEmbedding: max_norm and sparse embeddings are not supported")
        w, r = comm.group_size(group), comm.group_rank(group)
        self.tp_group = group
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.start, self.end = comm.shard_range(self.num_embeddings, r, w)
        self.rows = -(-self.num_embeddings // w)
        pidx = embedding.padding_idx
        self.local_padding_idx = pidx - self.start if pidx is not None and self.start <= pidx < self.end else None
        self.weight = _mark(nn.Parameter(_padded_rows(embedding.weight.detach(), self.start, self.end, self.rows)), 0, self.num_embeddings)

    def forward(self, ids):
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"VocabParallelEmbedding: token ids must be int64 or int32, got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            raise ValueError(f"VocabParallelEmbedding: token ids must lie in [0, {self.num_embeddings}), got [{int(ids.min())}, {int(ids.max())}]")
        outside = (ids < self.start) | (ids >= self.end)
        local = torch.where(outside, torch.zeros_like(ids), ids - self.start)
        rows = F.embedding(local, self.weight, padding_idx=self.local_padding_idx)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        return comm.reduce_from_tp_region(rows, self.tp_group)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, shard=[{self.start}, {self.end})"
