"""Data-parallel training laws: random models and cases, rank-side case functions, checks.

Flavours
    A target offers up to three DDP flavours through the CS336 adapter names:
    ``individual`` (2025 get_ddp_individual_parameters), ``bucketed`` (2025
    get_ddp_bucketed with a bucket size) and ``ddp2026`` (get_ddp).  A flavour whose
    factory is missing or raises NotImplementedError is "not offered".

How a case runs
    The test draws a small description (``TrainingCase``: model shape, world size, per-step
    and per-rank batch splits, optimizer, precision, a seed), sends it to every rank with
    ``conformance.harness.run_on_ranks`` together with the target's spec string, and the
    ranks rebuild model and data from the seed.  Rank r > 0 initialises its model from a
    different seed (and different buffers), so only a wrapper that broadcasts rank 0's
    state can pass.  The ranks return plain tensors; every comparison runs in the test
    process, where the single-process references are computed too.

Loss scaling (why the comparison is exact in law)
    A step's global batch of B rows is split unevenly over ranks (and micro-batches).
    Each rank's loss is ``world_size / B * sum(per-row losses of its rows)``; averaging
    the ranks' gradients then gives the gradient of ``1/B * sum(all per-row losses)``,
    the full-batch mean loss that the single-process reference minimises.  (Per-rank
    *mean* losses would weight the rows of small splits more; they agree only for equal
    splits.)

What "matches a single process" means (the oracle)
    ref64  the single process trained on the whole batch in float64, from rank 0's
           initial values (rounded to float32 first, so it sees the inputs DDP sees);
    eager  the same single-process run in the tested precision (float32, or float32
           parameters under bf16 autocast), on the same device.
    A correct data-parallel step is the eager step up to the order in which per-row
    contributions are added (per-rank partial sums, then the all-reduce) and one
    division by the world size: reorderings that change the rounding, not its size.  So
    the synchronised gradients of every step must pass ``oracle.judge`` against ref64
    with the eager run's error as the yardstick and, as the rounding floor, the
    magnitudes of the terms each gradient element sums (|dY|^T |X| per Linear: a sum
    that cancels is judged against the size of what cancelled, whatever the order).
    In float32 the final parameters must pass too (their own rounding dominates there);
    under bf16 autocast the gradients are the check (see check_matches_single_process).
    Adam and AdamW run with eps=1e-2 so that their update is a smooth function of the
    gradient at rounding scale (with eps -> 0 it is sign-like, and rounding noise on a
    gradient element near zero turns into an lr-sized jump that no precision argument
    bounds).

Laws (the checks below; ``properties/test_ddp.py`` runs them under Hypothesis)
    replicas   right after wrapping every rank holds rank 0's parameters and buffers;
               after every synced step all ranks hold bit-identical gradients (None in the
               same places) and, at the end, bit-identical parameters and buffers;
    matches    the gradients of every step (None exactly where the single process has
               None) and the final parameters match the single-process run on the whole
               batch (oracle);
    no_sync    m micro-batches under ``no_sync()`` then one synced backward equal one step
               on the concatenated batch, nothing is reduced inside ``no_sync()``, and a
               plain step after it is still right (bookkeeping not stale);
    layout     ``.buckets`` partitions exactly the parameters that require grad (tied ones
               once), in reverse registration order, each bucket at most the cap unless
               it holds a single larger parameter;
    overlap    at least one gradient collective is issued during the backward pass while
               gradients are still being produced (observed: ``torch.distributed``'s
               reducing collectives are wrapped in the rank process, and hooks registered
               before wrapping log each gradient as it becomes ready).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from hypothesis import note
from hypothesis import strategies as st

from conformance import oracle
from conformance.ddp_flavours import FLAVOURS, FlavourAPI, flavour_api, not_offered_result, raise_if_not_offered
from conformance.harness import available_world_sizes, pinned_world_size, run_on_ranks
from conformance.target import NotOffered, load_target

__all__ = ["FLAVOURS", "FlavourAPI", "flavour_api", "LAWS"]
MAX_CPU_WORLD = 4
CASE_TIMEOUT_S = 60.0
MIB = 1 << 20


# =======================================================================================
# Observing collectives (installed in every process that imports this module)
# =======================================================================================

SPIED_COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor")


class EventLog:
    """Events of one step, in the order they happen; records only while started."""

    def __init__(self):
        self.events: list[tuple] | None = None

    def start(self) -> None:
        self.events = []

    def stop(self) -> list[tuple]:
        events, self.events = self.events or [], None
        return events

    def record(self, *event) -> None:
        if self.events is not None:
            self.events.append(event)


LOG = EventLog()


def install_collective_spy() -> None:
    """Wrap torch.distributed's reducing collectives so that each call is logged.

    Both ``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X`` are
    replaced, so code that calls ``dist.all_reduce`` at run time (and code imported later
    with ``from torch.distributed import all_reduce``) is seen.  Idempotent.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in SPIED_COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_ddp_law_spy", False):
            continue

        @functools.wraps(original)
        def spy(*args, _original=original, _name=name, **kwargs):
            LOG.record("collective", _name)
            return _original(*args, **kwargs)

        spy._ddp_law_spy = True
        setattr(c10d, name, spy)
        if getattr(dist, name, None) is original:
            setattr(dist, name, spy)


install_collective_spy()


# =======================================================================================
# Random models
# =======================================================================================


@dataclass(frozen=True)
class ModelSpec:
    d_in: int
    widths: tuple[int, ...]  # hidden widths; depth = len(widths)
    d_out: int
    bias: bool = True
    tied: bool = False  # a pair of square layers sharing one weight (two names, one tensor)
    frozen: bool = False  # a square layer with requires_grad=False, used in forward
    branch: bool = False  # a square layer applied only to the rows a per-row mask selects


class RandomMLP(nn.Module):
    """x -> tanh layers -> [tied pair] -> [+ frozen] -> [+ branch on masked rows] -> head * out_scale.

    tanh, not ReLU: no kinks, so rounding differences never flip a derivative.  The
    branch is not called at all when no row of the local batch selects it, so a rank (or
    every rank) can get no gradient for it; masked-out rows contribute exact zeros.
    ``out_scale`` is a buffer the forward uses (a wrapper must broadcast it).
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        dims = (spec.d_in,) + tuple(spec.widths)
        self.body = nn.ModuleList(nn.Linear(a, b, bias=spec.bias) for a, b in zip(dims, dims[1:]))
        w = dims[-1]
        if spec.tied:
            self.tied_a = nn.Linear(w, w, bias=spec.bias)
            self.tied_b = nn.Linear(w, w, bias=spec.bias)
            self.tied_b.weight = self.tied_a.weight
        if spec.frozen:
            self.frozen = nn.Linear(w, w, bias=spec.bias).requires_grad_(False)
        if spec.branch:
            self.branch = nn.Linear(w, w, bias=spec.bias)
        self.head = nn.Linear(w, spec.d_out, bias=spec.bias)
        self.register_buffer("out_scale", torch.ones(spec.d_out))

    def forward(self, x, branch_rows=None):
        h = x
        for layer in self.body:
            h = torch.tanh(layer(h))
        if self.spec.tied:
            h = torch.tanh(self.tied_b(torch.tanh(self.tied_a(h))))
        if self.spec.frozen:
            h = h + torch.tanh(self.frozen(h))
        if self.spec.branch and branch_rows is not None and bool(branch_rows.any()):
            h = h + torch.tanh(self.branch(h)) * branch_rows[:, None].to(h.dtype)
        return self.head(h) * self.out_scale


@torch.no_grad()
def build_model(spec: ModelSpec, seed: int) -> RandomMLP:
    """A float32 RandomMLP whose parameters and buffer come from ``seed`` (drawn in float64)."""
    model = RandomMLP(spec)
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        fan_in = p.shape[-1] if p.dim() > 1 else 10
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(fan_in))
    model.out_scale.copy_(1.0 + 0.25 * torch.randn(spec.d_out, generator=g, dtype=torch.float64))
    return model


def rank_seed(seed: int, rank: int) -> int:
    """Rank 0 uses the case's seed; the others start somewhere else on purpose."""
    return seed if rank == 0 else seed + 1_000_003 * rank


def unique_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def synced_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


# =======================================================================================
# Cases
# =======================================================================================


@dataclass(frozen=True)
class StepPlan:
    micro_splits: tuple[tuple[int, ...], ...]  # per micro-batch: rows per rank
    branch_p: float = 0.0  # probability that a row selects the branch

    @property
    def rows(self) -> int:
        return sum(sum(s) for s in self.micro_splits)


@dataclass(frozen=True)
class TrainingCase:
    model: ModelSpec
    world_size: int
    steps: tuple[StepPlan, ...]
    optimizer: str = "sgd"  # sgd | adam | adamw
    lr: float = 0.05
    precision: str = "fp32"  # fp32 | bf16 (float32 parameters under bf16 autocast)
    bucket_size_mb: float | None = None  # only the bucketed flavour uses it
    seed: int = 0


OPTIMIZERS = ("sgd", "adam", "adamw")
PRECISIONS = ("fp32", "bf16")


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=1e-2)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, eps=1e-2, weight_decay=0.1)
    raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")


def step_data(case: TrainingCase, step: int):
    """The step's global batch (x, y, branch_rows), float32 values, from the case's seed."""
    plan = case.steps[step]
    g = torch.Generator().manual_seed(case.seed * 7919 + step)
    b = plan.rows
    x = torch.randn(b, case.model.d_in, generator=g, dtype=torch.float64).float()
    y = torch.randn(b, case.model.d_out, generator=g, dtype=torch.float64).float()
    rows = torch.rand(b, generator=g, dtype=torch.float64) < plan.branch_p
    return x, y, rows


def local_rows(plan: StepPlan, micro: int, rank: int) -> slice:
    """Rows of the global batch that rank ``rank`` gets in micro-batch ``micro``.

    The global batch is laid out micro-batch by micro-batch, rank by rank."""
    start = sum(sum(s) for s in plan.micro_splits[:micro]) + sum(plan.micro_splits[micro][:rank])
    return slice(start, start + plan.micro_splits[micro][rank])


def autocast_for(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def row_loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum over rows of 0.5 * ||out_row - y_row||^2, in float32 or wider."""
    out = out if out.dtype == torch.float64 else out.float()
    return 0.5 * (out - y.to(out.dtype)).pow(2).sum()


_not_offered = not_offered_result  # flavours live in conformance.ddp_flavours


# =======================================================================================
# Rank-side case functions (run inside the harness's rank processes)
# =======================================================================================


def _observe_gradients(model: nn.Module) -> None:
    """Log each gradient as it becomes final; registered BEFORE the wrapper's own hooks,
    so for one parameter our event precedes anything the wrapper launches from it."""
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda _p, _name=name: LOG.record("grad", _name))


def _snapshot(model: nn.Module) -> dict:
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
    }


def _grads(model: nn.Module) -> dict:
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def train_on_rank(ctx, target_spec: str, flavour: str, case: TrainingCase) -> dict:
    """Wrap, then run the case's steps with the flavour's call sequence:

        on_train_batch_start -> [no_sync: forward, backward]* -> forward -> backward
        -> on_after_backward -> (read gradients) -> optimizer.step
    """
    install_collective_spy()
    try:
        return _train_steps(ctx, flavour_api(load_target(target_spec), flavour), case)
    except NotOffered as exc:  # a factory or hook raised NotImplementedError (on every rank)
        LOG.stop()
        return _not_offered(exc)


def _train_steps(ctx, api: FlavourAPI, case: TrainingCase) -> dict:
    flavour = api.name
    torch.manual_seed(case.seed)
    model = build_model(case.model, rank_seed(case.seed, ctx.rank)).to(ctx.device)
    _observe_gradients(model)
    wrapped = api.wrap(model, case.bucket_size_mb)
    needs_no_sync = any(len(p.micro_splits) > 1 for p in case.steps)
    if needs_no_sync and not callable(getattr(wrapped, "no_sync", None)):
        return _not_offered(NotOffered(f"the {flavour} wrapper ({type(wrapped).__name__}) has no no_sync()"))
    after_wrap = _snapshot(model)
    optimizer = make_optimizer(case.optimizer, model.parameters(), case.lr)
    grads, events, before = [], [], []
    for s, plan in enumerate(case.steps):
        x, y, rows = (t.to(ctx.device) for t in step_data(case, s))
        scale = case.world_size / plan.rows
        optimizer.zero_grad(set_to_none=True)
        before.append({n: p.detach().clone() for n, p in model.named_parameters()})
        LOG.start()
        api.start_batch(wrapped, optimizer)
        last = len(plan.micro_splits) - 1
        for m in range(len(plan.micro_splits)):
            mine = local_rows(plan, m, ctx.rank)
            with (wrapped.no_sync() if m < last else contextlib.nullcontext()):
                with autocast_for(case.precision, ctx.device):
                    out = wrapped(x[mine], rows[mine])
                loss = scale * row_loss_sum(out, y[mine])
                LOG.record("backward-start", m, m == last)
                loss.backward()
                LOG.record("backward-end", m, m == last)
        api.after_backward(wrapped, optimizer)
        LOG.record("synchronised")
        events.append(LOG.stop())
        grads.append(_grads(model))
        optimizer.step()
    return {"after_wrap": after_wrap, "before": before, "grads": grads, "final": _snapshot(model), "events": events}


def probe_on_rank(ctx, target_spec: str, flavour: str) -> dict:
    """Is the flavour offered, and does its wrapper have no_sync() and .buckets?"""
    try:
        api = flavour_api(load_target(target_spec), flavour)
        wrapped = api.wrap(build_model(ModelSpec(2, (3,), 2), 0).to(ctx.device), 1e-6)
    except NotOffered as exc:
        return _not_offered(exc)
    return {"no_sync": callable(getattr(wrapped, "no_sync", None)), "buckets": getattr(wrapped, "buckets", None) is not None}


def layout_on_rank(ctx, target_spec: str, flavour: str, spec: ModelSpec, bucket_size_mb, seed: int) -> dict:
    """Wrap a model and report the wrapper's ``.buckets`` next to the module's parameters."""
    try:
        api = flavour_api(load_target(target_spec), flavour)
        model = build_model(spec, seed).to(ctx.device)
        wrapped = api.wrap(model, bucket_size_mb)
    except NotOffered as exc:
        return _not_offered(exc)
    buckets = getattr(wrapped, "buckets", None)
    if buckets is None:
        return _not_offered(NotOffered(f"the {flavour} wrapper ({type(wrapped).__name__}) does not expose .buckets"))
    params = [(n, p.requires_grad, p.numel() * p.element_size()) for n, p in model.named_parameters()]
    try:
        layout = readable_layout(buckets, model)
    except TypeError as exc:  # CS336 defines no bucket introspection: another shape is not a wrong one
        return _not_offered(NotOffered(f"bucket layout: the {flavour} wrapper's .buckets {exc}"))
    return {"buckets": layout, "params": params}


def readable_layout(buckets, model) -> list[list]:
    """``.buckets`` as lists of parameter names or indices; a parameter object becomes its name.

    TypeError when the buckets cannot be read that way (a bucket that is not iterable, an
    entry that is neither a name, an index nor one of the module's parameters).
    """
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    layout = []
    for bucket in buckets:
        try:
            entries = list(bucket)
        except TypeError:
            raise TypeError(f"holds {type(bucket).__name__} objects, not lists of parameter names or parameters") from None
        for i, e in enumerate(entries):
            if isinstance(e, torch.Tensor):
                if id(e) not in names:
                    raise TypeError(f"holds a tensor of shape {tuple(e.shape)} that is not one of the module's parameters")
                entries[i] = names[id(e)]
            elif not isinstance(e, (str, int)):
                raise TypeError(f"holds {type(e).__name__} entries, not parameter names, indices or parameters")
        layout.append(entries)
    return layout


# =======================================================================================
# Single-process references (test side)
# =======================================================================================


def reference_run(case: TrainingCase, mode: str, device: torch.device) -> dict:
    """One process, whole batch per step, from rank 0's initial values: the trajectory.

    mode ``"ref64"``: float64, no autocast; ``"eager"``: the case's precision."""
    model = _reference_model(case, mode, device)
    optimizer = make_optimizer(case.optimizer, model.parameters(), case.lr)
    for s in range(len(case.steps)):
        optimizer.zero_grad(set_to_none=True)
        _full_batch_backward(case, s, model, mode, device)
        optimizer.step()
    return {"final": _snapshot(model)}


def reference_gradients(case: TrainingCase, step: int, params: dict, mode: str, device: torch.device) -> dict:
    """The single-process gradient of step ``step`` on the whole batch, at ``params``
    (the replicas' parameters before that step), so that no step inherits the rounding
    drift of the steps before it.  ``"ref64"`` also returns the summands' magnitudes."""
    model = _reference_model(case, mode, device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    if mode == "ref64":
        with _LinearRecorder(model) as recorder:
            _full_batch_backward(case, step, model, mode, device)
        return {"grads": _grads(model), "magnitudes": recorder.magnitudes()}
    _full_batch_backward(case, step, model, mode, device)
    return {"grads": _grads(model)}


def _reference_model(case: TrainingCase, mode: str, device: torch.device) -> nn.Module:
    model = build_model(case.model, case.seed).to(device)
    return model.double() if mode == "ref64" else model


def _full_batch_backward(case: TrainingCase, step: int, model: nn.Module, mode: str, device: torch.device) -> None:
    x, y, rows = step_data(case, step)
    if mode == "ref64":
        x, y = x.double(), y.double()
    x, y, rows = x.to(device), y.to(device), rows.to(device)
    with autocast_for("fp32" if mode == "ref64" else case.precision, device):
        out = model(x, rows)
    (row_loss_sum(out, y) / case.steps[step].rows).backward()


class _LinearRecorder:
    """Records |input| and |output gradient| of every nn.Linear during one forward/backward.

    ``magnitudes()`` then gives, per parameter, the sum of the magnitudes of the terms
    its gradient adds up: |dY|^T |X| for a weight, sum over rows of |dY| for a bias
    (both modules' shares for a tied weight).  A gradient element that cancels to
    nearly zero is judged against the size of what cancelled, as the oracle's floor
    intends; any summation order (per-rank partial sums, the all-reduce) has rounding
    error of that size.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.records: list = []
        self.handles: list = []

    def __enter__(self):
        for module in self.model.modules():
            if isinstance(module, nn.Linear):
                self.handles.append(module.register_forward_hook(self._on_forward))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False

    def _on_forward(self, module, inputs, output):
        x = inputs[0].detach().abs()
        if output.requires_grad:
            output.register_hook(lambda g, m=module, x=x: self.records.append((m, x, g.detach().abs())))

    def magnitudes(self) -> dict:
        by_id = {id(p): torch.zeros_like(p) for p in self.model.parameters()}
        for module, x, g in self.records:
            g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
            by_id[id(module.weight)] += g2.T @ x2
            if module.bias is not None:
                by_id[id(module.bias)] += g2.sum(0)
        return {n: by_id[id(p)] for n, p in self.model.named_parameters()}


# =======================================================================================
# Checks (test side)
# =======================================================================================


def _assert_same_pattern(what: str, got: dict, expected: dict) -> None:
    missing = sorted(n for n in expected if (expected[n] is None) != (got.get(n) is None))
    if missing:
        detail = ", ".join(f"{n}: {'None' if got.get(n) is None else 'a tensor'} (expected {'None' if expected[n] is None else 'a tensor'})" for n in missing)
        raise AssertionError(f"{what}: .grad is None in the wrong places: {detail}")


def check_replicas(case: TrainingCase, results: list[dict]) -> None:
    """Broadcast at wrap, and bit-identical replicas after every synced step."""
    initial = build_model(case.model, case.seed)
    for r, res in enumerate(results):
        for kind in ("params", "buffers"):
            for name, value in res["after_wrap"][kind].items():
                expected = dict(initial.named_parameters() if kind == "params" else initial.named_buffers())[name]
                oracle.assert_bitwise_equal(f"rank {r} {kind[:-1]} {name} right after wrapping (rank 0's initial value)", value, expected.detach())
    zero = results[0]
    for r, res in enumerate(results[1:], start=1):
        for s, (g0, gr) in enumerate(zip(zero["grads"], res["grads"])):
            _assert_same_pattern(f"step {s}, rank {r} vs rank 0", gr, g0)
            for name, value in g0.items():
                if value is not None:
                    oracle.assert_bitwise_equal(f"step {s}: gradient of {name} on rank {r} vs rank 0", gr[name], value)
        for kind in ("params", "buffers"):
            for name, value in zero["final"][kind].items():
                oracle.assert_bitwise_equal(f"after {len(case.steps)} steps: {kind[:-1]} {name} on rank {r} vs rank 0", res["final"][kind][name], value)


def check_matches_single_process(case: TrainingCase, result: dict, device: torch.device) -> None:
    """Gradients of every step, and in float32 the final parameters, against the single
    process on the whole batch (oracle).

    Each step's gradient is compared with the single-process gradient at the replicas'
    own parameters before that step (``reference_gradients``): a one-step law, free of
    the rounding drift of earlier steps.  The final parameters are compared along the
    whole trajectory (``reference_run``).  Gradients are judged in the compute precision with the magnitudes of their summands
    (``_LinearRecorder``).  Final parameters are judged in float32 only: there a
    parameter's own rounding dominates what the gradients' rounding moves it by.  Under
    bf16 autocast the optimizer turns bf16-sized gradient noise into parameter noise
    that no float32 yardstick bounds (Adam divides by sqrt(v)); there the gradients of
    every step, which the optimizer's own arithmetic maps to the parameters, are the
    check, and the parameters' bit-identity across replicas is checked exactly.
    """
    grad_dtype = torch.bfloat16 if case.precision == "bf16" else torch.float32
    for s in range(len(case.steps)):
        ref64 = reference_gradients(case, s, result["before"][s], "ref64", device)
        eager = reference_gradients(case, s, result["before"][s], "eager", device)
        _assert_same_pattern(f"step {s} (against the single process on the whole batch)", result["grads"][s], ref64["grads"])
        for name, ref in ref64["grads"].items():
            if ref is None:
                continue
            verdict = oracle.judge(
                f"step {s}: averaged gradient of {name}",
                result["grads"][s][name],
                ref,
                eager["grads"][name],
                grad_dtype,
                magnitude=ref64["magnitudes"][name],
            )
            if not verdict.ok:
                raise AssertionError(verdict.message())
    if case.precision != "fp32":
        return
    ref64, eager = reference_run(case, "ref64", device), reference_run(case, "eager", device)
    for name, ref in ref64["final"]["params"].items():
        verdict = oracle.judge(f"parameter {name} after {len(case.steps)} steps", result["final"]["params"][name], ref, eager["final"]["params"][name], torch.float32)
        if not verdict.ok:
            raise AssertionError(verdict.message())


def check_no_sync_silent(results: list[dict]) -> None:
    """No reducing collective between the start and end of a backward under no_sync."""
    for r, res in enumerate(results):
        for s, events in enumerate(res["events"]):
            inside = False
            for event in events:
                if event[0] == "backward-start" and not event[2]:
                    inside, micro = True, event[1]
                elif event[0] == "backward-end":
                    inside = False
                elif event[0] == "collective" and inside:
                    raise AssertionError(f"rank {r}, step {s}: {event[1]} issued during the backward of micro-batch {micro} under no_sync()")


def check_overlap(results: list[dict]) -> None:
    """In the last step's synced backward, a collective is issued before the last gradient is ready."""
    for r, res in enumerate(results):
        events = res["events"][-1]
        start = max(i for i, e in enumerate(events) if e[0] == "backward-start" and e[2])
        end = next(i for i, e in enumerate(events) if e[0] == "backward-end" and i > start)
        window = events[start + 1 : end]
        first = next((i for i, e in enumerate(window) if e[0] == "collective"), None)
        grads = [e[1] for e in window if e[0] == "grad"]
        if first is None:
            raise AssertionError(
                f"rank {r}: no gradient collective was issued during the backward pass "
                f"({len(grads)} gradients became ready; the first collective came after backward returned)"
            )
        later = [e[1] for e in window[first:] if e[0] == "grad"]
        if not later:
            raise AssertionError(
                f"rank {r}: the first collective was issued only after the last gradient was ready "
                f"(order of gradients: {grads}); nothing overlapped the backward computation"
            )


def normalise_bucket_entry(entry, names: list[str]) -> str:
    if isinstance(entry, str):
        return entry[len("module.") :] if entry.startswith("module.") and entry[len("module.") :] in names else entry
    if isinstance(entry, int) and not isinstance(entry, bool) and 0 <= entry < len(names):
        return names[entry]
    raise AssertionError(f".buckets entries must be parameter names or indices into module.parameters(); got {entry!r}")


def check_layout(result: dict, bucket_size_mb) -> None:
    names = [n for n, _, _ in result["params"]]
    nbytes = {n: b for n, _, b in result["params"]}
    buckets = [[normalise_bucket_entry(e, names) for e in b] for b in result["buckets"]]
    note(f"buckets: {buckets}")
    if any(len(b) == 0 for b in buckets):
        raise AssertionError(f"empty bucket in {buckets}")
    flat = [n for b in buckets for n in b]
    expected = [n for n, requires_grad, _ in result["params"] if requires_grad][::-1]
    if sorted(flat) != sorted(expected) or len(flat) != len(set(flat)):
        extra = sorted(set(flat) - set(expected))
        dup = sorted({n for n in flat if flat.count(n) > 1})
        missing = sorted(set(expected) - set(flat))
        raise AssertionError(
            "buckets do not partition the parameters that require grad: "
            f"missing {missing}, not requiring grad or unknown {extra}, more than once {dup}"
        )
    if flat != expected:
        raise AssertionError(f"buckets are not in reverse registration order: got {flat}, expected {expected}")
    if bucket_size_mb is not None:
        cap = bucket_size_mb * MIB
        for i, b in enumerate(buckets):
            size = sum(nbytes[n] for n in b)
            if len(b) > 1 and size > cap:
                raise AssertionError(f"bucket {i} {b} holds {size} bytes > cap {cap:.0f} bytes ({bucket_size_mb} MiB)")


# =======================================================================================
# Strategies
# =======================================================================================


def max_world_size() -> int:
    pinned = pinned_world_size()
    return pinned if pinned is not None else min(MAX_CPU_WORLD, max(available_world_sizes()))


def model_specs(*, tied=st.booleans(), frozen=st.booleans(), branch=st.booleans(), min_depth=1, max_depth=3):
    return st.builds(
        ModelSpec,
        d_in=st.integers(1, 6),
        widths=st.lists(st.integers(1, 8), min_size=min_depth, max_size=max_depth).map(tuple),
        d_out=st.integers(1, 4),
        bias=st.booleans(),
        tied=tied,
        frozen=frozen,
        branch=branch,
    )


def rank_splits(world_size: int, max_rows: int = 5):
    """Rows per rank for one micro-batch: uneven, at least one each."""
    return st.lists(st.integers(1, max_rows), min_size=world_size, max_size=world_size).map(tuple)


def step_plans(world_size: int, micro_batches=st.just(1)):
    branch_p = st.sampled_from((0.0, 0.3, 1.0))  # unused by all, by some ranks, used by all
    return micro_batches.flatmap(
        lambda m: st.builds(StepPlan, micro_splits=st.lists(rank_splits(world_size), min_size=m, max_size=m).map(tuple), branch_p=branch_p)
    )


def bucket_sizes_mb():
    """From one parameter per bucket (1 byte) through mixed buckets to unbounded."""
    return st.one_of(st.just(1e-6), st.floats(1e-5, 2e-3), st.just(1e3))


def world_sizes(min_world: int = 1):
    top = max_world_size()
    if pinned_world_size() is not None:
        return st.just(top)
    return st.integers(min(min_world, top), top)


@st.composite
def training_cases(draw, *, first_step_micro_batches=st.just(1), steps=st.integers(1, 3), model=None, min_world=1):
    world = draw(world_sizes(min_world))
    n_steps = draw(steps)
    plans = [draw(step_plans(world, first_step_micro_batches))]
    plans += [draw(step_plans(world)) for _ in range(n_steps - 1)]
    case = TrainingCase(
        model=draw(model if model is not None else model_specs()),
        world_size=world,
        steps=tuple(plans),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        lr=draw(st.sampled_from((0.05, 0.01))),
        precision=draw(st.sampled_from(PRECISIONS)),
        bucket_size_mb=draw(bucket_sizes_mb()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    note(repr(case))
    return case


def no_sync_cases(min_world: int = 1):
    """m >= 2 micro-batches in the first step (m-1 under no_sync), then a plain step."""
    return training_cases(first_step_micro_batches=st.integers(2, 3), steps=st.just(2), min_world=min_world)


def overlap_cases(min_world: int = 2):
    """A deep model without an optional branch, two steps (torch DDP rebuilds its buckets
    after the first), one parameter per bucket, at least two ranks."""
    return training_cases(
        steps=st.just(2),
        model=model_specs(branch=st.just(False), min_depth=3, max_depth=4),
        min_world=max(2, min_world),
    ).map(lambda c: TrainingCase(**{**c.__dict__, "bucket_size_mb": 1e-6}))


@st.composite
def layout_cases(draw, min_world: int = 1):
    spec = draw(model_specs())
    sizes = [p.numel() * p.element_size() for p in RandomMLP(spec).parameters()]
    cap_bytes = draw(st.one_of(st.just(1), st.sampled_from(sizes), st.integers(1, sum(sizes) + 1)))
    bucket_size_mb = cap_bytes / MIB
    world = draw(st.integers(min(min_world, 2, max_world_size()), min(2, max_world_size())))
    seed = draw(st.integers(0, 2**31 - 1))
    note(f"model={spec}, bucket_size_mb={bucket_size_mb!r} ({cap_bytes} bytes), world_size={world}")
    return spec, bucket_size_mb, world, seed


# =======================================================================================
# Laws: run a case on the ranks, then check (shared by the tests and the mutant runner)
# =======================================================================================


def _device() -> torch.device:
    from conformance.harness import resolve_device

    return torch.device(resolve_device())


def _train(target_spec: str, flavour: str, case: TrainingCase) -> list[dict]:
    results = run_on_ranks(train_on_rank, case.world_size, target_spec, flavour, case, timeout=CASE_TIMEOUT_S)
    raise_if_not_offered(results)
    return results


def law_replicas_identical_and_match_single_process(target_spec: str, flavour: str, case: TrainingCase) -> None:
    results = _train(target_spec, flavour, case)
    check_replicas(case, results)
    check_matches_single_process(case, results[0], _device())


def law_no_sync_accumulation_equals_concatenated_batch(target_spec: str, flavour: str, case: TrainingCase) -> None:
    results = _train(target_spec, flavour, case)
    check_no_sync_silent(results)
    check_replicas(case, results)
    check_matches_single_process(case, results[0], _device())


def law_collective_overlaps_backward(target_spec: str, flavour: str, case: TrainingCase) -> None:
    results = _train(target_spec, flavour, case)
    check_overlap(results)


def law_buckets_partition_in_reverse_order(target_spec: str, flavour: str, layout_case) -> None:
    spec, bucket_size_mb, world, seed = layout_case
    results = run_on_ranks(layout_on_rank, world, target_spec, flavour, spec, bucket_size_mb, seed, timeout=CASE_TIMEOUT_S)
    raise_if_not_offered(results)
    for res in results:
        check_layout(res, bucket_size_mb if flavour == "bucketed" else None)
    if any(res["buckets"] != results[0]["buckets"] for res in results):
        raise AssertionError(f"ranks built different bucket layouts: {[res['buckets'] for res in results]}")


_PROBES: dict[tuple[str, str], dict] = {}


def probe(target_spec: str, flavour: str) -> dict:
    """What the flavour offers (cached per process); NotOffered if its factory is missing."""
    key = (target_spec, flavour)
    if key not in _PROBES:
        _PROBES[key] = run_on_ranks(probe_on_rank, 1, target_spec, flavour, timeout=CASE_TIMEOUT_S)[0]
    raise_if_not_offered([_PROBES[key]])
    return _PROBES[key]


def not_applicable(law: str, target_spec: str, flavour: str) -> str | None:
    """Why a law does not apply to a flavour (None: it applies).  NotOffered if the
    flavour itself is not offered."""
    offers = probe(target_spec, flavour)
    if law == "no_sync" and not offers["no_sync"]:
        return f"the {flavour} wrapper has no no_sync()"
    if law == "overlap" and flavour == "ddp2026":
        return "get_ddp(module) takes no bucket size, so a small model may rightly be one bucket: overlap is checked on the 2025 flavours"
    if law == "layout" and flavour == "individual":
        return "the individual flavour has no buckets"
    if law == "layout" and not offers["buckets"]:
        return f"the {flavour} wrapper does not expose .buckets"
    return None


LAWS = {
    "replicas_match": (law_replicas_identical_and_match_single_process, training_cases),
    "no_sync": (law_no_sync_accumulation_equals_concatenated_batch, no_sync_cases),
    "overlap": (law_collective_overlaps_backward, overlap_cases),
    "layout": (law_buckets_partition_in_reverse_order, layout_cases),
}
