"""The data-parallel laws: run a case on the ranks, then check (shared by the tests and the mutant runner)."""

from __future__ import annotations

import torch

from conformance.harness import run_on_ranks
from conformance.lawbook import API, Law, by_name
from conformance.verdicts import NotApplicable, NotOffered, Verdict

from .spy import CASE_TIMEOUT_S
from .cases import TrainingCase
from .rank import layout_on_rank, probe_on_rank, train_on_rank
from .checks import check_layout, check_matches_single_process, check_no_sync_silent, check_overlap, check_replicas
from .strategies import layout_cases, no_sync_cases, overlap_cases, training_cases


def _device() -> torch.device:
    from conformance.harness import resolve_device

    return torch.device(resolve_device())


def _train(target_spec: str, flavour: str, case: TrainingCase) -> list[dict]:
    return run_on_ranks(train_on_rank, case.world_size, target_spec, flavour, case, timeout=CASE_TIMEOUT_S)


def law_replicas_identical_and_match_single_process(target_spec: str, flavour: str, case: TrainingCase) -> None:
    """Extra "random models and batch splits": broadcast at wrap, bit-identical replicas
    and the single-process result (oracle) on random models, 1 to 4 ranks, uneven splits.
    The contract's toy case (``spec.check_toy_training``) says where each comes from; at
    three or more ranks, ranks that each summed in their own order could differ by a
    rounding, which torch's DDP contract (the same averaged gradient on every process)
    excludes and an all-reduce never does.  Counts nothing."""
    results = _train(target_spec, flavour, case)
    check_replicas(case, results)
    check_matches_single_process(case, results[0], _device())


def law_no_sync_accumulation_equals_concatenated_batch(target_spec: str, flavour: str, case: TrainingCase) -> None:
    """Extra "no_sync accumulation": torch's DDP no_sync() contract (no reduction inside
    it, the next synced backward reduces the accumulated gradients); the course's
    tests never call no_sync()."""
    results = _train(target_spec, flavour, case)
    check_no_sync_silent(results)
    check_replicas(case, results)
    check_matches_single_process(case, results[0], _device())


def law_collective_overlaps_backward(target_spec: str, flavour: str, case: TrainingCase) -> None:
    """Extra "communication overlaps backward": the 2025 handout asks the individual and
    bucketed wrappers to overlap communication with backward, which the course's tests
    cannot observe.  Bounded from the user's side: at least one gradient collective
    starts before the last gradient is ready; their number and order are not checked."""
    results = _train(target_spec, flavour, case)
    check_overlap(results)


def law_buckets_partition_in_reverse_order(target_spec: str, flavour: str, layout_case) -> None:
    """Extra "bucket layout", for wrappers that expose ``.buckets`` (the course defines no
    bucket introspection): a partition of the trainable parameters within the cap (the
    handout's bucket_size_mb), in reverse registration order, as torch's DDP builds its
    buckets.  No course test fixes the order; a wrapper that packs in forward order
    conforms at the contract tier and misses only this extra."""
    spec, bucket_size_mb, world, seed = layout_case
    results = run_on_ranks(layout_on_rank, world, target_spec, flavour, spec, bucket_size_mb, seed, timeout=CASE_TIMEOUT_S)
    for res in results:
        check_layout(res, bucket_size_mb if flavour == "bucketed" else None)
    if any(res["buckets"] != results[0]["buckets"] for res in results):
        raise AssertionError(f"ranks built different bucket layouts: {[res['buckets'] for res in results]}")


_PROBES: dict[tuple[str, str], dict] = {}


def probe(target_spec: str, flavour: str) -> dict:
    """What the flavour offers (cached per process); NotOffered if its factory is missing."""
    key = (target_spec, flavour)
    if key not in _PROBES:
        try:
            _PROBES[key] = run_on_ranks(probe_on_rank, 1, target_spec, flavour, timeout=CASE_TIMEOUT_S)[0]
        except NotOffered as exc:
            _PROBES[key] = exc
    if isinstance(_PROBES[key], NotOffered):
        raise _PROBES[key]
    return _PROBES[key]


def not_applicable(law: str, target_spec: str, flavour: str) -> Verdict | None:
    """Why a law does not run on a flavour (None: it runs): NotOffered where the wrapper
    lacks what the law drives (no_sync(), .buckets), NotApplicable where the flavour's
    design rightly has no such thing.  NotOffered if the flavour itself is not offered."""
    offers = probe(target_spec, flavour)
    if law == "no_sync" and not offers["no_sync"]:
        return NotOffered(f"the {flavour} wrapper has no no_sync()")
    if law == "overlap" and flavour == "ddp2026":
        return NotApplicable("get_ddp(module) takes no bucket size, so a small model may rightly be one bucket "
                             "reduced after backward: overlap is checked on the 2025 flavours")
    if law == "layout" and flavour == "individual":
        return NotApplicable("the individual flavour has no buckets")
    if law == "layout" and not offers["buckets"]:
        return NotOffered(f"the {flavour} wrapper does not expose .buckets")
    return None


def _law(name, check, cases, extra):
    return Law(name, "DDP", API, cases, check, extra=extra, doc=(check.__doc__ or "").strip())


LAWS = (
    _law("replicas_match", law_replicas_identical_and_match_single_process, training_cases, "random models and batch splits"),
    _law("no_sync", law_no_sync_accumulation_equals_concatenated_batch, no_sync_cases, "no_sync accumulation"),
    _law("overlap", law_collective_overlaps_backward, overlap_cases, "communication overlaps backward"),
    _law("layout", law_buckets_partition_in_reverse_order, layout_cases, "bucket layout"),
)
LAWS_BY_NAME = by_name(LAWS)
