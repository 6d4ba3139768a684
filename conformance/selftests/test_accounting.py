"""Each term of the memory breakdown equals its formula (``conformance.accounting``), on the
CPU with small GPT models: parameters, gradients, AdamW state (plain and sharded over W
ranks) and the activations autograd saves."""

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
