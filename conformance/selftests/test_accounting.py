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
