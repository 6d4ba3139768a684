"""Pipeline schedules as data: for each rank, the ordered list of actions it runs.

Contract
    ``schedule(name, n_stages, n_microbatches)`` returns a tuple with one entry per rank
    (rank r holds stage r, so ``n_stages`` ranks): the tuple of ``Action``s that rank
    runs, in order.  ``Action(kind, microbatch, stage)``: ``kind`` is ``"F"`` (forward of
    micro-batch ``microbatch`` through stage ``stage``) or ``"B"`` (its backward).

    Every (micro-batch, stage) gets exactly one F and one B, on the rank of its stage, the
    F first.  Any ``n_microbatches >= 1`` works, fewer micro-batches than stages included.

    afab (alias gpipe)
        All forwards, micro-batches 0..m-1, then all backwards, 0..m-1 (GPipe).  Stage s
        holds the activations of all m micro-batches at the peak.

    1f1b
        Warm-up: stage s runs ``w = min(p - s - 1, m)`` forwards.  Steady state: m - w
        pairs (one forward, then the backward of the oldest micro-batch in flight).
        Cool-down: the w backwards left.  Stage s holds at most ``min(p - s, m)``
        micro-batches' activations (Narayanan et al. 2021, PipeDream-Flush).

    Both have the same idle ("bubble") fraction (p - 1) / (m + p - 1) when every forward
    takes the same time and every backward the same time.  Backwards run in micro-batch
    order 0..m-1 on every stage under both schedules, so gradients accumulate in the same
    order and the two schedules give bit-identical gradients.
"""

from __future__ import annotations

from typing import NamedTuple

FORWARD = "F"
BACKWARD = "B"


class Action(NamedTuple):
    kind: str  # "F" or "B"
    microbatch: int
    stage: int

    def __repr__(self) -> str:
        return f"{self.kind}{self.microbatch}@{self.stage}"


Schedule = tuple  # tuple[tuple[Action, ...], ...]: one ordered tuple per rank


def _check(n_stages: int, n_microbatches: int) -> None:
    for name, value in (("n_stages", n_stages), ("n_microbatches", n_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def afab(n_stages: int, n_microbatches: int) -> Schedule:
    """All forward, all backward (GPipe)."""
    _check(n_stages, n_microbatches)
    return tuple(
        tuple(Action(FORWARD, i, s) for i in range(n_microbatches))
        + tuple(Action(BACKWARD, i, s) for i in range(n_microbatches))
        for s in range(n_stages)
    )


def one_f_one_b(n_stages: int, n_microbatches: int) -> Schedule:
    """One forward, one backward (PipeDream-Flush): warm-up, steady state, cool-down."""
    _check(n_stages, n_microbatches)
    p, m = n_stages, n_microbatches
    ranks = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [Action(FORWARD, i, s) for i in range(warmup)]
        for i in range(m - warmup):  # steady: F of the next, B of the oldest in flight
            actions += [Action(FORWARD, warmup + i, s), Action(BACKWARD, i, s)]
        actions += [Action(BACKWARD, i, s) for i in range(m - warmup, m)]  # cool-down
        ranks.append(tuple(actions))
    return tuple(ranks)


SCHEDULES = {"afab": afab, "gpipe": afab, "1f1b": one_f_one_b}


def schedule(name: str, n_stages: int, n_microbatches: int) -> Schedule:
    key = name.lower() if isinstance(name, str) else name
    if key not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}; expected one of {sorted(SCHEDULES)}")
    return SCHEDULES[key](n_stages, n_microbatches)


def bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """The idle fraction of AFAB and 1F1B with uniform forward and backward times."""
    return (n_stages - 1) / (n_microbatches + n_stages - 1)
