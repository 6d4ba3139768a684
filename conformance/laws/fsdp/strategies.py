"""FSDP cases: Hypothesis strategies, pure functions of their arguments."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from hypothesis import strategies as st

from conformance.laws import optimizers

DTYPES = {None: None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class FSDPCase:
    world_size: int
    vocab: int
    widths: tuple[int, ...]
    norms: bool
    tied: bool
    frozen: int | None  # index of a frozen Linear in ``layers``
    compute: str | None  # None, "fp16", "bf16"
    optimizer: str  # "SGD" or "AdamW"
    lr: float
    steps: int
    batch_per_rank: int
    seq: int
    seed: int
    strategy: str | None = None  # None: the CS336 get_fsdp; else get_fsdp_strategy(strategy)
    micro: int = 1  # micro-batches per step: micro - 1 inside no_sync, then one synced
    delay_rank: int | None = None  # this rank sleeps before every collective
    delay_s: float = 0.0
    eval_forward: bool = False  # after training, one forward under torch.no_grad (an evaluation)

    @property
    def compute_dtype(self):
        return DTYPES[self.compute]

    def with_(self, **kw) -> "FSDPCase":
        return replace(self, **kw)




@st.composite
def fsdp_cases(draw, world_sizes: st.SearchStrategy[int], *, computes=(None, "fp16", "bf16"), strategies=(None,), micro=(1,), delay=False, steps=(1, 3), contract=False, widths=(1, 9), depths=(1, 3), ties=False, freezes=False):
    """A random model, world size, precision, optimizer and number of steps.

    ``contract``: CS336's shapes only (an Embedding, norms, Linears, an untied head, no
    frozen parameter; every size a multiple of W, as its toy model's at W = 2), SGD as in
    its test.  Sizes W does not divide (padded or uneven shards) are the wider laws'.  ``ties``, ``freezes``: a head tied to the
    embedding, a frozen layer may be drawn; only the laws whose subject includes them draw
    them, so that a wrapper without them fails those laws, not every law whose subject is
    something else."""
    world = draw(world_sizes)
    depth = draw(st.integers(*depths))
    if contract:  # multiples of W within the range (W itself if none is)
        multiples = [w for w in range(widths[0], widths[1] + 1) if w % world == 0] or [world]
        sizes = st.sampled_from(multiples)
    else:
        sizes = st.integers(*widths)
    widths = list(draw(st.lists(sizes, min_size=depth + 1, max_size=depth + 1)))
    tied = False if contract or not ties else draw(st.booleans())
    if tied:
        widths[-1] = widths[0]
    frozen = None if contract or not freezes or depth < 2 else draw(st.one_of(st.none(), st.integers(0, depth - 1)))
    delay_rank = draw(st.integers(0, world - 1)) if delay and world > 1 else None
    return FSDPCase(
        world_size=world,
        vocab=_vocab(draw, widths[0], world if contract else 1),
        widths=tuple(widths),
        norms=True if contract else draw(st.booleans()),
        tied=tied,
        frozen=frozen,
        compute=draw(st.sampled_from(computes)),
        optimizer="SGD" if contract else draw(st.sampled_from(["SGD", "AdamW"])),
        lr=draw(st.sampled_from([0.01, 0.1, 0.5])),
        steps=draw(st.integers(*steps)),
        batch_per_rank=draw(st.integers(1, 3)),
        seq=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**16)),
        strategy=draw(st.sampled_from(strategies)),
        micro=draw(st.sampled_from(micro)),
        delay_rank=delay_rank,
        delay_s=0.005 if delay_rank is not None else 0.0,
    )


def _vocab(draw, d0: int, multiple_of: int) -> int:
    low, high = (2, 13) if d0 < 6 else (6, 24)
    return draw(st.sampled_from([v for v in range(low, high + 1) if v % multiple_of == 0] or [multiple_of]))


def make_optimizer(case: FSDPCase, params):
    if case.optimizer == "SGD":
        return optimizers.build(torch.optim.SGD, params, lr=case.lr)
    return optimizers.build(torch.optim.AdamW, params, lr=case.lr * 0.1, weight_decay=0.1)


def optimizer_state_bytes_per_element(case: FSDPCase) -> int:
    return 0 if case.optimizer == "SGD" else 8
