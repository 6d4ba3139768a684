"""Single-process references (test side): the whole batch in float64 and in the tested precision."""

from __future__ import annotations

import torch
import torch.nn as nn

from .model import build_model
from .cases import TrainingCase, autocast_for, local_rows, make_optimizer, row_loss_sum, step_data
from .rank import _grads, _snapshot


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


def split_eager_gradients(case: TrainingCase, step: int, params: dict, device: torch.device) -> dict:
    """The averaged gradient computed the ranks' way in the tested precision: each rank's
    rows (micro-batch by micro-batch, its loss scaled by W / B) through its own backward,
    the ranks' gradients summed in rank order, divided by W.  A second sample of the
    rounding error a correct DDP makes: splitting the batch reassociates every
    weight-gradient sum, and the whole-batch eager error alone (one sample, a few
    elements) can sit below it (a correct DDP missed 4 x that by 1.2x at W = 3)."""
    model = _reference_model(case, "eager", device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    x, y, rows = (t.to(device) for t in step_data(case, step))
    plan = case.steps[step]
    scale = case.world_size / plan.rows
    total: dict = {}
    for r in range(case.world_size):
        model.zero_grad(set_to_none=True)
        for m in range(len(plan.micro_splits)):
            mine = local_rows(plan, m, r)
            with autocast_for(case.precision, device):
                out = model(x[mine], rows[mine])
            (scale * row_loss_sum(out, y[mine])).backward()
        for name, g in _grads(model).items():
            if g is not None:
                total[name] = g.clone() if total.get(name) is None else total[name] + g
    return {"grads": {name: g / case.world_size for name, g in total.items()}}


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
