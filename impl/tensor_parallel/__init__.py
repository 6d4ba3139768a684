"""Tensor parallelism (Megatron-LM style): sharded linear layers, their conjugate
communication operations, a vocabulary-parallel embedding and cross-entropy, and the
GPT-style model of ``impl.models.gpt`` built from them.

    comm            the autograd communication operations (identity / all-reduce pairs,
                    all-gather / split pairs, sequence-parallel all-gather / reduce-scatter)
    layers          ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    cross_entropy   vocab_parallel_cross_entropy
    model           TensorParallelBlock, TensorParallelGPT, gather_full

Each module states its contract at the top.
"""

from .comm import shard_range
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .model import TensorParallelBlock, TensorParallelGPT, gather_full

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelBlock",
    "TensorParallelGPT",
    "VocabParallelEmbedding",
    "gather_full",
    "shard_range",
    "vocab_parallel_cross_entropy",
]
