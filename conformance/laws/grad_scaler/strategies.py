"""Cases of the gradient-scaler laws, as Hypothesis strategies.

``ScalerCase``: a small tanh MLP (impl's DDP laws' ``RandomMLP``) trained for a few steps
on W ranks through one of impl's wrappers (bucketed DDP = ``get_ddp``, per-parameter
DDP, FSDP) with the target's scaler at a power-of-two scale.  ``inject`` lists the
non-finite values put in: ``(step, rank, where, kind, param_index)``, where "grad" is one
element of one parameter's gradient on ONE rank after the gradient synchronisation (what
a rank holding its own shard or a corrupted local copy sees) and "input" one element of
that rank's first input row (it reaches every rank through the averaging).
Under DDP the model may also hold a frozen layer (``requires_grad=False``) and a layer no
rank uses, both in the optimizer's parameters with no gradient; ``two_optimizers`` splits
the parameters between two optimizers of one scaler (torch's multi-optimizer usage).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from conformance.harness import available_world_sizes, pinned_world_size

MAX_WORLD_SIZE = 4


@dataclass(frozen=True)
class ScalerCase:
    world_size: int
    wrapper: str  # "bucketed" | "individual" | "fsdp"
    seed: int
    width: int
    rows: int
    optimizer: str  # "sgd" | "adam"
    scale_exp: int  # init_scale = 2 ** scale_exp
    growth_interval: int
    steps: int
    inject: tuple = ()
    explicit_unscale: bool = True
    second_unscale: bool = False
    micro_batches: int = 1
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    clip_fraction: float = 0.0
    find_first: bool = False
    delay_injected_ranks: bool = False  # ranks with an injection sleep before unscale_/step
    frozen: bool = False  # a layer with requires_grad=False: no gradient, still in the optimizer
    unused: bool = False  # a layer no rank calls: no gradient anywhere, still in the optimizer
    two_optimizers: bool = False  # the first half of the parameters in one optimizer, the rest in another


def world_sizes(device, low: int, high: int):
    if pinned_world_size() is not None:
        return st.just(pinned_world_size())
    top = min(high, max(available_world_sizes(device)))
    return st.integers(min(low, top), top)


def _injection(draw, w, steps, where):
    step = draw(st.integers(0, steps - 1))
    return (step, draw(st.integers(0, w - 1)), draw(st.sampled_from(where)), draw(st.sampled_from(["inf", "nan", "-inf"])),
            draw(st.integers(0, 50)))


@st.composite
def scaler_cases(draw, device, *, contract=True, wrappers=("bucketed", "individual"), steps=(1, 3), injections=(0, 0),
                 where=("grad",), explicit=(True, False), growth=(1, 3), factors=((2.0,), (0.5,)), **fixed):
    """Contract cases: DDP at W = 2 (fewer where fewer ranks run); extras: W = 2..4."""
    w = draw(world_sizes(device, 2, 2 if contract else MAX_WORLD_SIZE))
    n_steps = draw(st.integers(*steps))
    n_inject = draw(st.integers(*injections))
    inject = tuple(sorted({_injection(draw, w, n_steps, where) for _ in range(n_inject)}))
    wrapper = draw(st.sampled_from(wrappers))
    ddp = wrapper != "fsdp"
    values = dict(
        world_size=w,
        wrapper=wrapper,
        seed=draw(st.integers(0, 2**20)),
        width=draw(st.integers(2, 5)),
        rows=draw(st.integers(1, 4)),
        optimizer=draw(st.sampled_from(["adam", "sgd"])),
        scale_exp=draw(st.integers(0, 20)),
        growth_interval=draw(st.integers(*growth)),
        steps=n_steps,
        inject=inject,
        explicit_unscale=draw(st.sampled_from(explicit)),
        growth_factor=draw(st.sampled_from(factors[0])),
        backoff_factor=draw(st.sampled_from(factors[1])),
        frozen=ddp and draw(st.booleans()),
        unused=ddp and draw(st.booleans()),
    )
    values.update(fixed)
    return ScalerCase(**values)


def spec_case(**kw) -> ScalerCase:
    """The fixed spec cases' base: bucketed DDP at W = 2, Adam, scale 2^16, growth every 2."""
    base = dict(world_size=2, wrapper="bucketed", seed=3, width=4, rows=3, optimizer="adam", scale_exp=16,
                growth_interval=2, steps=2)
    base.update(kw)
    return ScalerCase(**base)


@dataclass(frozen=True)
class SubgroupCase:
    """Two disjoint groups over W = 3 or 4 ranks, the even and the odd ranks (so a group
    rank differs from its global rank: global rank 2 is rank 1 of the even group); one
    element of one gradient on ``inject_rank`` is non-finite."""

    world_size: int
    seed: int
    width: int
    scale_exp: int
    inject_rank: int
    inject_param: int
    kind: str  # "inf" | "-inf" | "nan"


@st.composite
def subgroup_cases(draw):
    worlds = [w for w in (3, 4) if w <= max(available_world_sizes())] or [3]
    pinned = pinned_world_size()
    w = draw(st.sampled_from([pinned] if pinned and pinned >= 3 else worlds))
    return SubgroupCase(w, draw(st.integers(0, 2**16)), draw(st.integers(2, 5)), draw(st.integers(0, 16)),
                        draw(st.integers(0, w - 1)), draw(st.integers(0, 3)), draw(st.sampled_from(("inf", "-inf", "nan"))))
