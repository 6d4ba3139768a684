"""Deliberately broken tensor-parallel targets: the tensor-parallel laws must reject each.

Each mutant is a target (``--target conformance.mutants.tensor_parallel:<name>``) offering
the whole tensor-parallel protocol from ``impl`` with one decision changed.  The
cross-entropy mutants share one plain re-implementation (``_cross_entropy``) whose flags
switch the decision; with the default flags it is right.  ``caught_by`` names the laws of
``conformance.laws.tensor_parallel.laws`` that must reject the mutant
(``conformance/selftests/test_tensor_parallel_mutants.py`` checks that they do, at world
sizes >= 2: on one rank there is nothing to split).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import impl
from conformance.lawbook import Mutant
from impl.tensor_parallel import comm
from impl.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, _mark, _padded_rows
from impl.tensor_parallel.model import TensorParallelAttention, TensorParallelBlock, TensorParallelGPT, TensorParallelMLP, TensorParallelRMSNorm

CAPABILITY = "tensor parallelism"
ENTRY_POINTS = (
    "get_column_parallel_linear", "get_row_parallel_linear", "get_vocab_parallel_embedding", "vocab_parallel_cross_entropy",
    "get_tensor_parallel_block", "get_tensor_parallel_gpt", "tensor_parallel_gather_full_params", "tensor_parallel_gather_full_grads",
)


class MutantTarget:
    """impl's tensor-parallel entry points, some replaced."""

    def __init__(self, name: str, **overrides):
        self.name = name
        for entry in ENTRY_POINTS:
            setattr(self, entry, overrides.get(entry, getattr(impl, entry)))


# --- layers with one decision changed ----------------------------------------------------------


class ColumnDropsRemainder(ColumnParallelLinear):
    """Each rank keeps out // W output features (a split that assumes W divides out): the
    last out % W features are never computed."""

    def __init__(self, linear, group=None, gather_output=False):
        super().__init__(linear, group, gather_output)
        self.end = min(self.end, self.start + self.out_features // comm.group_size(group))


class BiasOnEveryRank(RowParallelLinear):
    def forward(self, x):
        # the bias joins the partial sums: the all-reduce adds it W times
        return comm.reduce_from_tp_region(F.linear(x, self.weight, self.bias), self.tp_group)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class BiasGradDividedByW(RowParallelLinear):
    def forward(self, x):
        y = comm.reduce_from_tp_region(F.linear(x, self.weight), self.tp_group)
        # "the bias is shared by W ranks": its gradient divided by W
        return y + _ScaleGrad.apply(self.bias, 1 / comm.group_size(self.tp_group))


class BoundaryIdDropped(VocabParallelEmbedding):
    def forward(self, ids):
        outside = (ids <= self.start) | (ids >= self.end)  # <= : the first id of each shard is dropped
        local = torch.where(outside, torch.zeros_like(ids), ids - self.start)
        rows = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return comm.reduce_from_tp_region(rows, self.tp_group)


class InputGradNotReduced(ColumnParallelLinear):
    def forward(self, x):
        n = self.end - self.start  # no copy_to_tp_region: the input gradient stays partial
        y = F.linear(x, self.weight[:n], None if self.bias is None else self.bias[:n])
        if self.gather_output:
            y = comm.gather_from_tp_region(F.pad(y, (0, self.rows - n)), self.tp_group)[..., : self.out_features]
        return y


class UngroupedQKVAttention(TensorParallelAttention):
    def __init__(self, attn, group=None, sequence_parallel=False):
        super().__init__(attn, group, sequence_parallel)
        # the fused QKV weight split by contiguous rows: rank r gets a mix of Q, K and V rows
        self.qkv = ColumnParallelLinear(attn.qkv, group, sequence_parallel=sequence_parallel)


class GatheredHiddenMLP(TensorParallelMLP):
    def __init__(self, mlp, group=None, sequence_parallel=False):
        super().__init__(mlp, group, sequence_parallel)
        # the hidden activations gathered after up and split again before down: right numbers, extra traffic
        self.up = ColumnParallelLinear(mlp.up, group, gather_output=True)
        self.down = RowParallelLinear(mlp.down, group, input_is_parallel=False)


class NormGradNotReduced(TensorParallelRMSNorm):
    def forward(self, x):
        xf = x.float()  # sequence parallel, but the weight's partial gradient is not all-reduced
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class SequenceParallelByAllReduce(TensorParallelBlock):
    """Sequence parallelism done the slow way: gather the whole sequence, run the block
    with its all-reduces, keep this rank's tokens (right numbers, wrong collectives)."""

    def __init__(self, block, group=None, sequence_parallel=False):
        super().__init__(block, group, sequence_parallel=False)
        self.gather_tokens = sequence_parallel

    def forward(self, x):
        if not self.gather_tokens:
            return super().forward(x)
        full = comm.gather_from_sp_region(x, self.tp_group)
        return comm.scatter_to_sp_region(super().forward(full), self.tp_group)


class _SumByAllGather(torch.autograd.Function):
    """The partial products summed by one all-gather and a local sum (right numbers, one
    collective, but W times the bytes an all-reduce receives); backward: identity."""

    @staticmethod
    def forward(ctx, partial, group):
        parts = [torch.empty_like(partial) for _ in range(comm.group_size(group))]
        dist.all_gather(parts, partial.contiguous(), group=group)
        return torch.stack(parts).sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class PartialSumsAllGathered(RowParallelLinear):
    def forward(self, x):
        if not self.input_is_parallel:
            x = comm.scatter_to_tp_region(x, self.tp_group)
        y = _SumByAllGather.apply(F.linear(x, self.weight), self.tp_group)
        return y if self.bias is None else y + self.bias


def _world_rank_shard(n: int, group) -> tuple[int, int]:
    # BUG: the shard of the rank's global rank, not of its rank in the group
    return comm.shard_range(n, dist.get_rank(), comm.group_size(group))


class ColumnByWorldRank(ColumnParallelLinear):
    def __init__(self, linear, group=None, gather_output=False):
        super().__init__(linear, group, gather_output)
        self.start, self.end = _world_rank_shard(self.out_features, group)
        self.weight = _mark(nn.Parameter(_padded_rows(linear.weight.detach(), self.start, self.end, self.rows)), 0, self.out_features)
        if self.bias is not None:
            self.bias = _mark(nn.Parameter(_padded_rows(linear.bias.detach(), self.start, self.end, self.rows)), 0, self.out_features)


class RowByWorldRank(RowParallelLinear):
    def __init__(self, linear, group=None, input_is_parallel=True):
        super().__init__(linear, group, input_is_parallel)
        self.start, self.end = _world_rank_shard(self.in_features, group)
        self.weight = _mark(nn.Parameter(linear.weight.detach()[:, self.start:self.end].clone()), 1, self.in_features)


class EmbeddingByWorldRank(VocabParallelEmbedding):
    def __init__(self, embedding, group=None):
        super().__init__(embedding, group)
        self.start, self.end = _world_rank_shard(self.num_embeddings, group)
        self.weight = _mark(nn.Parameter(_padded_rows(embedding.weight.detach(), self.start, self.end, self.rows)), 0, self.num_embeddings)


def _block_with(attn_cls=TensorParallelAttention, mlp_cls=TensorParallelMLP, norm_cls=TensorParallelRMSNorm):
    def get_tensor_parallel_block(block, group=None, sequence_parallel=False):
        tp = TensorParallelBlock(block, group, sequence_parallel)
        tp.attn = attn_cls(block.attn, group, sequence_parallel)
        tp.mlp = mlp_cls(block.mlp, group, sequence_parallel)
        tp.ln1 = norm_cls(block.ln1, group, sequence_parallel)
        tp.ln2 = norm_cls(block.ln2, group, sequence_parallel)
        return tp

    return get_tensor_parallel_block


def _gpt_with(**block_parts):
    """impl's tensor-parallel GPT whose blocks (and final norm) come from ``_block_with``."""
    make_block = _block_with(**block_parts)
    norm_cls = block_parts.get("norm_cls", TensorParallelRMSNorm)

    def get_tensor_parallel_gpt(model, group=None, sequence_parallel=False):
        tp = TensorParallelGPT(model, group, sequence_parallel)
        for i, block in enumerate(model.blocks):
            tp.blocks[i] = make_block(block, group, sequence_parallel)
        tp.ln_f = norm_cls(model.ln_f, group, sequence_parallel)
        return tp

    return get_tensor_parallel_gpt


# --- cross-entropy ---------------------------------------------------------------------------------


def _cross_entropy(local_logits, targets, group=None, *, vocab_size=None, ignore_index=-100, reduction="mean",
                   global_max=True, subtract_max=True, count="global", mask="select"):
    """Vocab-parallel cross-entropy from differentiable pieces; the flags break one decision."""
    w, r = comm.group_size(group), comm.group_rank(group)
    vocab_size = vocab_size if vocab_size is not None else w * local_logits.shape[-1]
    start, end = comm.shard_range(vocab_size, r, w)
    x = local_logits.float()
    if subtract_max:
        m = x.detach().amax(-1) if x.shape[-1] else x.new_full(x.shape[:-1], float("-inf"))
        if global_max and w > 1:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        x = x - m.unsqueeze(-1)
    counts = targets != ignore_index
    owned = counts & (targets >= start) & (targets < end)
    local_t = torch.where(owned, targets - start, torch.zeros_like(targets))
    z = torch.gather(x, -1, local_t.unsqueeze(-1)).squeeze(-1) if x.shape[-1] else x.new_zeros(x.shape[:-1])
    z = comm.reduce_from_tp_region(torch.where(owned, z, torch.zeros_like(z)), group)
    s = comm.reduce_from_tp_region(x.exp().sum(-1), group)
    if mask == "select":
        loss = torch.where(counts, s.log() - z, torch.zeros_like(z)).to(local_logits.dtype)
    else:  # "multiply": 0 x the loss of an ignored token; its gradient is inf x 0 = NaN under a mean over none
        loss = ((s.log() - z) * counts.to(z.dtype)).to(local_logits.dtype)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    n = {"global": counts.sum(), "owned": owned.sum(), "all": torch.tensor(targets.numel())}[count]
    return loss.sum() / n.to(loss.dtype)


def _ce_with(**flags):
    def vocab_parallel_cross_entropy(local_logits, targets, group=None, *, vocab_size=None, ignore_index=-100, reduction="mean"):
        return _cross_entropy(local_logits, targets, group, vocab_size=vocab_size, ignore_index=ignore_index, reduction=reduction, **flags)

    return vocab_parallel_cross_entropy


# --- the kept mutants ------------------------------------------------------------------------------

_ROW = "row_parallel_linear_matches_the_dense_layer_with_the_bias_added_once"
_COL = "column_parallel_linear_matches_the_dense_layer"
_EMB = "vocab_parallel_embedding_matches_the_dense_table_for_every_id"
_CE = "vocab_parallel_cross_entropy_equals_cross_entropy_on_the_full_logits"
_SHIFT = "vocab_parallel_cross_entropy_is_invariant_to_adding_a_constant_to_all_logits"
_HUGE = "vocab_parallel_cross_entropy_stays_finite_for_huge_logits"
_BLOCK = "tensor_parallel_block_matches_the_dense_block"
_GPT = "tensor_parallel_gpt_matches_the_dense_model_over_optimizer_steps"
_COUNT = "mlp_and_block_do_at_most_megatrons_collectives_each_way"
_KINDS = "mlp_does_one_all_reduce_forward_and_one_backward"
_SUBGROUP = "every_entry_point_on_a_subgroup_shards_by_group_rank_and_matches_the_dense_module"
_SP = "sequence_parallel_block_matches_the_dense_block"
_SP_COUNT = "sequence_parallel_block_all_gathers_and_reduce_scatters_instead_of_all_reducing"
_SP_GPT = "sequence_parallel_gpt_matches_the_dense_model_over_optimizer_steps"

bias_added_w_times = MutantTarget("bias_added_w_times", get_row_parallel_linear=lambda linear, group=None, input_is_parallel=True: BiasOnEveryRank(linear, group, input_is_parallel))
bias_grad_divided_by_w = MutantTarget("bias_grad_divided_by_w", get_row_parallel_linear=lambda linear, group=None, input_is_parallel=True: BiasGradDividedByW(linear, group, input_is_parallel))
boundary_id_dropped = MutantTarget("boundary_id_dropped", get_vocab_parallel_embedding=lambda embedding, group=None: BoundaryIdDropped(embedding, group))
column_drops_remainder = MutantTarget("column_drops_remainder", get_column_parallel_linear=lambda linear, group=None, gather_output=False: ColumnDropsRemainder(linear, group, gather_output))
input_grad_not_all_reduced = MutantTarget("input_grad_not_all_reduced", get_column_parallel_linear=lambda linear, group=None, gather_output=False: InputGradNotReduced(linear, group, gather_output))
qkv_rows_not_regrouped = MutantTarget("qkv_rows_not_regrouped", get_tensor_parallel_block=_block_with(attn_cls=UngroupedQKVAttention),
                                      get_tensor_parallel_gpt=_gpt_with(attn_cls=UngroupedQKVAttention))
hidden_gathered_and_split_again = MutantTarget("hidden_gathered_and_split_again", get_tensor_parallel_block=_block_with(mlp_cls=GatheredHiddenMLP))
sp_norm_grad_not_all_reduced = MutantTarget("sp_norm_grad_not_all_reduced", get_tensor_parallel_block=_block_with(norm_cls=NormGradNotReduced),
                                            get_tensor_parallel_gpt=_gpt_with(norm_cls=NormGradNotReduced))
sp_by_all_reduce = MutantTarget("sp_by_all_reduce", get_tensor_parallel_block=SequenceParallelByAllReduce)
partial_sums_all_gathered = MutantTarget("partial_sums_all_gathered", get_row_parallel_linear=lambda linear, group=None, input_is_parallel=True: PartialSumsAllGathered(linear, group, input_is_parallel))
shards_by_world_rank = MutantTarget(
    "shards_by_world_rank",
    get_column_parallel_linear=lambda linear, group=None, gather_output=False: ColumnByWorldRank(linear, group, gather_output),
    get_row_parallel_linear=lambda linear, group=None, input_is_parallel=True: RowByWorldRank(linear, group, input_is_parallel),
    get_vocab_parallel_embedding=lambda embedding, group=None: EmbeddingByWorldRank(embedding, group))
ce_local_max = MutantTarget("ce_local_max", vocab_parallel_cross_entropy=_ce_with(global_max=False))
ce_no_max = MutantTarget("ce_no_max", vocab_parallel_cross_entropy=_ce_with(subtract_max=False))
ce_mean_over_owned_labels = MutantTarget("ce_mean_over_owned_labels", vocab_parallel_cross_entropy=_ce_with(count="owned"))
ce_mean_counts_ignored = MutantTarget("ce_mean_counts_ignored", vocab_parallel_cross_entropy=_ce_with(count="all"))
ce_ignored_masked_by_multiplying = MutantTarget("ce_ignored_masked_by_multiplying", vocab_parallel_cross_entropy=_ce_with(mask="multiply"))
ce_right = MutantTarget("ce_right", vocab_parallel_cross_entropy=_ce_with())  # the control of the cross-entropy mutants


def _m(name, bug, caught_by):
    return Mutant(name, CAPABILITY, bug, tuple(caught_by), f"{__name__}:{name}")


MUTANTS = (
    _m("bias_added_w_times", "row-parallel linear adds the bias before the all-reduce (W times)", [_ROW]),
    _m("bias_grad_divided_by_w", "row-parallel bias gradient divided by W", [_ROW]),
    _m("boundary_id_dropped", "vocab-parallel embedding drops the first id of each shard (<= instead of <)", [_EMB]),
    _m("column_drops_remainder", "column-parallel linear keeps out // W features a rank: the last out % W never computed", [_COL]),
    _m("input_grad_not_all_reduced", "column-parallel linear: identity instead of all-reduce for the input gradient", [_COL]),
    _m("qkv_rows_not_regrouped", "fused QKV split by contiguous rows: ranks get mixed Q/K/V rows", [_BLOCK, _GPT]),
    _m("hidden_gathered_and_split_again", "block MLP gathers the hidden activations and splits them again (right numbers, extra collectives)", [_COUNT]),
    _m("sp_norm_grad_not_all_reduced", "sequence parallelism: norm weight gradients left partial (not all-reduced)", [_SP, _SP_GPT]),
    _m("partial_sums_all_gathered", "row-parallel linear sums the partial products by one all-gather and a local sum "
       "(right numbers, one collective, not Megatron's all-reduce)", [_KINDS]),
    _m("shards_by_world_rank", "column, row and embedding layers take the shard of the rank's global rank, not of its "
       "rank in the group (right on the world, wrong on a subgroup)", [_SUBGROUP]),
    _m("sp_by_all_reduce", "sequence parallelism by gathering the whole sequence and all-reducing (right numbers, wrong collectives)", [_SP_COUNT]),
    _m("ce_local_max", "cross-entropy subtracts each rank's local max (not all-reduced)", [_CE]),
    _m("ce_no_max", "cross-entropy exponentiates without subtracting the max", [_SHIFT, _HUGE]),
    _m("ce_mean_over_owned_labels", "cross-entropy mean divides by the labels in the rank's own shard", [_CE]),
    _m("ce_mean_counts_ignored", "cross-entropy mean divides by all tokens, ignored ones too", [_CE]),
    _m("ce_ignored_masked_by_multiplying", "cross-entropy zeroes ignored tokens by multiplying by 0: NaN gradients when a mean counts no token", [_CE]),
)
