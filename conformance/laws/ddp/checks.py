"""Checks (test side): replicas, single-process parity, no_sync silence, overlap, bucket layout."""

from __future__ import annotations

import torch
from hypothesis import note

from conformance import oracle

from .spy import MIB
from .model import build_model
from .cases import TrainingCase
from .reference import reference_gradients, reference_run, split_eager_gradients


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
    check, and the parameters' bit-identity across replicas is checked exactly.  The same
    holds for Adam in float32 wherever a gradient is near zero: its first step moves a
    parameter by lr g / (|g| + eps), which multiplies a gradient's rounding by up to
    lr / eps (5 at the cases' lr 0.05, eps 0.01), so a gradient summed over the ranks in
    another order (within its own bound) moved one parameter by 2.4e-7 against a float32
    bound of 1.7e-7 (seed 883; found by CI).  The final parameters are judged against the
    single process under SGD, whose step is linear in the gradient (factor lr).
    """
    grad_dtype = torch.bfloat16 if case.precision == "bf16" else torch.float32
    step_magnitudes = []  # per step: the magnitudes of each gradient's summands
    for s in range(len(case.steps)):
        ref64 = reference_gradients(case, s, result["before"][s], "ref64", device)
        step_magnitudes.append(ref64["magnitudes"])
        eager = reference_gradients(case, s, result["before"][s], "eager", device)
        split = split_eager_gradients(case, s, result["before"][s], device)
        _assert_same_pattern(f"step {s} (against the single process on the whole batch)", result["grads"][s], ref64["grads"])
        for name, ref in ref64["grads"].items():
            if ref is None:
                continue
            # the yardstick: the larger error of the whole-batch eager and the rank-split eager
            worse = max((eager["grads"][name], split["grads"].get(name)),
                        key=lambda t: -1.0 if t is None else oracle.max_abs_error(t, ref))
            verdict = oracle.judge(
                f"step {s}: averaged gradient of {name}",
                result["grads"][s][name],
                ref,
                worse,
                grad_dtype,
                magnitude=ref64["magnitudes"][name],
            )
            if not verdict.ok:
                raise AssertionError(verdict.message())
    if case.precision != "fp32" or case.optimizer != "sgd":
        return
    ref64, eager = reference_run(case, "ref64", device), reference_run(case, "eager", device)
    for name, ref in ref64["final"]["params"].items():
        # p_final = p_0 - lr g_1 - lr g_2 ...: the terms summed are p_0 and lr times each
        # gradient's summands.  A parameter that ends small while its gradients' summands were
        # not carries their rounding (a tied bias at 3.6e-4 moved 7.2e-9 by another summation
        # order, seed 2069; found by CI), which |p_final| alone would not bound.
        magnitude = ref.detach().to("cpu", torch.float64).abs()
        start = result["before"][0].get(name) if result["before"] else None
        if start is not None and start.shape == ref.shape:
            magnitude = magnitude + start.detach().to("cpu", torch.float64).abs()
        for mags in step_magnitudes:
            if mags.get(name) is not None:
                magnitude = magnitude + case.lr * mags[name].detach().to("cpu", torch.float64).abs()
        verdict = oracle.judge(f"parameter {name} after {len(case.steps)} steps", result["final"]["params"][name], ref,
                               eager["final"]["params"][name], torch.float32, magnitude=magnitude)
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
