"""The data-parallel laws: run a case on the ranks, then check (shared by the tests and the mutant runner)."""

from __future__ import annotations

import torch

from conformance.harness import run_on_ranks
from conformance.lawbook import API, Law, by_name
from conformance.verdicts import NotOffered

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


def _law(name, check, cases, extra):
    return Law(name, "DDP", API, cases, check, extra=extra, doc=(check.__doc__ or "").strip())


LAWS = (
    _law("replicas_match", law_replicas_identical_and_match_single_process, training_cases, "random models and batch splits"),
    _law("no_sync", law_no_sync_accumulation_equals_concatenated_batch, no_sync_cases, "no_sync accumulation"),
    _law("overlap", law_collective_overlaps_backward, overlap_cases, "communication overlaps backward"),
    _law("layout", law_buckets_partition_in_reverse_order, layout_cases, "bucket layout"),
)
LAWS_BY_NAME = by_name(LAWS)
