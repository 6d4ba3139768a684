"""Fixed sharded-optimizer cases that kept mutants name (``spec:<name>``), run by the spec
tests in ``conformance/spec/test_sharded_optimizer.py`` and by the mutant self-test.

``check_<name>(target_spec, world_size, device_type)`` raises AssertionError on a failure.
"""

from __future__ import annotations

import torch

from conformance import oracle
from conformance.laws.zero.laws import on_ranks
from conformance.target import load_target


class ToyNet(torch.nn.Module):
    """Two linear layers around a LayerNorm, one without bias: parameters of mixed sizes."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(10, 16, bias=False)
        self.norm = torch.nn.LayerNorm(16)
        self.out = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.inp(x))))


def toy_batches(n_steps, device):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(8, 10, generator=g).to(device), torch.randint(0, 5, (8,), generator=g).to(device)) for _ in range(n_steps)]


def train_steps(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def _per_group(params):
    """The handout's parameter groups: the first layer with its own lr and no weight decay."""
    params = list(params)
    return [{"params": params[:1], "lr": 0.02, "weight_decay": 0.0}, {"params": params[1:]}]


def rank_toy_model(ctx, target_spec, n_steps, groups=False):
    torch.manual_seed(0)
    model = ToyNet().to(ctx.device)
    reference = ToyNet().to(ctx.device)
    reference.load_state_dict(model.state_dict())
    batches = toy_batches(n_steps, ctx.device)
    as_given = _per_group if groups else (lambda ps: ps)
    sharded = load_target(target_spec).call("get_sharded_optimizer", as_given(model.parameters()), torch.optim.AdamW, lr=0.1, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)
    train_steps(model, sharded, batches)
    train_steps(reference, torch.optim.AdamW(as_given(reference.parameters()), lr=0.1, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8), batches)
    return [p.detach() for p in model.parameters()], [p.detach() for p in reference.parameters()]


def _two_groups(params):
    return [{"params": params[:2]}, {"params": params[2:], "lr": 0.01}]


def rank_optimizer_shape(ctx, target_spec):
    torch.manual_seed(0)
    model = ToyNet().to(ctx.device)
    reference = ToyNet().to(ctx.device)
    reference.load_state_dict(model.state_dict())
    params = list(model.parameters())
    opt = load_target(target_spec).call("get_sharded_optimizer", _two_groups(params), torch.optim.SGD, lr=0.1, momentum=0.9)
    plain = torch.optim.SGD(_two_groups(list(reference.parameters())), lr=0.1, momentum=0.9)
    x, y = toy_batches(1, ctx.device)[0]

    def closure_of(net, optimizer):
        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            return loss

        return closure

    loss = opt.step(closure_of(model, opt))
    plain.step(closure_of(reference, plain))
    try:
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    except Exception as exc:  # noqa: BLE001 - say what was asked, not only the KeyError
        raise AssertionError(f"StepLR(optimizer, step_size=1, gamma=0.5) raised {type(exc).__name__}: {exc} "
                             "(a scheduler reads and writes each param_groups entry's 'lr': the groups need the "
                             "optimizer's hyperparameters, e.g. passed as the defaults)") from exc
    scheduler.step()
    torch.optim.lr_scheduler.StepLR(plain, step_size=1, gamma=0.5).step()
    lrs = [g["lr"] for g in opt.param_groups]
    opt.step(closure_of(model, opt))  # the halved lr must reach the step that follows
    plain.step(closure_of(reference, plain))
    return {
        "is_optimizer": isinstance(opt, torch.optim.Optimizer),
        "group_sizes": [len(g["params"]) for g in opt.param_groups],
        "same_objects": all(a is b for a, b in zip([p for g in opt.param_groups for p in g["params"]], params)),
        "lrs": lrs,
        "loss": None if loss is None else float(loss),
        "params": [p.detach().cpu() for p in params],
        "plain": [p.detach().cpu() for p in reference.parameters()],
    }


def check_parameter_groups_with_their_own_hyperparameters_match_unsharded(target_spec, world_size, device_type):
    """The handout's params may be parameter groups with their own lr and weight decay:
    AdamW, 5 steps, every rank = unsharded, bit for bit (the contract; its sources:
    ``conformance.laws.zero.laws.CONTRACT_SOURCES``)."""
    for rank, (got, want) in enumerate(on_ranks(rank_toy_model, world_size, target_spec, 5, True, device=device_type)):
        for i, (a, e) in enumerate(zip(got, want)):
            oracle.assert_bitwise_equal(f"W={world_size} rank {rank}, parameter {i} after 5 AdamW steps with two "
                                        "parameter groups (lr 0.02, no weight decay for the first)", a, e)


def check_is_an_optimizer_whose_param_groups_list_every_parameter(target_spec, world_size, device_type):
    """A torch.optim.Optimizer over two param groups (SGD, momentum, lr 0.1 and 0.01): step
    with a closure returns its loss; StepLR(gamma=0.5) halves both lrs, and the next step
    uses them (equal to a plain SGD's, bit for bit)."""
    for rank, r in enumerate(on_ranks(rank_optimizer_shape, world_size, target_spec, device=device_type)):
        assert r["is_optimizer"], f"rank {rank}: not a torch.optim.Optimizer (LR schedulers refuse it)"
        assert r["group_sizes"] == [2, 3] and r["same_objects"], f"rank {rank}: param_groups hold {r['group_sizes']}, expected [2, 3] of the given parameters"
        assert r["lrs"] == [0.05, 0.005], f"rank {rank}: after StepLR(gamma=0.5) the lrs are {r['lrs']}"
        assert r["loss"] is not None and r["loss"] > 0, f"rank {rank}: step(closure) returned {r['loss']!r}, not the closure's loss"
        for i, (got, want) in enumerate(zip(r["params"], r["plain"])):
            oracle.assert_bitwise_equal(f"rank {rank}, parameter {i} after a step at the lr StepLR set "
                                        "(a scheduled lr must reach every shard's step)", got, want)


# name -> (check, world size wanted)
SPEC_CHECKS = {
    "contract_parameter_groups_with_their_own_hyperparameters_match_unsharded":
        (check_parameter_groups_with_their_own_hyperparameters_match_unsharded, 3),
    "is_an_optimizer_whose_param_groups_list_every_parameter": (check_is_an_optimizer_whose_param_groups_list_every_parameter, 4),
}
