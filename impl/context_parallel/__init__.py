"""Context parallelism: ring attention with log-sum-exp merging.

    merge    merge_attention_partials: two attention partials into one by their logsumexp
    layout   contiguous and zigzag (load-balanced) sequence layouts: shard, unshard, positions
    blocks   one block's forward / backward on our FlashAttention-2 (Triton on CUDA, tiles elsewhere)
    ring     RingAttention: the autograd.Function over a process group
"""

from .layout import LAYOUTS, shard_positions, shard_sequence, unshard_sequence
from .merge import merge_attention_partials
from .ring import RingAttention, RingSchedule, make_ring_attention_function, ring_attention_forward

__all__ = [
    "LAYOUTS", "shard_positions", "shard_sequence", "unshard_sequence", "merge_attention_partials",
    "RingAttention", "RingSchedule", "make_ring_attention_function", "ring_attention_forward",
]
