"""This project's own implementations, exposed through the target protocol.

The functions below carry the CS336 assignment 2 adapter names (2025 and 2026 releases),
so ``impl`` is the default target of every check.  Modules:

    attention   eager reference, FlashAttention-2 in PyTorch tiles and in Triton
    ddp         data-parallel wrappers: naive, flat, overlapped, bucketed
    zero        optimizer-state sharding (ZeRO-1)

Every package knows nothing of the suite: it imports torch, triton and itself only.
"""

from __future__ import annotations


# --- attention ----------------------------------------------------------------------


def get_flashattention_autograd_function_pytorch():
    from .attention.flash_pytorch import FlashAttentionPytorch

    return FlashAttentionPytorch


def get_flashattention_autograd_function_triton():
    from .attention.flash_triton import FlashAttentionTriton

    return FlashAttentionTriton


def get_flashattention_autograd_function_gluon():
    """FlashAttention on Hopper in Gluon (warp-specialised, TMA, wgmma); beyond the course."""
    from .attention.flash_gluon import FlashAttentionGluon

    return FlashAttentionGluon


# --- data parallelism (2025 names) --------------------------------------------------


def get_ddp_individual_parameters(module):
    from .ddp import OverlappedIndividualDDP

    return OverlappedIndividualDDP(module)


def ddp_individual_parameters_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def get_ddp_bucketed(module, bucket_size_mb):
    from .ddp import BucketedDDP

    return BucketedDDP(module, bucket_size_mb=bucket_size_mb)


def ddp_bucketed_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(model, optimizer):
    model.on_train_batch_start()


# --- data parallelism (2026 names) --------------------------------------------------


def get_ddp(module):
    from .ddp import BucketedDDP

    return BucketedDDP(module)


def ddp_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def get_fsdp(module, compute_dtype=None):
    from .fsdp import FSDP

    return FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(model, optimizer):
    model.finish_gradient_synchronization()


def fsdp_gather_full_params(model):
    return model.gather_full_params()


# --- optimizer-state sharding -------------------------------------------------------


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    from .zero import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_cls, **kwargs)


# --- pipeline parallelism -----------------------------------------------------------


def get_pipeline_schedule(name, n_stages, n_microbatches):
    """Per rank (rank r holds stage r), the ordered actions of schedule ``name``
    ("afab"/"gpipe" or "1f1b"): ``Action(kind "F"|"B", microbatch, stage)``."""
    from .pipeline import schedule

    return schedule(name, n_stages, n_microbatches)


def pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
    """One pipelined training step on every rank of ``group``; see impl.pipeline.executor.
    Returns the step's loss (summed micro-batch losses / normalizer) on the last stage,
    None elsewhere; gradients accumulate into the stage's ``param.grad``."""
    from .pipeline import pipeline_train_step as step

    return step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=group, normalizer=normalizer)


# --- fully sharded data parallelism: strategies and accumulation (beyond CS336) -----


def get_fsdp_strategy(module, strategy="FULL_SHARD", compute_dtype=None, reduce_dtype=None, unit_classes=None, shard_group_size=None):
    """FSDP with a sharding strategy: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD.

    The result answers ``fsdp_on_after_backward`` and ``fsdp_gather_full_params`` like
    ``get_fsdp``'s.  ``shard_group_size`` is HYBRID_SHARD's ranks per shard group.
    """
    from .fsdp import FSDP

    return FSDP(
        module,
        strategy=strategy,
        compute_dtype=compute_dtype,
        reduce_dtype=reduce_dtype,
        unit_classes=unit_classes,
        shard_group_size=shard_group_size,
    )


def fsdp_no_sync(model):
    """A context manager: backward passes inside it accumulate gradients locally."""
    return model.no_sync()


# --- tensor parallelism ---------------------------------------------------------------
# Megatron-style layers (impl.tensor_parallel).  ``group``: a torch.distributed process
# group (None: the default group), W its size.  Shards follow the chunk layout: rank r
# holds items [r * ceil(n / W), (r + 1) * ceil(n / W)) clipped to n.


def get_column_parallel_linear(linear, group=None, gather_output=False):
    """nn.Linear -> module: input (..., in) replicated; output (..., rank's out features),
    or (..., out) on every rank with gather_output."""
    from .tensor_parallel import ColumnParallelLinear

    return ColumnParallelLinear(linear, group, gather_output=gather_output)


def get_row_parallel_linear(linear, group=None, input_is_parallel=True):
    """nn.Linear -> module: input (..., in / W), the rank's input features (or the full
    input with input_is_parallel=False); output (..., out) replicated, bias added once."""
    from .tensor_parallel import RowParallelLinear

    return RowParallelLinear(linear, group, input_is_parallel=input_is_parallel)


def get_vocab_parallel_embedding(embedding, group=None):
    """nn.Embedding -> module: ids (any shape) replicated; output (..., dim) replicated."""
    from .tensor_parallel import VocabParallelEmbedding

    return VocabParallelEmbedding(embedding, group)


def vocab_parallel_cross_entropy(local_logits, targets, group=None, *, vocab_size=None, ignore_index=-100, reduction="mean"):
    """Cross-entropy of the rank's vocabulary shard of the logits (..., V_r) against
    replicated targets (...); equal to F.cross_entropy on the full logits."""
    from .tensor_parallel import vocab_parallel_cross_entropy as ce

    return ce(local_logits, targets, group, vocab_size=vocab_size, ignore_index=ignore_index, reduction=reduction)


def get_tensor_parallel_block(block, group=None, sequence_parallel=False):
    """impl.models.gpt.Block -> module: (B, N, C) replicated in and out (sequence_parallel:
    (B, N / W, C), the rank's tokens)."""
    from .tensor_parallel import TensorParallelBlock

    return TensorParallelBlock(block, group, sequence_parallel=sequence_parallel)


def get_tensor_parallel_gpt(model, group=None, sequence_parallel=False):
    """impl.models.gpt.GPT -> module: token ids (B, N) replicated in; the rank's logits
    (B, N, V_r) out, for vocab_parallel_cross_entropy(..., vocab_size=V)."""
    from .tensor_parallel import TensorParallelGPT

    return TensorParallelGPT(model, group, sequence_parallel=sequence_parallel)


def tensor_parallel_gather_full_params(module):
    """A module from the factories above -> {dense parameter name: full tensor}, on every
    rank (a collective: every rank calls it)."""
    from .tensor_parallel import gather_full

    return gather_full(module)


def tensor_parallel_gather_full_grads(module):
    """Like tensor_parallel_gather_full_params, for the gradients (None where absent)."""
    from .tensor_parallel import gather_full

    return gather_full(module, grads=True)


# --- context parallelism (ring attention) -------------------------------------------
#
#   get_ring_attention_autograd_function() -> autograd.Function class; every rank of the
#       group calls .apply(q, k, v, is_causal, group, layout) (positional; group None is
#       the default group, layout "contiguous" or "zigzag") with its shard (..., N/W, d)
#       and gets its shard of O; saves one logsumexp tensor of shape q.shape[:-1].
#   merge_attention_partials(o1, lse1, o2, lse2) -> (o, lse)   (natural-log L)
#   context_parallel_shard(x, world_size, rank, layout="contiguous", dim=-2) -> shard
#   context_parallel_unshard(shards, layout="contiguous", dim=-2) -> whole sequence
#   context_parallel_positions(seq_len, world_size, rank, layout="contiguous", device=None)
#       -> int64 positions of the rank's tokens (its RoPE positions)


def get_ring_attention_autograd_function():
    from .context_parallel import RingAttention

    return RingAttention


def merge_attention_partials(o1, lse1, o2, lse2):
    from .context_parallel import merge_attention_partials as merge

    return merge(o1, lse1, o2, lse2)


def context_parallel_shard(x, world_size, rank, layout="contiguous", dim=-2):
    from .context_parallel import shard_sequence

    return shard_sequence(x, world_size, rank, layout, dim)


def context_parallel_unshard(shards, layout="contiguous", dim=-2):
    from .context_parallel import unshard_sequence

    return unshard_sequence(shards, layout, dim)


def context_parallel_positions(seq_len, world_size, rank, layout="contiguous", device=None):
    from .context_parallel import shard_positions

    return shard_positions(seq_len, world_size, rank, layout, device)


# --- mixed precision with data parallelism; data partitioning -----------------------
#
#   get_distributed_grad_scaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
#       growth_interval=2000, group=None) -> torch.amp.GradScaler's contract (scale,
#       unscale_, step, update, get_scale), the non-finite check agreed across ``group``
#       (one all-reduce), step(opt) -> True if it stepped, False if it skipped; a second
#       unscale_ before update raises RuntimeError; clip_grad_norm_(params, max_norm,
#       sharded_parameters=()) clips to the global norm (see impl.amp.grad_scaler)
#   first_nonfinite_gradient(model, group=None) -> name of the first parameter (in
#       named_parameters order) whose .grad holds NaN/Inf on ANY rank, or None; the same
#       answer on every rank (a collective)
#   get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0,
#       drop_last=False) -> iterable of indices with set_epoch and __len__ (torch's
#       DistributedSampler padding rule; see impl.data.sampler)
#   ddp_join(model) -> context manager for uneven inputs around a model from get_ddp
#       (joined ranks shadow with zeros; the average divides by the initial world size)


def get_distributed_grad_scaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
    from .amp import DistributedGradScaler

    return DistributedGradScaler(init_scale, growth_factor, backoff_factor, growth_interval, group)


def first_nonfinite_gradient(model, group=None):
    from .amp import first_nonfinite_gradient as find

    return find(model, group)


def get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
    from .data import DistributedSampler

    return DistributedSampler(dataset_len, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)


def ddp_join(model):
    from .data import ddp_join as join

    return join(model)


# --- activation checkpointing and ring collectives ---------------------------------------
#   get_checkpointed_blocks(blocks, strategy, segment_size=None) -> nn.Module running the
#       blocks in order; strategy "none", "every", "segments" (k = segment_size), "sqrt",
#       "nested"; a block returning a tuple passes its first item on (impl.checkpointing)
#   ring_all_reduce / ring_all_gather / ring_reduce_scatter / ring_all_reduce_alternate
#       (tensor, group=None) -> new tensor; every rank of the group calls (impl.collectives)


def get_checkpointed_blocks(blocks, strategy, segment_size=None):
    from .checkpointing import checkpointed_blocks

    return checkpointed_blocks(blocks, strategy, segment_size)


def ring_all_reduce(tensor, group=None):
    from .collectives import ring_all_reduce as run

    return run(tensor, group)


def ring_all_gather(tensor, group=None):
    from .collectives import ring_all_gather as run

    return run(tensor, group)


def ring_reduce_scatter(tensor, group=None):
    from .collectives import ring_reduce_scatter as run

    return run(tensor, group)


def ring_all_reduce_alternate(tensor, group=None):
    from .collectives import ring_all_reduce_alternate as run

    return run(tensor, group)


# --- parallelisms composed on a device mesh ------------------------------------------
#   get_parallel_mesh(dims, order=("pp", "dp", "cp", "tp")) -> mesh over the default group
#       (collective on first call; cached): .group(d), .size(d), .rank(d), .ranks(d) for a
#       dimension name or a tuple of names; sizes multiply to W; row-major over ``order``,
#       the last dimension's groups consecutive ranks (impl.mesh)
#   composed_train_step(model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp",
#       n_microbatches=1, schedule="1f1b", ignore_index=-100) -> result with .loss (global,
#       normalised once by the batch's token count), .grads and .params (dense names,
#       gathered; gradients before, parameters after one SGD step); model an
#       impl.models.gpt.GPT, inputs/targets the whole batch on every rank; tp, pp, cp
#       (ring attention, contiguous chunks), dp ("ddp" or "fsdp") from the mesh; gradients
#       averaged over the (dp, cp) replica group (impl.composed)


def get_parallel_mesh(dims, order=("pp", "dp", "cp", "tp")):
    from .mesh import get_parallel_mesh as mesh

    return mesh(dims, order)


def composed_train_step(model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp", n_microbatches=1, schedule="1f1b", ignore_index=-100):
    from .composed import composed_train_step as step

    return step(model, mesh, inputs, targets, lr=lr, data_parallel=data_parallel, n_microbatches=n_microbatches,
                schedule=schedule, ignore_index=ignore_index)
