"""The DDP flavours a target can offer, and how each is wrapped and driven.

    individual  2025: get_ddp_individual_parameters(module),
                ddp_individual_parameters_on_after_backward(model, optimizer)
    bucketed    2025: get_ddp_bucketed(module, bucket_size_mb),
                ddp_bucketed_on_after_backward(model, optimizer),
                ddp_bucketed_on_train_batch_start(model, optimizer)  (optional)
    ddp2026     2026: get_ddp(module), ddp_on_after_backward(model, optimizer)

A training step drives them in the adapter call sequence

    on_train_batch_start -> forward -> backward -> on_after_backward -> optimizer.step

A factory that is missing or raises NotImplementedError makes the flavour "not offered"
(``conformance.verdicts.NotOffered``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FLAVOURS = ("individual", "bucketed", "ddp2026")


@dataclass
class FlavourAPI:
    name: str
    wrap: Callable  # (module, bucket_size_mb) -> wrapped module; only "bucketed" uses the size
    after_backward: Callable  # (model, optimizer) -> None
    batch_start: Callable | None = None  # (model, optimizer) -> None

    def start_batch(self, model, optimizer) -> None:
        if self.batch_start is not None:
            self.batch_start(model, optimizer)


def flavour_api(target, flavour: str) -> FlavourAPI:
    """The entry points of one flavour of ``target`` (a ``conformance.target.Target``)."""
    if flavour == "individual":
        make = target.factory("get_ddp_individual_parameters")
        return FlavourAPI(flavour, lambda m, b: make(m), target.factory("ddp_individual_parameters_on_after_backward"))
    if flavour == "bucketed":
        make = target.factory("get_ddp_bucketed")
        start = target.factory("ddp_bucketed_on_train_batch_start") if target.has("ddp_bucketed_on_train_batch_start") else None
        return FlavourAPI(flavour, lambda m, b: make(m, b), target.factory("ddp_bucketed_on_after_backward"), start)
    if flavour == "ddp2026":
        make = target.factory("get_ddp")
        return FlavourAPI(flavour, lambda m, b: make(m), target.factory("ddp_on_after_backward"))
    raise ValueError(f"unknown DDP flavour {flavour!r}; expected one of {FLAVOURS}")
