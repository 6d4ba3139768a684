"""Rank arithmetic of a mesh: pure, no communication.

Contract
    A mesh has named dimensions (any of ``DIMS`` = pp, dp, cp, tp) with sizes that multiply
    to the world size W, listed outermost first in ``order`` (default ``DEFAULT_ORDER`` =
    pp, dp, cp, tp: tensor parallelism innermost, so its ranks are neighbours, i.e. on one
    node).  Rank r has the row-major coordinate of r in the shape ``[size(d) for d in
    order]``: the last dimension has stride 1, dimension i stride prod(sizes after i).
    A group along dimension d holds the ranks whose coordinates agree everywhere except
    at d; a group along several dimensions (e.g. ("dp", "cp")) lets all of them vary.
    A dimension missing from ``sizes`` has size 1.
"""

from __future__ import annotations

import itertools
import math

DIMS = ("pp", "dp", "cp", "tp")
DEFAULT_ORDER = ("pp", "dp", "cp", "tp")


def normalise_sizes(sizes: dict, order=DEFAULT_ORDER, world_size: int | None = None) -> tuple[dict, tuple]:
    """({dim: size} over every dim of ``order``, order as a tuple); checks names and product."""
    order = tuple(order)
    if sorted(order) != sorted(set(order)) or any(d not in DIMS for d in order):
        raise ValueError(f"mesh order must list distinct dimensions from {DIMS}, got {order}")
    unknown = [d for d in sizes if d not in order]
    if unknown:
        raise ValueError(f"mesh dimensions {unknown} are not in the order {order}")
    full = {}
    for d in order:
        s = sizes.get(d, 1)
        if not isinstance(s, int) or s < 1:
            raise ValueError(f"mesh dimension {d} must have a positive integer size, got {s!r}")
        full[d] = s
    total = math.prod(full.values())
    if world_size is not None and total != world_size:
        raise ValueError(f"mesh sizes {full} multiply to {total}, but the world size is {world_size}")
    return full, order


def _strides(sizes: dict, order) -> dict:
    strides, s = {}, 1
    for d in reversed(order):
        strides[d] = s
        s *= sizes[d]
    return strides


def coordinate(rank: int, sizes: dict, order=DEFAULT_ORDER) -> dict:
    """{dim: index} of ``rank``."""
    sizes, order = normalise_sizes(sizes, order)
    strides = _strides(sizes, order)
    return {d: (rank // strides[d]) % sizes[d] for d in order}


def mesh_groups(sizes: dict, order=DEFAULT_ORDER, dims=None) -> list[list[int]]:
    """Every group along ``dims`` (a name or a tuple of names), each a sorted rank list,
    in a fixed order (by the coordinates of the other dimensions, row-major)."""
    sizes, order = normalise_sizes(sizes, order)
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    if any(d not in order for d in dims):
        raise ValueError(f"mesh has dimensions {order}, asked for {dims}")
    strides = _strides(sizes, order)
    others = [d for d in order if d not in dims]
    groups = []
    for fixed in itertools.product(*(range(sizes[d]) for d in others)):
        base = sum(i * strides[d] for d, i in zip(others, fixed))
        ranks = [base + sum(i * strides[d] for d, i in zip(dims, var)) for var in itertools.product(*(range(sizes[d]) for d in dims))]
        groups.append(sorted(ranks))
    return groups
