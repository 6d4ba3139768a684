"""The suite's own cost model of checkpointing strategies (independent of any target).

No CS336 handout covers checkpointing and torch's ``checkpoint`` documents no figure of
memory or recomputation: every number here is this suite's arithmetic.  It is used two
ways.  The contract bounds a target from the side that costs its user (``bound``): peak
<= the bound + slack, forwards <= the bound, for any correct design of the strategy asked
for (torch's early stop and reentrant recomputation included).  The exact figures of impl's
plan (``costs``) are an extra ("exact peak / recomputation of the reference plan").

Units: ``b`` = the bytes one block saves for backward (its intermediates, not its output),
``a`` = the bytes of one block's input or output (what a checkpointed region keeps: its
input).  For N blocks, the peak of activation bytes over forward + backward is

    none          N b + a                    (every block's saved tensors, and the output)
    segments k    s = ceil(N / k) regions, the last of r = N - (s - 1) k blocks:
                  max over regions j = 0..s-1 of  j a + len_j b + a
                  (backward of region j holds the inputs of regions 1..j -- region 0's input
                  is the caller's --, the len_j blocks it recomputes, and the output of its
                  last recomputed block, which nothing keeps after that)
    every         segments of 1:  (N - 1) a + b + a
    sqrt          segments of any k minimising k + ceil(N / k) (about 2 sqrt N)
    nested        the halving recursion below; O(log N) a + b + a

and the block forwards (recomputation included) are

    none N;  every, segments, sqrt 2 N;  nested  N + sum over regions of their size.

Nested: the stack is split into [0, ceil(N/2)) and the rest; each half is a checkpointed
region whose body is split the same way, down to single blocks (a single block stands
alone in its region's body).  Recomputing a region of n blocks runs its n block forwards
once more; each inner region then recomputes in its own backward.

The nested bound (``nested_bound``) admits two legitimate choices the plan above does not
make: either half may take the odd block, and the recomputation may be reentrant (a
backward inside the region's backward, as torch's ``use_reentrant=True`` and any
``autograd.Function`` region do), which holds the region's recomputed output while its
inner regions run their backward: one more a per level of the path, still O(log N) a + b.
Its forwards are the plan's (N + the sum of region sizes does not depend on which half is
larger).  Early stop only lowers both figures.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    peak: int  # bytes of activation memory at the peak (slack not included)
    forwards: int  # block forwards in one forward + backward


def sqrt_sizes(n: int) -> tuple[int, ...]:
    """Every k in 1..N minimising k + ceil(N / k): the best single levels."""
    costs = {k: k + math.ceil(n / k) for k in range(1, n + 1)}
    best = min(costs.values())
    return tuple(k for k, c in costs.items() if c == best)


def segments(n: int, k: int, a: int, b: int) -> Cost:
    lens = [min(k, n - i) for i in range(0, n, k)]
    peak = max(j * a + length * b + a for j, length in enumerate(lens))
    return Cost(peak, 2 * n)


def none(n: int, a: int, b: int) -> Cost:
    return Cost(n * b + a, n)


def _nested_body(n: int, a: int, b: int, held: int) -> tuple[int, int]:
    """(peak, forwards of the backward) of a region of n blocks, ``held`` bytes kept outside
    it (its own input included)."""
    if n == 1:  # recompute the block: its saved tensors and its output
        return held + b + a, 1
    left, right = (n + 1) // 2, n // 2
    # recomputation runs both halves: the right half's input (the left's output) is kept
    peak = held + a + a  # the right region's input, and the body's output at the end
    p_right, f_right = _nested_body(right, a, b, held + a)
    p_left, f_left = _nested_body(left, a, b, held)
    return max(peak, p_right, p_left), n + f_right + f_left


def nested(n: int, a: int, b: int) -> Cost:
    if n == 1:
        peak, fwd = _nested_body(1, a, b, 0)
        return Cost(max(peak, a), 1 + fwd)
    left, right = (n + 1) // 2, n // 2
    p_right, f_right = _nested_body(right, a, b, a)
    p_left, f_left = _nested_body(left, a, b, 0)
    return Cost(max(2 * a, p_right, p_left), n + f_right + f_left)


@functools.lru_cache(maxsize=None)
def _nested_bound_body(n: int, a: int, b: int, held: int) -> int:
    """The largest peak of the backward of a region of n blocks over every halving (the odd
    block on either side) when a recomputation holds the region's output until its inner
    regions are done; ``held`` bytes kept outside it, its own input included."""
    if n == 1:
        return held + b + a
    peak = 0
    for left in {(n + 1) // 2, n // 2}:
        right = n - left
        # the body's recomputed output (a) stays while the right half's input (a) is kept
        peak = max(peak, held + 2 * a, _nested_bound_body(right, a, b, held + 2 * a),
                   _nested_bound_body(left, a, b, held + a))
    return peak


def nested_bound(n: int, a: int, b: int) -> Cost:
    """What "nested" may cost at most: see the module docstring."""
    if n == 1:
        return nested(n, a, b)
    peak = max(max(2 * a, _nested_bound_body(n - left, a, b, a), _nested_bound_body(left, a, b, 0))
               for left in {(n + 1) // 2, n // 2})
    return Cost(max(peak, nested(n, a, b).peak), nested(n, a, b).forwards)


def bound(n: int, strategy: str, k: int | None, a: int, b: int) -> Cost:
    """The most a correct implementation of ``strategy`` may cost (slack not included): the
    contract's side.  sqrt: the dearest of the best single levels, any of which may be taken."""
    if strategy == "nested":
        return nested_bound(n, a, b)
    allowed = costs(n, strategy, k, a, b)
    return Cost(max(c.peak for c in allowed), max(c.forwards for c in allowed))


def cost(n: int, strategy: str, k: int | None, a: int, b: int) -> Cost:
    if strategy == "none":
        return none(n, a, b)
    if strategy == "every":
        return segments(n, 1, a, b)
    if strategy == "segments":
        return segments(n, k, a, b)
    if strategy == "nested":
        return nested(n, a, b)
    raise ValueError(f"no single prediction for {strategy!r} (sqrt: see sqrt_sizes)")


def costs(n: int, strategy: str, k: int | None, a: int, b: int) -> tuple[Cost, ...]:
    """The reference plan's exact costs (sqrt: one per best single level, any may be taken)."""
    if strategy == "sqrt":
        return tuple(segments(n, kk, a, b) for kk in sqrt_sizes(n))
    return (cost(n, strategy, k, a, b),)
