"""Hypothesis strategies: mesh shapes and composed-step cases."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import strategies as st

ORDER = ("pp", "dp", "cp", "tp")


@dataclass(frozen=True)
class MeshCase:
    sizes: tuple  # ((dim, size), ...) over ORDER-like dims
    order: tuple

    @property
    def world(self) -> int:
        return math.prod(s for _, s in self.sizes)


@dataclass(frozen=True)
class ComposedCase:
    sizes: tuple  # ((dim, size), ...)
    data_parallel: str  # "ddp" | "fsdp"
    n_layers: int
    n_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    batch: int
    seq: int
    n_microbatches: int
    ignore_fraction: float
    seed: int
    lr: float = 0.1
    ignore_index: int = -100
    order: tuple = ORDER

    @property
    def dims(self) -> dict:
        return dict(self.sizes)

    @property
    def world(self) -> int:
        return math.prod(s for _, s in self.sizes)

    def size(self, d: str) -> int:
        return self.dims.get(d, 1)


@st.composite
def mesh_cases(draw, max_world: int = 8):
    order = tuple(draw(st.permutations(ORDER)))
    sizes = []
    left = max_world
    for d in order:
        s = draw(st.sampled_from([k for k in (1, 2, 3, 4) if k <= left]))
        left //= s
        sizes.append((d, s))
    return MeshCase(tuple(sizes), order)


# compositions: (sizes, data parallel kind); W <= 4 except the 3-D case; the sequence
# length is a multiple of cp
COMPOSITIONS = {
    "dp_x_tp": [((("dp", 2), ("tp", 2)), "ddp"), ((("dp", 2), ("tp", 1)), "ddp"), ((("dp", 1), ("tp", 2)), "ddp")],
    "fsdp_x_tp": [((("dp", 2), ("tp", 2)), "fsdp"), ((("dp", 2), ("tp", 1)), "fsdp"), ((("dp", 1), ("tp", 2)), "fsdp")],
    "dp_x_pp": [((("pp", 2), ("dp", 2)), "ddp"), ((("pp", 2), ("dp", 1)), "ddp")],
    "pp_x_tp": [((("pp", 2), ("tp", 2)), "ddp")],
    "tp_x_cp": [((("cp", 2), ("tp", 2)), "ddp"), ((("cp", 2), ("tp", 1)), "ddp")],
    "pp_x_cp": [((("pp", 2), ("cp", 2)), "ddp")],
    "dp_x_cp": [((("dp", 2), ("cp", 2)), "ddp"), ((("dp", 2), ("cp", 2)), "fsdp")],
    "pp_x_dp_x_tp": [((("pp", 2), ("dp", 2), ("tp", 2)), "ddp")],
}


@st.composite
def composed_cases(draw, kinds=("dp_x_tp", "fsdp_x_tp", "dp_x_pp", "pp_x_tp", "tp_x_cp"), ignore=False, uneven_dp=False):
    kind = draw(st.sampled_from(kinds))
    sizes, dp_kind = draw(st.sampled_from(COMPOSITIONS[kind]))
    d = dict(sizes)
    dp, tp, pp, cp = d.get("dp", 1), d.get("tp", 1), d.get("pp", 1), d.get("cp", 1)
    if uneven_dp:  # the loss-normalisation law needs several data-parallel ranks
        dp = max(dp, 2)
        d["dp"] = dp
        sizes = tuple((k, d[k]) for k in ORDER if k in d)
    n_layers = draw(st.integers(max(1, pp), pp + 1))
    n_heads = tp * draw(st.integers(1, 2))
    head_dim = draw(st.sampled_from([2, 4]))
    d_ff = tp * draw(st.integers(1, 3)) * 2
    per_rank = draw(st.integers(1, 2))
    batch = dp * per_rank
    n_mb = draw(st.integers(1, per_rank)) if pp > 1 else 1
    return ComposedCase(
        sizes=tuple(sizes), data_parallel=dp_kind, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim,
        d_ff=d_ff, vocab_size=draw(st.integers(5, 13)), batch=batch, seq=cp * draw(st.integers(1, 4 // cp + 1)) if cp > 1 else draw(st.integers(2, 5)),
        n_microbatches=n_mb, ignore_fraction=draw(st.sampled_from([0.3, 0.6])) if ignore else 0.0,
        seed=draw(st.integers(0, 2**16)),
    )
