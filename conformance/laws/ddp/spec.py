"""Fixed data-parallel spec cases, in our own words.

Each case is a small, fixed situation with a known right answer; the rank-side functions
run on two ranks through ``conformance.harness`` (gloo on the CPU, NCCL on two GPUs) and
return plain tensors; the ``check_*`` functions judge them in the test process.

toy_training        (The contract: the course's tests, see check_toy_training.)
                    A fixed toy MLP (10 -> 10 -> 50 -> 5, ReLU; optionally with a tied
                    pair of layers), two ranks with equal halves of each batch, per-rank
                    *mean* MSE loss (equal halves: the mean of the two means is the
                    full-batch mean), SGD, five steps in the adapter call sequence
                    on_train_batch_start -> forward -> backward -> on_after_backward ->
                    optimizer.step.  After wrapping and after every step the replicas are
                    bit-identical, and the final parameters match one process trained on
                    the whole batches (oracle: float64 reference, float32 eager yardstick).
wrap_broadcast      Ranks build their module from different seeds; right after wrapping,
                    every rank holds rank 0's parameters and buffers, bit for bit.
exact_average       With two ranks the average of two float32 gradients is exactly
                    (g0 + g1) / 2 whatever the order of addition or where the halving
                    happens, so the synchronised gradient must equal it bit for bit; each
                    rank also reports its local gradient from an unwrapped copy.
frozen_and_unused   A frozen layer and a branch: step 1 no rank uses the branch (its
                    .grad stays None, like one process on the whole batch), step 2 only
                    rank 0 does (its gradient is rank 0's halved, exactly), step 3 only
                    rank 1 does (rank 0, which had a gradient last step, must send zeros,
                    not what is left of last step's); the frozen layer never gets a
                    gradient and never moves.
no_sync_accumulate  Two micro-batches, the first under no_sync(): right after that
                    backward each rank's gradient is its own local one (nothing was
                    reduced); after the synced one it is exactly (acc0 + acc1) / 2.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from conformance import oracle
from conformance.laws.ddp.flavours import flavour_api
from conformance.target import load_target
from conformance.verdicts import NotOffered, classify

# The bucketed flavour runs each case with several small buckets, with one large one, and
# with None: "a single bucket of unbounded size", as the course's adapter docstring says.
BUCKET_SIZES_MB = {"individual": (None,), "bucketed": (1e-4, 100.0, None), "ddp2026": (None,)}
WORLD_SIZE = 2


# --- models ---------------------------------------------------------------------------


class ToyMLP(nn.Module):
    """10 -> 10 (no bias) -> 50 -> 5 with ReLU; ``tied`` inserts a 10 -> 10 pair sharing a weight."""

    def __init__(self, tied: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.tied = tied
        if tied:
            self.mid_a = nn.Linear(10, 10)
            self.mid_b = nn.Linear(10, 10)
            self.mid_b.weight = self.mid_a.weight
        self.fc2 = nn.Linear(10, 50)
        self.fc3 = nn.Linear(50, 5)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        if self.tied:
            h = F.relu(self.mid_b(F.relu(self.mid_a(h))))
        return self.fc3(F.relu(self.fc2(h)))


class WithBuffer(nn.Module):
    """A linear layer, two persistent buffers, a non-persistent one, and a parameter that is
    a transposed (non-contiguous) view: wrapping must broadcast all of them in place."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("shift", torch.randn(3))
        self.register_buffer("count", torch.randint(0, 100, (1,)))
        self.register_buffer("scratch", torch.randn(3), persistent=False)
        self.proj = nn.Parameter(torch.randn(3, 4).t())  # shape (4, 3), strides (1, 4)

    def forward(self, x):
        return self.lin(x) + self.shift + self.scratch + (x @ self.proj)


class FrozenAndBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 4)
        self.frozen = nn.Linear(4, 4).requires_grad_(False)
        self.branch = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x, use_branch: bool):
        h = torch.tanh(self.frozen(torch.tanh(self.inp(x))))
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.out(h)


class MixedDtypes(nn.Module):
    """float32 -> float64 -> float32 layers: parameters of two dtypes, interleaved, so a
    bucket that held both (or one flat buffer of one dtype) would mix them."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 6)
        self.b = nn.Linear(6, 6).double()
        self.c = nn.Linear(6, 5)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)).double())).float())


def _seeded(make, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return make()


def _params(model: nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _grads(model: nn.Module) -> dict:
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


def _batches(steps: int, rows: int, d_in: int, d_out: int, seed: int = 1234):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, d_in, generator=g), torch.randn(rows, d_out, generator=g)) for _ in range(steps)]


def _guarded(case, ctx, target_spec, flavour, *args, **kwargs):
    """Rank-side: run ``case`` with the flavour's entry points (a piece that is not offered
    raises NotOffered, which the harness reports as the verdict)."""
    return case(ctx, flavour_api(load_target(target_spec), flavour), *args, **kwargs)


# --- rank-side cases --------------------------------------------------------------------

TOY_STEPS, TOY_ROWS, TOY_LR = 5, 20, 0.1


def _toy_training(ctx, api, bucket_size_mb, tied: bool):
    model = _seeded(lambda: ToyMLP(tied), 100 + ctx.rank).to(ctx.device)  # rank 0's init must win
    wrapped = api.wrap(model, bucket_size_mb)
    after_wrap = _params(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=TOY_LR)
    per_step = []
    half = TOY_ROWS // WORLD_SIZE
    for x, y in _batches(TOY_STEPS, TOY_ROWS, 10, 5):
        mine = slice(ctx.rank * half, (ctx.rank + 1) * half)
        optimizer.zero_grad(set_to_none=True)
        api.start_batch(wrapped, optimizer)
        loss = F.mse_loss(wrapped(x[mine].to(ctx.device)), y[mine].to(ctx.device))
        loss.backward()
        api.after_backward(wrapped, optimizer)
        optimizer.step()
        per_step.append(_params(model))
    return {"after_wrap": after_wrap, "per_step": per_step}


def _wrap_broadcast(ctx, api, bucket_size_mb):
    model = _seeded(WithBuffer, 200 + ctx.rank).to(ctx.device)
    api.wrap(model, bucket_size_mb)
    return {"params": _params(model), "buffers": {n: b.detach().clone() for n, b in model.named_buffers()}}


def _local_grads(make, model: nn.Module, run) -> dict:
    """Gradients of a fresh, unwrapped twin of ``model`` (same values, no hooks) for the
    same computation: what this rank alone would produce."""
    twin = make().to(next(model.parameters()).device)
    twin.load_state_dict(model.state_dict())
    run(twin)
    return _grads(twin)


def _one_averaged_step(ctx, api, bucket_size_mb, make, model_seed: int, data_seed: int) -> dict:
    """One synced step of a fresh ``make()`` model: each rank's local gradient and the synced one."""
    model = _seeded(make, model_seed).to(ctx.device)
    x, y = _batches(1, 8, 10, 5, seed=data_seed + ctx.rank)[0]
    x, y = x.to(ctx.device), y.to(ctx.device)
    wrapped = api.wrap(model, bucket_size_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    local = _local_grads(make, model, lambda m: F.mse_loss(m(x), y).backward())
    optimizer.zero_grad(set_to_none=True)
    api.start_batch(wrapped, optimizer)
    F.mse_loss(wrapped(x), y).backward()
    api.after_backward(wrapped, optimizer)
    return {"local": local, "synced": _grads(model)}


def _exact_average(ctx, api, bucket_size_mb):
    return _one_averaged_step(ctx, api, bucket_size_mb, lambda: ToyMLP(False), 300, 77)


def _mixed_dtypes(ctx, api, bucket_size_mb):
    return _one_averaged_step(ctx, api, bucket_size_mb, MixedDtypes, 350, 88)


def _frozen_and_unused(ctx, api, bucket_size_mb):
    model = _seeded(FrozenAndBranch, 400).to(ctx.device)
    frozen_before = {n: p.detach().clone() for n, p in model.frozen.named_parameters()}
    wrapped = api.wrap(model, bucket_size_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    steps = []
    for step, use in enumerate([(False, False), (True, False), (False, True)]):
        x = _batches(1, 4, 3, 2, seed=500 + 10 * step + ctx.rank)[0][0].to(ctx.device)
        use_here = use[ctx.rank]
        local = _local_grads(FrozenAndBranch, model, lambda m: m(x, use_here).square().sum().backward())
        optimizer.zero_grad(set_to_none=True)
        api.start_batch(wrapped, optimizer)
        wrapped(x, use_here).square().sum().backward()
        api.after_backward(wrapped, optimizer)
        steps.append({"local": local, "synced": _grads(model)})
        optimizer.step()
    frozen_after = {n: p.detach().clone() for n, p in model.frozen.named_parameters()}
    return {"steps": steps, "frozen_before": frozen_before, "frozen_after": frozen_after}


def _no_sync_accumulate(ctx, api, bucket_size_mb):
    model = _seeded(lambda: ToyMLP(False), 600).to(ctx.device)
    wrapped = api.wrap(model, bucket_size_mb)
    if not callable(getattr(wrapped, "no_sync", None)):
        raise NotOffered(f"the {api.name} wrapper ({type(wrapped).__name__}) has no no_sync()")
    (xa, ya), (xb, yb) = ((x.to(ctx.device), y.to(ctx.device)) for x, y in _batches(2, 6, 10, 5, seed=700 + ctx.rank))
    local_a = _local_grads(ToyMLP, model, lambda m: F.mse_loss(m(xa), ya).backward())
    local_ab = _local_grads(ToyMLP, model, lambda m: (F.mse_loss(m(xa), ya).backward(), F.mse_loss(m(xb), yb).backward()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    optimizer.zero_grad(set_to_none=True)
    api.start_batch(wrapped, optimizer)
    with wrapped.no_sync():
        F.mse_loss(wrapped(xa), ya).backward()
    after_no_sync = _grads(model)
    F.mse_loss(wrapped(xb), yb).backward()
    api.after_backward(wrapped, optimizer)
    return {"local_a": local_a, "local_ab": local_ab, "after_no_sync": after_no_sync, "synced": _grads(model)}


# The case functions the ranks run (module level: pickled by reference).
def toy_training(ctx, target_spec, flavour, bucket_size_mb, tied):
    return _guarded(_toy_training, ctx, target_spec, flavour, bucket_size_mb, tied)


def wrap_broadcast(ctx, target_spec, flavour, bucket_size_mb):
    return _guarded(_wrap_broadcast, ctx, target_spec, flavour, bucket_size_mb)


def exact_average(ctx, target_spec, flavour, bucket_size_mb):
    return _guarded(_exact_average, ctx, target_spec, flavour, bucket_size_mb)


def mixed_dtypes(ctx, target_spec, flavour, bucket_size_mb):
    return _guarded(_mixed_dtypes, ctx, target_spec, flavour, bucket_size_mb)


def frozen_and_unused(ctx, target_spec, flavour, bucket_size_mb):
    return _guarded(_frozen_and_unused, ctx, target_spec, flavour, bucket_size_mb)


def no_sync_accumulate(ctx, target_spec, flavour, bucket_size_mb):
    return _guarded(_no_sync_accumulate, ctx, target_spec, flavour, bucket_size_mb)


# --- checks (test side) -----------------------------------------------------------------


def _single_process_toy(tied: bool, dtype: torch.dtype) -> dict:
    model = _seeded(lambda: ToyMLP(tied), 100).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=TOY_LR)
    for x, y in _batches(TOY_STEPS, TOY_ROWS, 10, 5):
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x.to(dtype)), y.to(dtype)).backward()
        optimizer.step()
    return _params(model)


def check_toy_training(results: list[dict], tied: bool) -> None:
    """The contract tier of every DDP flavour: the course's DDP tests in our words (2025:
    test_ddp_individual_parameters.py and test_ddp.py, 2026: test_ddp.py; the toy model
    and the tied-weight one, two ranks, SGD at lr 0.1, five steps).  What it pins, and
    the source of each:

    - right after wrapping every rank holds rank 0's initial parameters, bit for bit.
      Course: rank 0's wrapped parameters still equal its own model's and every other
      rank's differ from its own (torch.allclose), then validate_ddp_net_equivalence;
      torch's DistributedDataParallel broadcasts rank 0's state at construction.  A
      broadcast copies values: no design gets other bits.
    - after every step rank 1's parameters equal rank 0's, bit for bit.  Course:
      validate_ddp_net_equivalence (torch.allclose across ranks); torch's DDP contract:
      after backward a parameter's averaged gradient is the same on every process.
      At two ranks exactness costs no correct design anything: g0 + g1 is one float
      whichever rank adds it in whichever order, and halving is exact, so every correct
      average (an all-reduce of any algorithm, per parameter, per bucket or over one flat
      buffer, an all-gather and a local sum, dividing before or after) gives both ranks
      the same bits, and the same optimizer step keeps them equal.
    - the final parameters match one process trained on the whole batches, within the
      oracle (float64 reference, the float32 eager run's error as the yardstick); the
      course asks torch.allclose after every step.

    No count, size, order or timing of collectives or buckets is checked here: the
    course's tests fix none (their bucket sizes come with the bucket counts they expect
    in a comment only).  The bucket layout and the overlap with backward are extras
    (``conformance.laws.ddp.laws``).
    """
    initial = _params(_seeded(lambda: ToyMLP(tied), 100))
    for r, res in enumerate(results):
        for name, value in res["after_wrap"].items():
            oracle.assert_bitwise_equal(f"rank {r}: {name} right after wrapping vs rank 0's initial value", value, initial[name])
    for s in range(TOY_STEPS):
        for name, value in results[0]["per_step"][s].items():
            oracle.assert_bitwise_equal(f"step {s}: {name} on rank 1 vs rank 0", results[1]["per_step"][s][name], value)
    ref64 = _single_process_toy(tied, torch.float64)
    eager = _single_process_toy(tied, torch.float32)
    for name, ref in ref64.items():
        oracle.assert_close(f"{name} after {TOY_STEPS} steps vs one process on the whole batches", results[0]["per_step"][-1][name], ref, eager[name], torch.float32)


def check_wrap_broadcast(results: list[dict]) -> None:
    zero = results[0]
    expected = _seeded(WithBuffer, 200)
    for name, p in expected.named_parameters():
        oracle.assert_bitwise_equal(f"rank 0: {name} changed by wrapping", zero["params"][name], p.detach())
    for r, res in enumerate(results[1:], start=1):
        for kind in ("params", "buffers"):
            for name, value in zero[kind].items():
                oracle.assert_bitwise_equal(f"rank {r}: {kind[:-1]} {name} right after wrapping vs rank 0's", res[kind][name], value)


def _expect_average(what: str, synced: dict, locals_: list[dict]) -> None:
    """Two ranks: exactly (g0 + g1) / 2, a missing local gradient counting as zero;
    None where no rank had one."""
    for name in synced:
        present = [loc[name] for loc in locals_ if loc[name] is not None]
        if not present:
            if synced[name] is not None:
                raise AssertionError(f"{what}: {name} has a gradient but no rank produced one (expected None)")
            continue
        if synced[name] is None:
            raise AssertionError(f"{what}: {name} has no gradient but rank(s) produced one")
        total = present[0] if len(present) == 1 else present[0] + present[1]
        oracle.assert_bitwise_equal(f"{what}: {name} vs (g0 + g1) / 2", synced[name], total / 2)


def check_exact_average(results: list[dict]) -> None:
    for r, res in enumerate(results):
        _expect_average(f"rank {r}", res["synced"], [x["local"] for x in results])


def check_frozen_and_unused(results: list[dict]) -> None:
    for r, res in enumerate(results):
        for s, step in enumerate(res["steps"]):
            _expect_average(f"rank {r}, step {s}", step["synced"], [x["steps"][s]["local"] for x in results])
        for name, before in res["frozen_before"].items():
            oracle.assert_bitwise_equal(f"rank {r}: frozen.{name} moved", res["frozen_after"][name], before)


def check_no_sync_accumulate(results: list[dict]) -> None:
    for r, res in enumerate(results):
        for name, local in res["local_a"].items():
            oracle.assert_bitwise_equal(f"rank {r}: {name} right after the no_sync backward vs its local gradient", res["after_no_sync"][name], local)
        _expect_average(f"rank {r}, after the synced micro-batch", res["synced"], [x["local_ab"] for x in results])


# The CS336 DDP tests train the toy model (and the tied-weight one) on two ranks and
# compare with one process (check_toy_training says what that pins and why); the other
# cases are this project's wider API.
CONTRACT_CASES = ("toy_training", "toy_training_tied")

CASES = {
    "toy_training": (toy_training, lambda results: check_toy_training(results, tied=False), {"tied": False}),
    "toy_training_tied": (toy_training, lambda results: check_toy_training(results, tied=True), {"tied": True}),
    "wrap_broadcast": (wrap_broadcast, check_wrap_broadcast, {}),
    "exact_average": (exact_average, check_exact_average, {}),
    "frozen_and_unused": (frozen_and_unused, check_frozen_and_unused, {}),
    "mixed_dtypes": (mixed_dtypes, check_exact_average, {}),
    "no_sync_accumulate": (no_sync_accumulate, check_no_sync_accumulate, {}),
}


def run_case(name: str, target_spec: str, flavour: str, bucket_size_mb=None, timeout: float = 60.0) -> None:
    """Run spec case ``name`` on two ranks against a target flavour and check it."""
    from conformance.harness import run_on_ranks

    fn, check, kwargs = CASES[name]
    try:
        check(run_on_ranks(fn, WORLD_SIZE, target_spec, flavour, bucket_size_mb, timeout=timeout, **kwargs))
    except Exception as exc:
        if flavour != "bucketed" or bucket_size_mb is not None or classify(exc) is not None:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        raise AssertionError(f"bucket_size_mb=None (one bucket of unbounded size, as the adapter's docstring "
                             f"says): {first}") from exc
