"""What a training step sends: collectives, their payloads, and the ring's wire bytes.

Payload S of a collective is the size of the full tensor it is about: the buffer an
all-reduce reduces, the output an all-gather assembles, the input a reduce-scatter
reduces, the tensor a broadcast or a point-to-point message carries.  On a ring of W
ranks each rank sends (and receives)

    all-reduce        2 (W - 1) / W x S     (reduce-scatter, then all-gather)
    all-gather        (W - 1) / W x S
    reduce-scatter    (W - 1) / W x S
    broadcast         (W - 1) / W x S       (pipelined ring; a tree sends S log W)
    send / recv       S

and one phase of (W - 1) / W x S takes about (W - 1) / W x S / bandwidth (plus W - 1
latencies): the time model the benchmarks compare against.

Per optimizer step, with Psi gradient (or parameter) bytes of the model:

    DDP               all-reduce of every gradient: 2 (W - 1) / W x Psi
    ZeRO-1            DDP's all-reduce, then every parameter sent from its owner to the
                      others (a broadcast each, or one all-gather of equal slots):
                      3 (W - 1) / W x Psi, plus the slots' padding
    ZeRO-2            reduce-scatter of gradients, all-gather of parameters:
                      2 (W - 1) / W x Psi (DDP's volume)
    ZeRO-3 / FSDP     all-gather in forward, again in backward, reduce-scatter:
                      3 (W - 1) / W x Psi (1.5 x DDP)

FSDP shards flat units padded to a multiple of W, so Psi is the padded size of the units,
and the parameters it does not shard (norm gains) are all-reduced as DDP would.  In the
compute dtype the gathers carry compute-dtype bytes, the reduce-scatter the reduce dtype.

Tensor parallelism (Megatron, per block, activations of B x T x C in the compute dtype):
2 all-reduces in forward and 2 in backward (sequence parallelism: the same volume as
2 all-gathers and 2 reduce-scatters each way).  Pipeline parallelism: per step and stage
boundary, m messages forward (each micro-batch's activations) and m backward (their
gradients).  Context parallelism (ring attention): per layer and forward, W - 1 steps of
K and V shards passed on (2 x B H (T / W) d elements a step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WIRE_FACTOR = {  # bytes a rank sends per payload byte on a ring of W ranks
    "all_reduce": lambda w: 2 * (w - 1) / w,
    "all_gather": lambda w: (w - 1) / w,
    "reduce_scatter": lambda w: (w - 1) / w,
    "broadcast": lambda w: (w - 1) / w,
    "send": lambda w: 1.0,
}


def kind(name: str) -> str:
    """torch.distributed's name of a call -> the collective it is (old and new names alike)."""
    for k in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        if name.lstrip("_").startswith(k):
            return k
    if name in ("send", "isend", "recv", "irecv"):
        return "send"
    raise ValueError(f"unknown collective {name!r}")


def wire_bytes(name: str, payload: int, world_size: int) -> float:
    """Bytes one rank sends for one call on a ring of ``world_size`` ranks."""
    return WIRE_FACTOR[kind(name)](world_size) * payload


@dataclass(frozen=True)
class Traffic:
    """Calls per collective and their total payload bytes."""

    counts: dict
    payload: dict

    def wire(self, world_size: int) -> float:
        return sum(WIRE_FACTOR[k](world_size) * s for k, s in self.payload.items())


def padded(numel: int, world_size: int) -> int:
    """A flat unit padded so that every rank holds the same share."""
    return math.ceil(numel / world_size) * world_size


def ddp_step(grad_numels: list[int], elem_bytes: int, buckets: int | None = None, presence_flags: bool = False) -> Traffic:
    """One all-reduce per gradient (or per bucket) of the gradients' bytes.

    ``presence_flags``: impl's DDP also agrees, per parameter, whether any rank had a
    gradient (None vs zero for parameters some ranks did not use): one fp32 flag a
    parameter, inside each bucket for the bucketed wrapper, in one extra all-reduce for
    the per-parameter one."""
    n = len(grad_numels) if buckets is None else buckets
    flags = 4 * len(grad_numels) if presence_flags else 0
    extra_call = 1 if (presence_flags and buckets is None) else 0
    return Traffic({"all_reduce": n + extra_call}, {"all_reduce": elem_bytes * sum(grad_numels) + flags})


def fsdp_step(unit_numels: list[int], replicated_numels: list[int], world_size: int, strategy: str,
              compute_bytes: int = 4, reduce_bytes: int = 4, master_bytes: int = 4) -> Traffic:
    """One step of a flat-unit FSDP: ``unit_numels`` the sharded elements of each unit,
    ``replicated_numels`` the parameters it keeps whole (all-reduced one by one)."""
    u = len(unit_numels)
    full = sum(padded(n, world_size) for n in unit_numels)
    repl = {"all_reduce": len(replicated_numels)}, {"all_reduce": master_bytes * sum(replicated_numels)}
    if strategy == "NO_SHARD":
        return Traffic({"all_reduce": u + len(replicated_numels)}, {"all_reduce": reduce_bytes * sum(unit_numels) + repl[1]["all_reduce"]})
    gathers = {"FULL_SHARD": 2 * u, "SHARD_GRAD_OP": u}[strategy]
    gather_payload = compute_bytes * full * gathers // u if u else 0
    return Traffic({"all_gather": gathers, "reduce_scatter": u, **repl[0]},
                   {"all_gather": gather_payload, "reduce_scatter": reduce_bytes * full, **repl[1]})


def zero1_allgather_payload_bounds(param_bytes: list[int], world_size: int, align: int = 512) -> tuple[int, float]:
    """ZeRO-1 syncing parameters by all-gather of equal per-rank slots (impl's default): the
    payload is W slots of the largest share, each parameter aligned to ``align`` bytes.  The
    greedy largest-first assignment gives a share at most Psi / W + the largest parameter,
    so Psi <= payload <= W (Psi / W + largest + align x parameters)."""
    psi = sum(param_bytes)
    return psi, world_size * (psi / world_size + max(param_bytes, default=0) + align * len(param_bytes))


def zero_step_wire(psi_bytes: float, world_size: int, stage: int) -> float:
    """The per-rank wire bytes of one step by ZeRO stage (the module docstring's table)."""
    w = world_size
    return {0: 2, 1: 3, 2: 2, 3: 3}[stage] * (w - 1) / w * psi_bytes


def tensor_parallel_block(tokens: int, width: int, elem_bytes: int, sequence_parallel: bool = False) -> Traffic:
    """Forward and backward of one Megatron block over ``tokens`` x ``width`` activations."""
    s = tokens * width * elem_bytes
    if sequence_parallel:
        return Traffic({"all_gather": 4, "reduce_scatter": 4}, {"all_gather": 4 * s, "reduce_scatter": 4 * s})
    return Traffic({"all_reduce": 4}, {"all_reduce": 4 * s})


def pipeline_stage_messages(stage: int, n_stages: int, n_microbatches: int, activation_bytes: int,
                            header_bytes: int = 80) -> tuple[int, int]:
    """(sends, bytes sent) of one pipeline stage in one step: each of the m micro-batches'
    activations to the next stage (unless last) and its gradient to the previous one (unless
    first).  impl sends a message as a header of 10 int64 (dtype, ndim, sizes) then the
    tensor: two sends of ``header_bytes`` and ``activation_bytes``."""
    messages = n_microbatches * ((stage < n_stages - 1) + (stage > 0))
    return 2 * messages, messages * (header_bytes + activation_bytes)


def ring_attention_sends(world_size: int, kv_bytes: int, accumulator_bytes: int) -> tuple[int, int, int, int]:
    """(forward sends, forward bytes, backward sends, backward bytes) of one rank in ring
    attention as impl does it: forward, W - 1 exchanges of its current K and V (one buffer
    of ``kv_bytes`` = 2 |K|); backward, the same W - 1 K/V exchanges plus W exchanges of the
    dK/dV accumulator (``accumulator_bytes`` = 2 |K| in float32) that ends on its owner."""
    w = world_size
    if w == 1:
        return 0, 0, 0, 0
    return w - 1, (w - 1) * kv_bytes, (w - 1) + w, (w - 1) * kv_bytes + w * accumulator_bytes
