"""Hypothesis strategies for attention cases, composed from small named pieces.

A drawn ``AttentionCase`` is a description (shapes, dtype, flags, a seed); its tensors are
made from the seed, so every example gets fresh random inputs, a failing example shrinks
to small shapes, and its printed repr is enough to rebuild the inputs.

Budgets differ by where the implementation runs: the Triton interpreter on the CPU is
slow per program, so CPU cases stay small; on a GPU lengths go up to a few thousand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from hypothesis import strategies as st

TILE_MULTIPLES = (16, 32, 64, 128)
SPLIT_KEYS_LEN = 1000  # the boundary cases of a small grid with many keys and of many work items (boundary_cases)
MANY_ITEMS_BATCH = (4, 10)  # batch, heads of the many-work-items cases

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


@dataclass(frozen=True)
class AttentionCase:
    batch: tuple[int, ...]  # leading dims: (B,) as in CS336, or (B, H)
    n_q: int
    n_k: int
    d: int
    dtype: torch.dtype
    is_causal: bool
    scale: float | None  # None: the implementation's default 1/sqrt(d)
    value_scale: float  # q and k are drawn with this std; large values make huge scores
    layout: str  # "contiguous", "transposed" ((B, N, H, d) storage seen as (B, H, N, d)), "strided",
    # or "misaligned" (contiguous from one element into its storage; drawn by one law's neighbours),
    # or "rows_padded" (each row one element longer than d: a row stride TMA cannot read; the same),
    # or "mixed" (each of q, k, v, dO in its own layout: PER_TENSOR_LAYOUTS)
    seed: int
    # Uninitialised allocations NaN-filled during the call (torch's fill, which runs under its
    # deterministic-algorithms mode); False: the call runs as a user runs it (laws._allocations).
    poisoned: bool = True

    def __repr__(self) -> str:
        return (
            f"AttentionCase(batch={self.batch}, n_q={self.n_q}, n_k={self.n_k}, d={self.d}, "
            f"dtype={DTYPE_NAMES.get(self.dtype, self.dtype)}, is_causal={self.is_causal}, scale={self.scale}, "
            f"value_scale={self.value_scale}, layout={self.layout!r}, seed={self.seed}, poisoned={self.poisoned})"
        )

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else self.d**-0.5

    def make(self, device, *, requires_grad: bool = True):
        """(q, k, v, dO) in the case's dtype and layout on ``device``, plus a float64 copy of each.

        The float64 copies are the rounded low-precision values, so the reference sees
        exactly the inputs the implementation sees.
        """
        g = torch.Generator().manual_seed(self.seed)
        sizes = {"q": self.n_q, "k": self.n_k, "v": self.n_k, "do": self.n_q}
        stds = {"q": self.value_scale, "k": self.value_scale, "v": 1.0, "do": 1.0}
        low, ref = {}, {}
        for name, n in sizes.items():
            x = (torch.randn(*self.batch, n, self.d, generator=g, dtype=torch.float64) * stds[name]).to(self.dtype)
            ref[name] = x.to(torch.float64).to(device)
            layout = tensor_layout(self.layout, name)
            low[name] = x.to(device) if layout == "contiguous" else _lay_out_on(x, layout, device)
        if requires_grad:
            for name in ("q", "k", "v"):
                low[name].requires_grad_(True)
        return (low["q"], low["k"], low["v"], low["do"]), (ref["q"], ref["k"], ref["v"], ref["do"])


# K and V (and dO) in layouts other than Q's: a kernel that takes K's strides for V, or a
# plan keyed on Q's layout alone, reads the wrong elements only when the layouts differ.
PER_TENSOR_LAYOUTS = {
    "mixed": {"q": "transposed", "k": "contiguous", "v": "strided", "do": "contiguous"},
}
DO_SUFFIX = "+do="  # "<layout>+do=<dO's layout>": q, k, v as in <layout>, dO in its own (one law's neighbours)


def tensor_layout(layout: str, name: str) -> str:
    """The layout of tensor ``name`` (q, k, v, do) in a case of ``layout``."""
    if DO_SUFFIX in layout:
        base, do_layout = layout.split(DO_SUFFIX)
        return do_layout if name == "do" else tensor_layout(base, name)
    return PER_TENSOR_LAYOUTS.get(layout, {}).get(name, layout)


def with_other_grad_output_layout(layout: str) -> str:
    """The same q, k, v layouts, dO in another one."""
    base = layout.split(DO_SUFFIX)[0]
    return base + DO_SUFFIX + ("strided" if tensor_layout(base, "do") == "contiguous" else "contiguous")


def _lay_out_on(x: torch.Tensor, layout: str, device) -> torch.Tensor:
    """The same values as x, stored non-contiguously on ``device``."""
    if layout == "misaligned":
        # contiguous, but starting one element into its storage: an address that is not a
        # multiple of 16 bytes (kernels that vectorise or use tensor descriptors assume one)
        storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=device)
        out = storage[1:].view(x.shape)
        out.copy_(x.to(device))
        return out
    if layout == "rows_padded":
        # every row one element longer than d, the extra one NaN: a row stride that is no multiple
        # of 16 bytes in any dtype, which tensor descriptors (TMA) cannot read in place
        padded = torch.full((*x.shape[:-1], x.shape[-1] + 1), float("nan"), dtype=x.dtype)
        padded[..., : x.shape[-1]] = x
        return padded.to(device)[..., : x.shape[-1]]
    if layout == "transposed" and x.dim() >= 3:
        # storage (..., N, H, d); the view (..., H, N, d) has strides (.., d, H*d, 1); for 3-D
        # inputs storage (N, B, d) seen as (B, N, d)
        storage = x.transpose(-3, -2).contiguous().to(device)
        return storage.transpose(-3, -2)
    # "strided" (or transposed with no batch dim): every row padded to 2d, view the first d
    padded = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    padded[..., : x.shape[-1]] = x
    padded[..., x.shape[-1] :] = float("nan")  # a kernel that reads the padding is caught
    return padded.to(device)[..., : x.shape[-1]]


@dataclass(frozen=True)
class Budget:
    """Upper limits on a drawn case, by where it runs."""

    max_len: int
    max_batch_elems: int
    head_dims: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]


# Flavours written as kernels, whose contract includes causal masking (the handout's part (c)).
KERNEL_FLAVOURS = ("triton", "gluon")


def budget_for(flavour: str, device: torch.device) -> Budget:
    if flavour == "gluon":  # its own domain only (a Hopper GPU; elsewhere its checks are not run)
        from conformance.laws.attention.hopper import GLUON_DTYPES, GLUON_HEAD_DIMS

        return Budget(max_len=1100, max_batch_elems=8, head_dims=GLUON_HEAD_DIMS, dtypes=GLUON_DTYPES)
    if device.type == "cuda":
        return Budget(
            max_len=1100,
            max_batch_elems=8,
            head_dims=(16, 32, 64, 128, 24, 80, 96, 256),
            dtypes=(torch.float32, torch.float16, torch.bfloat16),
        )
    if flavour == "triton":  # the interpreter; bf16 tl.dot is broken there
        return Budget(max_len=140, max_batch_elems=3, head_dims=(16, 32, 64, 24, 80), dtypes=(torch.float32, torch.float16))
    return Budget(
        max_len=200,
        max_batch_elems=6,
        head_dims=(16, 32, 64, 128, 24, 80),
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
    )


def lengths(max_len: int) -> st.SearchStrategy[int]:
    """Sequence lengths, weighted towards just below, at and just above tile multiples."""
    near_tiles = sorted({n for t in TILE_MULTIPLES for n in (t - 1, t, t + 1) if 1 <= n <= max_len})
    return st.one_of(st.sampled_from([1, 2, 3] + near_tiles), st.integers(1, max_len))


def batch_shapes(max_elems: int) -> st.SearchStrategy[tuple[int, ...]]:
    one = st.integers(1, max_elems).map(lambda b: (b,))
    two = st.tuples(st.integers(1, 2), st.integers(1, max(1, max_elems // 2)))
    return st.one_of(one, two)


def value_scales() -> st.SearchStrategy[float]:
    # 1: ordinary; 4: peaked softmax; 12: scores in the hundreds, where exp without the
    # running-max subtraction overflows even in fp32
    return st.sampled_from([1.0, 1.0, 4.0, 12.0])


def softmax_scales(allow_custom: bool) -> st.SearchStrategy[float | None]:
    if not allow_custom:
        return st.none()
    return st.one_of(st.none(), st.none(), st.sampled_from([0.05, 0.3, 1.0]))


@st.composite
def attention_cases(
    draw,
    budget: Budget,
    *,
    causal: bool | None = None,
    allow_custom_scale: bool = True,
    min_batch_elems: int = 1,
    dtypes: tuple[torch.dtype, ...] | None = None,
    layouts: tuple[str, ...] = ("contiguous", "contiguous", "transposed", "strided", "mixed"),
) -> AttentionCase:
    batch = draw(batch_shapes(budget.max_batch_elems).filter(lambda b: _numel(b) >= min_batch_elems))
    return AttentionCase(
        batch=batch,
        n_q=draw(lengths(budget.max_len)),
        n_k=draw(lengths(budget.max_len)),
        d=draw(st.sampled_from(budget.head_dims)),
        dtype=draw(st.sampled_from(dtypes or budget.dtypes)),
        is_causal=draw(st.booleans()) if causal is None else causal,
        scale=draw(softmax_scales(allow_custom_scale)),
        value_scale=draw(value_scales()),
        layout=draw(st.sampled_from(layouts)),
        seed=draw(st.integers(0, 2**31 - 1)),
        poisoned=draw(st.booleans()),
    )


# The course's shapes: (B, N, d) inputs with N = N_q = N_k a power of two (the handout's
# sweep runs 128 to 65536; its tests 128 and 16), head dims 16 to 128, fp32 and bf16,
# causal masking asked of the Triton flavour only, the default softmax scale.
CONTRACT_LENGTHS = (16, 32, 64, 128, 256, 512, 1024)
CONTRACT_LONG_LENGTHS = (2048, 4096)  # where float32 vs input-precision accumulation separates
CONTRACT_HEAD_DIMS = (16, 32, 64, 128)


def contract_lengths(budget: Budget, flavour: str, long: bool) -> tuple[int, ...]:
    """The contract's sequence lengths this budget can run; empty if none."""
    if not long:
        return tuple(n for n in CONTRACT_LENGTHS if n <= budget.max_len)
    if budget.max_len >= 1024:  # a GPU
        return CONTRACT_LONG_LENGTHS
    return () if flavour == "triton" else CONTRACT_LONG_LENGTHS[:1]  # CPU bf16 is slow; the interpreter slower


def contract_head_dims(budget: Budget, long: bool) -> list[int]:
    dims = [d for d in CONTRACT_HEAD_DIMS if d in budget.head_dims]
    return dims[:2] if long and budget.max_len < 1024 else dims  # small heads keep the CPU's long cases cheap


@st.composite
def contract_cases(draw, budget: Budget, flavour: str, *, long: bool = False, causal: bool | None = None) -> AttentionCase:
    """Cases inside the CS336 contract only, within what ``budget`` can run here.

    ``long``: sequences in the thousands in bf16, one batch element: where accumulating O
    and the softmax denominator in the input precision shows."""
    dtypes = [t for t in (torch.float32, torch.bfloat16) if t in budget.dtypes]
    if causal is None:
        causal = draw(st.booleans()) if flavour in KERNEL_FLAVOURS else False
    return AttentionCase(
        batch=(1,) if long else (draw(st.integers(1, max(1, min(4, budget.max_batch_elems)))),),
        n_q=(n := draw(st.sampled_from(contract_lengths(budget, flavour, long)))),
        n_k=n,
        d=draw(st.sampled_from(contract_head_dims(budget, long))),
        dtype=draw(st.sampled_from([torch.bfloat16] if long and torch.bfloat16 in dtypes else dtypes)),
        is_causal=causal,
        scale=None,
        value_scale=1.0,
        layout="contiguous",
        seed=draw(st.integers(0, 2**31 - 1)),
        poisoned=draw(st.booleans()),
    )


def contract_corner_cases(budget: Budget, flavour: str, *, long: bool = False,
                          causal: bool | None = None) -> list[AttentionCase]:
    """The one case of the contract's family a contract law tries first, in every profile: one
    batch element at the longest contract length the budget runs, causal where the flavour's
    contract has the flag (a kernel's), d 64 (or the nearest the budget has), the first contract
    dtype the budget offers, run as a user runs it.  Still a contract case, drawn from nowhere
    else.  It is the family's largest grid of key tiles under a causal mask: where a kernel that
    cuts a short grid's keys into splits has splits with no keys of their own, which random draws
    (short or non-causal half the time) reached only now and then (the kept Gluon mutant
    ``discarded_split_counted`` passed the contract forward law once in three GPU runs).  None
    for the long laws, whose few draws are all long already."""
    lengths_here = contract_lengths(budget, flavour, long)
    dims = contract_head_dims(budget, long)
    dtypes = [t for t in (torch.float32, torch.bfloat16) if t in budget.dtypes]
    if long or not lengths_here or not dims or not dtypes:
        return []
    if causal is None:
        causal = flavour in KERNEL_FLAVOURS
    d = min(dims, key=lambda x: (abs(x - 64), x))
    return [AttentionCase((1,), max(lengths_here), max(lengths_here), d, dtypes[0], causal, None, 1.0,
                          "contiguous", 5000, poisoned=False)]


def boundary_cases(budget: Budget, flavour: str = "pytorch") -> list[AttentionCase]:
    """Explicit examples every law tries first, cheapest first: causal, one row past a tile multiple; one
    case with every tensor in its own layout; and, where the budget runs sequences in the
    thousands (a GPU), one causal head of a thousand keys (a small grid: split-KV kernels
    split it) and, for the kernel flavours, 40 heads of them, causal and not (more work items
    than SMs: persistent kernels walk several, size-picked tiles are the full-GPU ones).

    A query block whose last tile holds a single row (N = t + 1) is where causal
    tile-skipping, partial-tile and diagonal-mask bugs live; random draws reach it only
    now and then, so these are always run.  Of each pair, the second runs as a user runs
    it (unpoisoned: outside torch's deterministic mode, where kernels may take another
    backward), and the last pair's at head dim 128, or the flavour's nearest (the Gluon
    flavour's second backward form).
    """
    cases = []
    for i, t in enumerate(TILE_MULTIPLES):
        n = t + 1
        if n > budget.max_len:
            continue
        d = 128 if t == TILE_MULTIPLES[-1] else 16
        cases.append(AttentionCase((1,), n, n, 32, torch.float32, True, None, 1.0, "contiguous", 1000 + i))
        cases.append(AttentionCase((2,), n, n + 7, d, torch.float32, True, None, 4.0, "contiguous", 2000 + i,
                                   poisoned=False))
    # Each of q, k, v and dO in a layout of its own, with more than one key and batch element:
    # a launch that passes one tensor's strides for another's shows here, not by chance.
    cases.append(AttentionCase((2,), 17, 24, 16, torch.float32, True, None, 1.0, "mixed", 3000))
    # One head, a ragged thousand keys, causal: a grid of a few query tiles, where a kernel may cut
    # each tile's keys into splits to fill the GPU and merge their partial sums (split-KV, as
    # SDPA's flash backend does); causal tiles near the start have fewer keys than splits.
    # And, for a kernel flavour, 40 batch-heads of the same length, at each head dim, causal and
    # full: 320 query tiles of 128 rows, more than twice the SMs of any GPU, so a persistent
    # kernel's programs each walk several work items (what carries over from one item to the
    # next: Q's buffer, the ring's count, barrier phases), and kernels that pick tiles by the
    # grid's size take their full-GPU ones, as at training sizes (random draws stay under one
    # wave).  Kernels specialise on the head dim and the mask together, so all four are tried.
    # Not the PyTorch flavour's: a grid is a kernel's, and a student's tile loops in Python
    # would spend the law's budget on 40 heads.
    if budget.max_len >= SPLIT_KEYS_LEN:
        cases.append(AttentionCase((1,), SPLIT_KEYS_LEN, SPLIT_KEYS_LEN, 64, torch.float32, True, None, 1.0,
                                   "contiguous", 4000))
    if budget.max_len >= SPLIT_KEYS_LEN and flavour in KERNEL_FLAVOURS:
        # The two tracked shapes' forms first (the leaderboard's d 64 causal, in torch's
        # deterministic mode; B4 H16 N4096's d 128 full, as a user runs it: a backward's atomic
        # form), then the other two, as a user runs them, each dim in both 16-bit dtypes.
        many = ((64, torch.bfloat16, True, True), (128, torch.float16, False, False),
                (64, torch.float16, False, False), (128, torch.bfloat16, True, False))
        for seed, (d, dtype, causal, poisoned) in enumerate(many, 4001):
            cases.append(AttentionCase(MANY_ITEMS_BATCH, SPLIT_KEYS_LEN, SPLIT_KEYS_LEN, d, dtype, causal, None, 1.0,
                                       "contiguous", seed, poisoned=poisoned))
    return sorted((fit_to_budget(c, budget) for c in cases), key=case_work)  # cheapest first (check_law)


def case_work(case: AttentionCase) -> int:
    """Multiply-adds of a case's forward, about (its score and P V products; a causal mask halves them)."""
    work = math.prod(case.batch) * case.n_q * case.n_k * case.d
    return work // 2 if case.is_causal else work


def fit_to_budget(case: AttentionCase, budget: Budget) -> AttentionCase:
    """The case with its head dim and dtype moved into what the flavour offers (the smallest
    head dim it has; its widest 16-bit dtype where float32 is not offered): the same shape
    and masking otherwise.  A case already inside is returned unchanged."""
    d = case.d if case.d in budget.head_dims else min(budget.head_dims, key=lambda h: (h < case.d, abs(h - case.d)))
    dtype = case.dtype if case.dtype in budget.dtypes else budget.dtypes[-1]
    return replace(case, d=d, dtype=dtype)


def tiny_float64_cases() -> st.SearchStrategy[AttentionCase]:
    """Tiny float64 cases for gradcheck (its cost grows with the number of inputs)."""
    return st.builds(
        AttentionCase,
        batch=st.sampled_from([(1,), (2,)]),
        n_q=st.integers(1, 9),
        n_k=st.integers(1, 9),
        d=st.sampled_from([2, 4, 8]),
        dtype=st.just(torch.float64),
        is_causal=st.booleans(),
        scale=st.none(),
        value_scale=st.just(1.0),
        layout=st.just("contiguous"),
        seed=st.integers(0, 2**31 - 1),
    )


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def with_dtype(case: AttentionCase, dtype: torch.dtype) -> AttentionCase:
    return replace(case, dtype=dtype)
