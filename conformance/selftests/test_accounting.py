"""Accounting formulas (``conformance.accounting``) against measurement, on the CPU with
small models: each term of the memory breakdown (parameters, gradients, AdamW state plain
and sharded over W ranks, the activations autograd saves), the ZeRO-3 share impl's FSDP
keeps, the model FLOPs torch's counter counts, and the collectives a step issues."""

from __future__ import annotations

import pytest
import torch

from impl.models.gpt import GPTConfig, count_parameters, make_gpt, random_batch
from conformance.accounting import (
    adam_state_bytes,
    gpt_activation_bytes,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
    saved_activation_bytes,
    sharded_adam_state_bound,
)

SMALL_CONFIGS = [
    GPTConfig(32, 96, 1, 4, vocab_size=50, context_length=16),
    GPTConfig(48, 80, 3, 6, vocab_size=70, context_length=32),
    GPTConfig(64, 256, 2, 4, vocab_size=256, context_length=64),
]


def _one_step(model, optimizer, batch=2, seq=8):
    x, y = random_batch(model.cfg, batch, seq, generator=torch.Generator().manual_seed(0))
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("cfg", SMALL_CONFIGS, ids=lambda c: f"C{c.d_model}-L{c.n_layers}")
def test_parameters_gradients_and_adamw_state_match_their_formulas(cfg):
    torch.manual_seed(0)
    model = make_gpt(cfg)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    _one_step(model, optimizer)
    n = count_parameters(model)
    assert parameter_bytes(params) == 4 * n
    assert gradient_bytes(params) == 4 * n
    assert optimizer_state_bytes(optimizer) == adam_state_bytes(n, len(params))  # 2 x 4 B x N + 4 B per step


@pytest.mark.parametrize("cfg", SMALL_CONFIGS, ids=lambda c: f"C{c.d_model}-L{c.n_layers}")
@pytest.mark.parametrize("batch, seq", [(1, 5), (3, 16)])
def test_saved_activations_match_the_gpt_formula(cfg, batch, seq):
    torch.manual_seed(0)
    model = make_gpt(cfg, attention="sdpa")
    x, _ = random_batch(cfg, batch, seq)
    with saved_activation_bytes(exclude=list(model.parameters())) as saved:
        model(x.clone())  # token ids in their own storage (a slice would count the whole batch)
    assert saved["bytes"] == gpt_activation_bytes(cfg, batch, seq)


def rank_sharded_adamw_state(ctx):
    from impl.zero.optimizer import ShardedOptimizer

    torch.manual_seed(0)
    model = make_gpt(SMALL_CONFIGS[1])
    params = list(model.parameters())
    optimizer = ShardedOptimizer(params, torch.optim.AdamW, lr=1e-3)
    _one_step(model, optimizer)
    owned = [params[i] for i in optimizer.owned_indices()]
    return {
        "state": optimizer_state_bytes(optimizer),
        "owned_elements": sum(p.numel() for p in owned),
        "owned_params": len(owned),
        "total": count_parameters(model),
        "largest": max(p.numel() for p in params),
    }


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_adamw_state_is_a_share_plus_the_largest_parameter(world_size):
    """state_r = 2 x 4 B x (elements rank r owns) + 4 B per owned parameter, which is at
    most 2 x 4 B x (N/W + largest) + ...; the shards add up to the unsharded state."""
    from conformance.harness import run_on_ranks

    results = run_on_ranks(rank_sharded_adamw_state, world_size, timeout=120, device="cpu")
    n, largest = results[0]["total"], results[0]["largest"]
    for rank, r in enumerate(results):
        assert r["state"] == adam_state_bytes(r["owned_elements"], r["owned_params"]), f"rank {rank}"
        assert r["state"] <= sharded_adam_state_bound(n, largest, world_size, r["owned_params"]), f"rank {rank}"
    assert sum(r["owned_elements"] for r in results) == n
    n_params = sum(r["owned_params"] for r in results)
    assert sum(r["state"] for r in results) == adam_state_bytes(n, n_params)


# --- FLOPs: the formula against torch's FLOP counter ----------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from conformance.accounting import flops as model_flops  # noqa: E402


@st.composite
def gpt_configs(draw):
    heads = draw(st.integers(1, 4))
    return GPTConfig(heads * draw(st.integers(1, 12)), draw(st.integers(1, 96)), draw(st.integers(1, 3)), heads,
                     vocab_size=draw(st.integers(2, 80)), context_length=32, attention="eager")


@settings(deadline=None)
@given(cfg=gpt_configs(), batch=st.integers(1, 3), seq=st.integers(1, 32))
def test_model_flops_per_token_equal_what_torch_counts_in_a_training_step(cfg, batch, seq):
    """6 N_mm + 12 L T C per token (2 N_mm + 4 L T C forward): exactly the matmul FLOPs
    torch.utils.flop_counter counts in forward and backward of the GPT with materialised
    attention (torch's CPU SDPA kernel is not one the counter knows)."""
    torch.manual_seed(0)
    model = make_gpt(cfg)
    x, y = random_batch(cfg, batch, seq, generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as forward_count:
        logits = model(x)
    assert forward_count.get_total_flops() == model_flops.flops_per_token(cfg, seq, training=False) * batch * seq
    with FlopCounterMode(display=False) as step_count:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    assert step_count.get_total_flops() == model_flops.flops_per_token(cfg, seq) * batch * seq


def test_mfu_is_achieved_over_peak():
    assert model_flops.mfu(6e9, 1e4, 1e15) == pytest.approx(0.06)
    with pytest.raises(ValueError, match="peak"):
        model_flops.mfu(1.0, 1.0, 0.0)


# --- ZeRO memory: the formula against what impl's FSDP and sharded optimizer keep -----------

from conformance.accounting import zero_model_state_bytes  # noqa: E402


def test_zero_formula_is_the_papers_two_plus_two_plus_k():
    psi, w = 7_500_000_000, 64  # the ZeRO paper's Figure 1: 7.5B parameters, 64 GPUs, K = 12
    assert zero_model_state_bytes(psi, w, 0)["total"] == 16 * psi  # 120 GB
    assert zero_model_state_bytes(psi, w, 1)["total"] == pytest.approx(4 * psi + 12 * psi / w)  # 31.4 GB
    assert zero_model_state_bytes(psi, w, 2)["total"] == pytest.approx(2 * psi + 14 * psi / w)  # 16.6 GB
    assert zero_model_state_bytes(psi, w, 3)["total"] == pytest.approx(16 * psi / w)  # 1.9 GB
    with pytest.raises(ValueError, match="stage"):
        zero_model_state_bytes(psi, w, 4)


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_fsdp_model_states_at_rest_are_the_zero3_share(world_size, strategy):
    """After a step impl's FSDP keeps (4 + 4 + 8) bytes / W of every sharded element (fp32
    master shard, its gradient, AdamW's two moments: ZeRO-3's share with fp32 parameters and
    K = 8) plus the full 16 bytes of the parameters it does not shard (norm gains); the
    difference is at most the padding of each flat buffer to a multiple of W (W - 1 elements
    a unit) and AdamW's step counters.  NO_SHARD (DDP's replication) is the control: it
    must hold more, or the bound could not fail."""
    from conformance.harness import run_on_ranks, require_world_size
    from conformance.laws.fsdp import model as fsdp_models
    from conformance.laws.fsdp.rank import train_on_rank
    from conformance.laws.fsdp.strategies import FSDPCase

    require_world_size(world_size)
    case = FSDPCase(world_size=world_size, vocab=37, widths=(24, 40, 24), norms=True, tied=False, frozen=None, compute=None,
                    optimizer="AdamW", lr=0.01, steps=2, batch_per_rank=2, seq=4, seed=3, strategy=strategy)
    model = fsdp_models.build(case)
    sharded = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2)
    replicated = sum(p.numel() for n, p in model.named_parameters() if p.dim() < 2)
    units = sum(1 for m in model.modules() if any(p.dim() == 2 for p in m._parameters.values() if p is not None))
    expected = zero_model_state_bytes(sharded, world_size, 3, param_bytes=4, grad_bytes=4, optimizer_bytes=8)["total"]
    expected += zero_model_state_bytes(replicated, 1, 0, param_bytes=4, grad_bytes=4, optimizer_bytes=8)["total"]
    n_tensors = len(list(model.parameters()))
    slack = 16 * (world_size - 1) * units + 8 * 2 * (n_tensors + units)  # padding; step scalars (flat or per tensor)
    for rank, res in enumerate(run_on_ranks(train_on_rank, world_size, "impl", case, timeout=180)):
        held = res["steps"][-1]["bytes_after_step"]
        if strategy == "NO_SHARD":
            assert held > expected + slack, f"rank {rank}: replicated model states ({held} bytes) pass for a ZeRO-3 share"
            continue
        assert expected <= held <= expected + slack, f"rank {rank}: {held} bytes after the step, ZeRO-3 share {expected:.0f} (+ at most {slack})"


# --- communication: the formulas against what impl's wrappers send in one step -------------

from conformance.accounting import communication as comm  # noqa: E402

# The traffic counts are a property of the calls, not of a device: every pool here is a gloo
# one (the rank functions build CPU models and tensors, which NCCL refuses under --device cuda).
TRAFFIC_DEVICE = "cpu"


def rank_step_traffic(ctx, wrapper: str, strategy: str | None = None):
    """One training step of the FSDP laws' model under impl's ``wrapper``: the calls made
    after wrapping (construction's broadcast excluded), with their payloads."""
    import impl
    from conformance.accounting.observe import recording
    from conformance.laws.fsdp import model as fsdp_models
    from conformance.laws.fsdp.strategies import FSDPCase

    torch.manual_seed(0)
    case = FSDPCase(world_size=ctx.world_size, vocab=37, widths=(24, 40, 24), norms=True, tied=False, frozen=None, compute=None,
                    optimizer="AdamW", lr=0.01, steps=1, batch_per_rank=2, seq=4, seed=3)
    base = fsdp_models.build(case)
    if wrapper == "fsdp":
        model = impl.get_fsdp_strategy(base, strategy)
        finish, params = impl.fsdp_on_after_backward, model.parameters()
    elif wrapper in ("ddp_individual", "ddp_sharded"):
        model = impl.get_ddp_individual_parameters(base)
        finish, params = impl.ddp_individual_parameters_on_after_backward, model.parameters()
    else:
        model = impl.get_ddp_bucketed(base, 0.001)  # 1 kB buckets: several
        finish, params = impl.ddp_bucketed_on_after_backward, model.parameters()
    opt = torch.optim.AdamW(params, lr=0.01)
    if wrapper == "ddp_sharded":
        opt = impl.get_sharded_optimizer(model.parameters(), torch.optim.AdamW, lr=0.01)
    ids, labels = fsdp_models.batch(case, 0, 0)
    sl = fsdp_models.rank_slice(case, ctx.rank)
    with recording() as events:
        fsdp_models.loss_of(model(ids[sl]), labels[sl]).backward()
        finish(model, opt)
        opt.step()
    buckets = len(getattr(model, "buckets", None) or getattr(model, "_buckets", None) or []) if wrapper == "ddp_bucketed" else None
    return {"events": list(events), "buckets": buckets}


def _traffic(events) -> tuple[dict, dict]:
    counts, payload = {}, {}
    for name, nbytes in events:
        k = comm.kind(name)
        counts[k] = counts.get(k, 0) + 1
        payload[k] = payload.get(k, 0) + nbytes
    return counts, payload


def _model_numels():
    from conformance.laws.fsdp import model as fsdp_models
    from conformance.laws.fsdp.strategies import FSDPCase

    case = FSDPCase(world_size=1, vocab=37, widths=(24, 40, 24), norms=True, tied=False, frozen=None, compute=None,
                    optimizer="AdamW", lr=0.01, steps=1, batch_per_rank=2, seq=4, seed=3)
    model = fsdp_models.build(case)
    units = [sum(p.numel() for p in m._parameters.values() if p is not None and p.dim() == 2)
             for m in model.modules() if any(p is not None and p.dim() == 2 for p in m._parameters.values())]
    replicated = [p.numel() for p in model.parameters() if p.dim() < 2]
    return units, replicated, [p.numel() for p in model.parameters()]


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("strategy, stage", [("FULL_SHARD", 3), ("SHARD_GRAD_OP", 2), ("NO_SHARD", 0)])
def test_fsdp_step_sends_what_the_zero_formulas_say(world_size, strategy, stage):
    """Calls and payloads of one step of impl's FSDP equal ``communication.fsdp_step``
    exactly, and its ring wire bytes are the ZeRO stage's (2 or 3) x (W - 1) / W x Psi over
    the padded units plus the all-reduce of the unsharded gains."""
    from conformance.harness import require_world_size, run_on_ranks

    require_world_size(world_size, TRAFFIC_DEVICE)
    units, replicated, _ = _model_numels()
    expected = comm.fsdp_step(units, replicated, world_size, strategy)
    psi = 4 * sum(comm.padded(n, world_size) for n in units) if stage else 4 * sum(units)
    gains = comm.wire_bytes("all_reduce", 4 * sum(replicated), world_size)
    for rank, res in enumerate(run_on_ranks(rank_step_traffic, world_size, "fsdp", strategy, timeout=180, device=TRAFFIC_DEVICE)):
        counts, payload = _traffic(res["events"])
        assert (counts, payload) == (expected.counts, expected.payload), f"rank {rank}: {res['events']}"
        assert expected.wire(world_size) == pytest.approx(comm.zero_step_wire(psi, world_size, stage) + gains)


@pytest.mark.distributed
@pytest.mark.parametrize("wrapper", ["ddp_individual", "ddp_bucketed"])
def test_ddp_step_all_reduces_every_gradient_once(wrapper):
    """DDP: all-reduces whose payloads add up to every gradient's bytes, one a parameter
    (or one a bucket), 2 (W - 1) / W x Psi on the wire, plus impl's presence flags (4 bytes
    a parameter)."""
    from conformance.harness import require_world_size, run_on_ranks

    require_world_size(2, TRAFFIC_DEVICE)
    _, _, numels = _model_numels()
    for rank, res in enumerate(run_on_ranks(rank_step_traffic, 2, wrapper, timeout=180, device=TRAFFIC_DEVICE)):
        expected = comm.ddp_step(numels, 4, buckets=res["buckets"], presence_flags=True)
        counts, payload = _traffic(res["events"])
        assert (counts, payload) == (expected.counts, expected.payload), f"rank {rank}: {res['events']}"
        assert expected.wire(2) == comm.zero_step_wire(4 * sum(numels) + 4 * len(numels), 2, 0)


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_step_adds_one_all_gather_of_every_parameter(world_size):
    """ZeRO-1 (impl's sharded optimizer over DDP): DDP's all-reduces, then one all-gather of
    every rank's equal slot: at least Psi and at most W (Psi / W + largest + alignment),
    so at least 3 (W - 1) / W x Psi on the wire."""
    from conformance.harness import require_world_size, run_on_ranks

    require_world_size(world_size, TRAFFIC_DEVICE)
    _, _, numels = _model_numels()
    ddp = comm.ddp_step(numels, 4, presence_flags=True)
    lo, hi = comm.zero1_allgather_payload_bounds([4 * n for n in numels], world_size)
    for rank, res in enumerate(run_on_ranks(rank_step_traffic, world_size, "ddp_sharded", timeout=180, device=TRAFFIC_DEVICE)):
        counts, payload = _traffic(res["events"])
        assert counts == {**ddp.counts, "all_gather": 1}, f"rank {rank}: {res['events']}"
        assert payload["all_reduce"] == ddp.payload["all_reduce"], f"rank {rank}: {res['events']}"
        assert lo <= payload["all_gather"] <= hi, f"rank {rank}: all-gather of {payload['all_gather']} bytes, bounds [{lo}, {hi:.0f}]"
        wire = comm.Traffic(counts, payload).wire(world_size)
        assert wire >= comm.zero_step_wire(4 * sum(numels), world_size, 1)


def rank_tensor_parallel_block_traffic(ctx, batch: int, seq: int):
    """Forward and backward of impl's tensor-parallel block on replicated (B, T, C) input."""
    import impl
    from conformance.accounting.observe import recording
    from impl.models.gpt import Block

    torch.manual_seed(0)
    cfg = GPTConfig(16, 40, 1, 4, vocab_size=11, context_length=seq)
    block = impl.get_tensor_parallel_block(Block(cfg))
    x = torch.randn(batch, seq, cfg.d_model, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with recording() as forward:
        y = block(x)
    with recording() as backward:
        y.backward(torch.ones_like(y))
    return {"forward": list(forward), "backward": list(backward), "width": cfg.d_model}


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_block_all_reduces_four_activations_per_step(world_size):
    """A Megatron block: 2 all-reduces of B x T x C activations in forward (after the
    attention output and the MLP down projection) and 2 in backward (before the
    column-parallel inputs), whatever W."""
    from conformance.harness import require_world_size, run_on_ranks

    require_world_size(world_size, TRAFFIC_DEVICE)
    batch, seq = 2, 5
    for rank, res in enumerate(run_on_ranks(rank_tensor_parallel_block_traffic, world_size, batch, seq, timeout=120, device=TRAFFIC_DEVICE)):
        expected = comm.tensor_parallel_block(batch * seq, res["width"], 4)
        counts, payload = _traffic(res["forward"] + res["backward"])
        assert (counts, payload) == (expected.counts, expected.payload), f"rank {rank}: {res}"
        assert len(res["forward"]) == len(res["backward"]) == 2, f"rank {rank}: {res}"


def rank_pipeline_traffic(ctx, n_microbatches: int, schedule: str):
    import impl
    from conformance.accounting.observe import recording

    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, 6) for _ in range(2 * ctx.world_size)]
    start, stop = 2 * ctx.rank, 2 * ctx.rank + 2
    stage = torch.nn.Sequential(*layers[start:stop])
    g = torch.Generator().manual_seed(2)
    inputs, targets = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
    plan = impl.get_pipeline_schedule(schedule, ctx.world_size, n_microbatches)
    loss_fn = lambda out, tgt: ((out - tgt) ** 2).sum()  # noqa: E731
    with recording() as events:
        impl.pipeline_train_step(stage, plan, inputs, targets, loss_fn, n_microbatches)
    return {"events": list(events)}


@pytest.mark.distributed
@pytest.mark.parametrize("world_size, n_microbatches, schedule", [(2, 1, "afab"), (2, 4, "1f1b"), (3, 2, "1f1b"), (4, 8, "afab")])
def test_pipeline_stage_sends_one_activation_and_one_gradient_per_microbatch(world_size, n_microbatches, schedule):
    """Per step and stage boundary, m activations forward and m gradients back (each a
    header and the tensor), for either schedule."""
    from conformance.harness import require_world_size, run_on_ranks

    require_world_size(world_size, TRAFFIC_DEVICE)
    micro_rows = 8 // n_microbatches
    for rank, res in enumerate(run_on_ranks(rank_pipeline_traffic, world_size, n_microbatches, schedule, timeout=120, device=TRAFFIC_DEVICE)):
        sends = [b for name, b in res["events"] if name in ("send", "isend")]
        expected = comm.pipeline_stage_messages(rank, world_size, n_microbatches, 4 * micro_rows * 6)
        assert (len(sends), sum(sends)) == expected, f"rank {rank}: {res['events']}"


def rank_ring_attention_traffic(ctx, heads: int, shard: int, d: int):
    import impl
    from conformance.accounting.observe import recording

    g = torch.Generator().manual_seed(ctx.rank)
    q, k, v = (torch.randn(1, heads, shard, d, generator=g, requires_grad=True) for _ in range(3))
    ring = impl.get_ring_attention_autograd_function()
    with recording() as forward:
        o = ring.apply(q, k, v, True, None, "contiguous")
    with recording() as backward:
        o.backward(torch.ones_like(o))
    return {"forward": list(forward), "backward": list(backward), "kv_bytes": 2 * k.numel() * 4}


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ring_attention_passes_kv_w_minus_one_times_and_the_accumulator_w_times(world_size):
    """Forward: W - 1 sends of the rank's current K and V; backward: W - 1 again plus W of
    the dK/dV accumulator (float32) that ends on its owner."""
    from conformance.harness import require_world_size, run_on_ranks

    require_world_size(world_size, TRAFFIC_DEVICE)
    for rank, res in enumerate(run_on_ranks(rank_ring_attention_traffic, world_size, 2, 3, 4, timeout=120, device=TRAFFIC_DEVICE)):
        fwd = [b for name, b in res["forward"] if name in ("send", "isend")]
        bwd = [b for name, b in res["backward"] if name in ("send", "isend")]
        expected = comm.ring_attention_sends(world_size, res["kv_bytes"], res["kv_bytes"])
        assert (len(fwd), sum(fwd), len(bwd), sum(bwd)) == expected, f"rank {rank}: {res}"
