"""Gradient scaler: fixed spec cases against ``--target`` (capability rows of the report).

No course handout defines it; the contract cases hold torch.amp.GradScaler's documented
contract and the protocol's additions (``conformance.laws.grad_scaler.checks`` says which
source fixes each quantity) with impl's bucketed DDP (``get_ddp``) at 2 ranks: exact unscale at 2^16, an Inf on rank 1 only
skipping on both ranks (Adam state kept, scale halved), scaled = unscaled training over
four steps, growth after 2 clean steps, the second unscale_, the first non-finite
parameter, frozen and unused parameters, two optimizers, and the local rules of a scaler
in one process.  Extras: FSDP, clipping,
accumulation.
"""

import pytest
import torch

from conformance.laws.grad_scaler import checks
from conformance.laws.grad_scaler.strategies import spec_case

pytestmark = pytest.mark.distributed


_case = spec_case


def test_contract_unscale_at_2_to_the_16_is_exact_on_2_ranks(target):
    checks.check_unscale(target.spec, _case())


def test_contract_an_inf_on_rank_1_only_skips_on_both_ranks(target):
    checks.check_skip(target.spec, _case(steps=3, inject=((1, 1, "grad", "inf", 2),), delay_injected_ranks=True))


def test_contract_a_nan_input_on_rank_0_skips_on_both_ranks(target):
    checks.check_skip(target.spec, _case(steps=2, optimizer="sgd", inject=((0, 0, "input", "nan", 0),)))


def test_contract_four_steps_with_scale_2_to_the_10_equal_unscaled_training(target):
    checks.check_parity(target.spec, _case(scale_exp=10, steps=4, growth_interval=1))


def test_contract_growth_after_two_clean_steps_and_reset_on_overflow(target):
    checks.check_growth(target.spec, _case(steps=6, inject=((1, 0, "input", "inf", 0), (4, 1, "grad", "nan", 1))))


def test_contract_second_unscale_raises(target):
    checks.check_second_unscale(target.spec, _case(second_unscale=True))


def test_contract_first_nonfinite_parameter_agreed_on_2_ranks(target):
    checks.check_first_nonfinite(target.spec, _case(steps=2, find_first=True,
                                                    inject=((0, 1, "grad", "inf", 4), (0, 0, "grad", "nan", 6))))


def test_contract_frozen_and_unused_parameters_are_passed_over(target):
    checks.spec_frozen_and_unused_parameters_are_passed_over(target.spec)


def test_contract_two_optimizers_each_skip_on_their_own_gradients(target):
    checks.spec_two_optimizers_each_skip_on_their_own_gradients(target.spec)


def test_contract_one_process_scaler_rules(target):
    """Without a process group: scale multiplies, step returns True/False (the protocol),
    update backs off and grows, the second unscale_ raises RuntimeError (torch's contract)."""
    scaler = target.call("get_distributed_grad_scaler", init_scale=8.0, growth_interval=1)
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([p], lr=1.0)
    loss = scaler.scale((p * torch.tensor([3.0, 5.0])).sum())
    assert float(loss.detach()) == 8.0 * 13.0
    loss.backward()
    scaler.unscale_(opt)
    assert torch.equal(p.grad, torch.tensor([3.0, 5.0]))
    with pytest.raises(RuntimeError):
        scaler.unscale_(opt)
    assert scaler.step(opt) is True
    scaler.update()
    assert scaler.get_scale() == 16.0
    opt.zero_grad()
    scaler.scale((p * torch.tensor([float("inf"), 1.0])).sum()).backward()
    before = p.detach().clone()
    assert scaler.step(opt) is False
    scaler.update()
    assert torch.equal(p.detach(), before) and scaler.get_scale() == 8.0


def test_fsdp_shard_overflow_at_2_ranks(target):
    checks.check_skip(target.spec, _case(wrapper="fsdp", steps=2, inject=((1, 0, "grad", "inf", 0),)))


def test_clipping_to_half_the_global_norm_with_fsdp_at_2_ranks(target):
    checks.check_clip(target.spec, _case(wrapper="fsdp", steps=1, clip_fraction=0.5))


def test_three_micro_batches_under_no_sync_equal_the_big_batch(target):
    checks.check_accumulation(target.spec, _case(steps=1, micro_batches=3))
