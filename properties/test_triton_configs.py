"""Every tile configuration and switch of our Triton FlashAttention computes the same function.

The GPU defaults of ``impl.attention.flash_triton`` are picked by speed (perf/tune/tune_attention.py), so
any config the table may hold must be as right as the others: tile shapes, the dQ kernel's
own warps and stages, the longest-first program order under causal masking, and tiles
loaded through tensor descriptors (TMA), the split-KV forward (key ranges in programs of
their own, merged by a second kernel), the one-pass backward that adds dQ with atomics, and
the one-launch backward (dQ and dK/dV programs in one grid).  Drawn: an attention case (any
layout, ragged lengths) and a forward and a backward config; checked: O, L, dQ, dK, dV
against float64 through the oracle, with outputs poisoned so an unwritten tile fails.

The mutants below (a longest-first order off by one tile; descriptors that assume
contiguous rows; split-KV partial sums merged without moving them to the common max;
one-pass dQ shares stored over each other instead of added; the one-launch grid sized as two
dQ grids) must fail the same check on a case that exercises them.  They patch the kernels'
helpers (and the one-launch grid's builder), which only the interpreter looks up at run
time: CPU only.
"""

from __future__ import annotations

import types
import warnings
import itertools
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from conformance import oracle
from conformance.profiles import sharded_examples
from conformance.laws.attention.strategies import AttentionCase, attention_cases, budget_for
from impl.attention import flash_triton as ft
from impl.attention.host_plans import PlanCache
from impl.attention.triton_launch import ConfigDoesNotFit
from conformance.laws.attention.laws import references

BLOCKS = (16, 32, 64)


@st.composite
def forward_configs(draw) -> ft.ForwardConfig:
    block_m, block_n = draw(st.sampled_from(BLOCKS)), draw(st.sampled_from(BLOCKS))
    return ft.ForwardConfig(
        block_m=block_m, block_n=block_n,
        num_warps=draw(st.sampled_from((4, 8))), num_stages=draw(st.sampled_from((1, 2, 3))),
        longest_first=draw(st.booleans()), tma=draw(st.booleans()), fp_fusion=draw(st.booleans()),
        split_keys=max(block_m, block_n) * draw(st.sampled_from((0, 1, 2))))


@st.composite
def backward_configs(draw) -> ft.BackwardConfig:
    return ft.BackwardConfig(
        dkdv_block_n=draw(st.sampled_from(BLOCKS)), dkdv_block_m=draw(st.sampled_from(BLOCKS)),
        dq_block_m=draw(st.sampled_from(BLOCKS)), dq_block_n=draw(st.sampled_from(BLOCKS)),
        num_warps=draw(st.sampled_from((4, 8))), num_stages=draw(st.sampled_from((1, 2, 3))),
        preprocess_block_m=draw(st.sampled_from(BLOCKS)),
        dq_num_warps=draw(st.sampled_from((None, 4, 8))), dq_num_stages=draw(st.sampled_from((None, 1, 2))),
        longest_first=draw(st.booleans()), tma=draw(st.booleans()), dq_atomic=draw(st.booleans()),
        one_launch=draw(st.booleans()))


def check_config(case: AttentionCase, fwd: ft.ForwardConfig, bwd: ft.BackwardConfig, device) -> None:
    """O, L, dQ, dK, dV of flash_forward/flash_backward under these configs match float64."""
    (q, k, v, do), _ = case.make(device, requires_grad=False)
    # Poisoning turns deterministic algorithms on (warn_only): a one-pass config then warns.
    with oracle.poisoned_allocations(device), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "attention backward: config dq_atomic=True")
        o, lse = ft.flash_forward(q, k, v, case.is_causal, case.scale, config=fwd)
        dq, dk, dv = ft.flash_backward(q, k, v, o, lse, do, case.is_causal, case.scale, config=bwd)
    refs = references(case, device, with_grads=True)
    for key, got in (("O", o), ("L", lse), ("dQ", dq), ("dK", dk), ("dV", dv)):
        oracle.assert_close(f"{key} with {fwd} / {bwd}", got, refs.ref64[key], refs.eager[key], case.dtype,
                            refs.magnitudes[key])


# On a GPU every example compiles its own kernels (a few seconds each): this many at most,
# in any profile (the gate's thorough run included), split over the shards.
GPU_CONFIG_EXAMPLES = 24


def test_every_config_computes_the_same_attention(device, shard):
    budget = budget_for("triton", device)
    # Head dims up to 128: at 256 a drawn 64-wide config compiles for up to a minute per
    # kernel or does not fit (refused, see below), which made this law the gate's long pole
    # (221 s for one shard); the tables' own d=256 configs are checked by the attention laws.
    dims = tuple(d for d in budget.head_dims if d <= 128)
    budget = type(budget)(min(budget.max_len, 100), min(budget.max_batch_elems, 2), dims, budget.dtypes)
    total = settings().max_examples
    if device.type == "cuda":
        total = min(total, GPU_CONFIG_EXAMPLES)

    @settings(max_examples=sharded_examples(shard, total))
    @given(case=attention_cases(budget, allow_custom_scale=True), fwd=forward_configs(), bwd=backward_configs())
    # split-KV and one-pass dQ with batch > 1 (b > 0): the partial-sum and dQ-accumulator indexing
    @example(case=AttentionCase((2, 2), 70, 70, 24, torch.float32, True, None, 1.0, "contiguous", 13),
             fwd=ft.ForwardConfig(16, 32, split_keys=32), bwd=ft.BackwardConfig(32, 16, 16, 16, dq_atomic=True))
    # the one-launch backward with batch > 1, ragged lengths and unlike dQ and dK/dV tiles
    @example(case=AttentionCase((2, 2), 70, 45, 24, torch.float32, True, None, 1.0, "transposed", 14),
             fwd=ft.ForwardConfig(16, 16), bwd=ft.BackwardConfig(32, 16, 16, 32, one_launch=True))
    def run(case, fwd, bwd):
        note(repr(case))
        note(f"{fwd}\n{bwd}")
        try:
            check_config(case, fwd, bwd, device)
        except ConfigDoesNotFit as exc:
            # Large head dimensions with 64-wide tiles may need more shared memory than the
            # GPU has: a clear refusal is the contract there, not an answer.
            note(f"refused: {exc}")
            assert "does not fit" in str(exc) and "shared memory" in str(exc), str(exc)

    run()


# ---------------------------------------------------------------------------------------
# Every entry of the GPU tables, as it is (the config law above draws tiles at random)
# ---------------------------------------------------------------------------------------


def table_entries():
    """(name, fp32, head-dim bucket, causal or None for both, kind, config) of every GPU table entry."""
    for (fp32, bucket), cfg in ft._GPU_FWD.items():
        yield f"fwd {'fp32' if fp32 else '16-bit'} d{bucket}", fp32, bucket, None, "fwd", cfg
    for (causal, bucket), tiers in ft._SMALL_GRID_FWD.items():
        for waves, cfg, _ in tiers:
            # the split width is set per grid (pick_forward_config); 128 keys here, so that the
            # short cases below have three splits or more
            yield (f"small-grid {'causal' if causal else 'non-causal'} fwd d{bucket} <= {waves} waves",
                   False, bucket, causal, "fwd", replace(cfg, split_keys=128))
    for (fp32, bucket), cfg in ft._GPU_BWD.items():
        yield f"bwd {'fp32' if fp32 else '16-bit'} d{bucket}", fp32, bucket, None, "bwd", cfg
    for (fp32, bucket), cfg in ft._GPU_BWD_NON_CAUSAL.items():
        yield f"non-causal bwd {'fp32' if fp32 else '16-bit'} d{bucket}", fp32, bucket, False, "bwd", cfg
    for (causal, bucket), tiers in ft._SMALL_GRID_BWD.items():
        for waves, cfg, *_ in tiers:
            yield (f"small-grid {'causal' if causal else 'non-causal'} bwd d{bucket} <= {waves} waves",
                   False, bucket, causal, "bwd", cfg)
    for (causal, bucket), (cfg, waves) in ft._ONE_LAUNCH_BWD.items():
        yield (f"one-launch {'causal' if causal else 'non-causal'} bwd d{bucket} <= {waves} waves of programs",
               False, bucket, causal, "bwd", cfg)


TABLE = list(table_entries())


@pytest.mark.parametrize("entry", TABLE, ids=[e[0] for e in TABLE])
def test_every_table_entry_computes_the_same_attention(entry, device):
    """Each config the GPU path may pick, run as configured (a one-pass entry really runs in one
    pass here: the config is passed, so poisoning's deterministic mode only warns), on ragged
    lengths that cross its tiles and splits, causal and not, against float64."""
    check_table_entry(entry, device)


def test_a_one_pass_table_entry_with_its_dq_shares_stored_is_rejected(device, monkeypatch):
    if device.type != "cpu":
        pytest.skip("mutants patch kernel helpers, which only the Triton interpreter resolves at run time")
    entry = next(e for e in TABLE if e[4] == "bwd" and e[5].dq_atomic and e[2] <= 128)
    monkeypatch.setattr(ft, "_add_rows", _add_rows_by_storing)
    monkeypatch.setattr(ft, "_cached_plan", PlanCache().get)
    with pytest.raises(AssertionError):
        check_table_entry(entry, device)


def check_table_entry(entry, device) -> None:
    name, fp32, bucket, causal, kind, cfg = entry
    if device.type == "cpu" and (fp32 or bucket > 128):
        pytest.skip("under the interpreter: the 16-bit entries up to d=128 (the others are checked on a GPU)")
    dtype = torch.float32 if fp32 else (torch.bfloat16 if device.type == "cuda" else torch.float16)
    n = 300 if device.type == "cpu" else 1000
    for is_causal in ((True, False) if causal is None else (causal,)):
        case = AttentionCase((1, 1), n, n, bucket - 8, dtype, is_causal, None, 1.0, "contiguous", 12)
        fwd = cfg if kind == "fwd" else ft.default_forward_config(dtype, case.d, device)
        bwd = cfg if kind == "bwd" else ft.default_backward_config(dtype, case.d, device, is_causal)
        check_config(case, fwd, bwd, device)


# ---------------------------------------------------------------------------------------
# The default table's small-grid entries (which config the GPU path picks; CPU-checkable)
# ---------------------------------------------------------------------------------------


def test_small_grids_get_small_tiles_and_the_anchor_shapes_keep_the_table():
    h100 = 132
    fwd_table, bwd_table = ft._GPU_FWD[(False, 64)], ft._GPU_BWD[(False, 64)]
    # CS336's sweep (batch 1, one head): the one launch up to its programs' limit (64-row dQ
    # and dK/dV programs: four waves causal at d 64, N 16896; two elsewhere, N 8448); then, causal
    # d=64 up to two waves of 128-row tiles: the one-pass backward
    for causal, bucket, n_last in ((True, 64, 16896), (False, 64, 8448), (True, 128, 8448), (False, 128, 8448)):
        assert ft.pick_backward_config(False, bucket, causal, 1, n_last, h100).one_launch
        assert not ft.pick_backward_config(False, bucket, causal, 1, n_last + 1, h100).one_launch
        assert not ft.pick_backward_config(True, bucket, causal, 1, 128, h100).one_launch  # float32
        assert not ft.pick_backward_config(False, 256, causal, 1, 128, h100).one_launch  # no entry past d 128
    assert ft.pick_backward_config(False, 64, True, 8, 2112, h100).one_launch  # batch-heads count
    assert not ft.pick_backward_config(False, 64, True, 9, 2112, h100).one_launch
    assert ft.pick_backward_config(False, 64, True, 1, 128, h100, n_q=64 * 526).one_launch  # n_q counts too
    # many more queries than keys: the one-pass tier still serves the grid past the one launch's
    assert ft.pick_backward_config(False, 64, True, 1, 128, h100, n_q=64 * 526 + 1).dq_atomic
    # the split-KV forward: from three splits of 256 keys, up to half a wave (one under causal
    # masking at d=64), the keys in 8 splits at d=64
    assert ft.pick_forward_config(False, 64, 1, 128, h100, True) == fwd_table  # too few keys to split
    assert ft.pick_forward_config(False, 64, 1, 1024, h100, True).split_keys == 256
    assert ft.pick_forward_config(False, 64, 1, 8192, h100, False).split_keys == 1024
    assert ft.pick_forward_config(False, 64, 1, 16384, h100, True).split_keys == 2048
    assert ft.pick_forward_config(False, 64, 1, 16384, h100, False) == fwd_table
    assert ft.pick_forward_config(False, 128, 1, 8192, h100, True).split_keys == 2048
    assert ft.pick_backward_config(False, 64, True, 1, 32768, h100).dkdv_block_n == 128
    assert ft.pick_backward_config(False, 64, True, 1, 32768, h100).dq_atomic
    assert not ft.pick_backward_config(False, 64, True, 1, 65536, h100).dq_atomic
    # the leaderboard shape (B1 H16 N16384) and float32 keep the table
    assert ft.pick_forward_config(False, 64, 16, 16384, h100) == fwd_table
    assert ft.pick_backward_config(False, 64, True, 16, 16384, h100) == bwd_table
    assert ft.pick_forward_config(True, 64, 1, 128, h100) == ft._GPU_FWD[(True, 64)]
    assert ft.pick_backward_config(True, 64, True, 1, 128, h100) == ft._GPU_BWD[(True, 64)]


def _log_uniform(low_exp: int, high_exp: int):
    """Integers spread evenly over octaves 2^low_exp .. 2^(high_exp + 1) - 1."""
    return st.integers(low_exp, high_exp).flatmap(lambda e: st.integers(1 << e, (2 << e) - 1))


# Where the split-KV tiers apply (three splits' worth of keys up to about half a wave of one
# head) the width depends on N itself: half the lengths are drawn there, half anywhere.
_SPLIT_REGION = st.integers(3 * ft._MIN_SPLIT_KEYS, 16384)


@given(batch_heads=_log_uniform(0, 6), n=st.one_of(_log_uniform(0, 16), _SPLIT_REGION))
@example(batch_heads=1, n=5000)  # 8 splits of 625 keys unless rounded to the tiles
def test_every_picked_forward_config_is_launchable(batch_heads, n):
    """Whatever the tables pick for any length, its split width is one the launcher accepts:
    every table key (head-dim bucket, fp32 or not, causal or not, three SM counts) at one
    head and at the drawn number of heads (a pick is microseconds: the keys are few)."""
    for bucket, fp32, causal, sms, heads in itertools.product(
            (64, 128, 256), (False, True), (False, True), (78, 108, 132), (1, batch_heads)):
        cfg = ft.pick_forward_config(fp32, bucket, heads, n, sms, causal)
        ft._split_keys(cfg, n)  # raises ValueError on a width that is not a multiple of the tiles


def _split_entry_unrounded(tiers, waves, n_k):
    """The split width as keys / splits, not rounded to a power of two (and so to the tiles)."""
    for max_waves, cfg, splits in tiers:
        if waves <= max_waves:
            keys = max(ft._MIN_SPLIT_KEYS, triton.cdiv(n_k, splits))
            return replace(cfg, split_keys=keys) if triton.cdiv(n_k, keys) >= 3 else None
    return None


def test_an_unrounded_split_width_is_rejected(monkeypatch):
    """The launchability law's mutant: a table that cuts the keys into widths the tiles do
    not divide must fail it."""
    monkeypatch.setattr(ft, "_split_forward_entry", _split_entry_unrounded)
    with pytest.raises(ValueError, match="split_keys"):
        test_every_picked_forward_config_is_launchable()


@given(bucket=st.sampled_from((64, 128, 256)), fp32=st.booleans(), causal=st.booleans(),
       batch_heads=st.integers(1, 512), n=st.integers(3 * ft._MIN_SPLIT_KEYS, 1 << 17),
       sms=st.sampled_from((78, 108, 132)))
def test_a_grid_that_gets_the_table_keeps_it_when_it_grows(bucket, fp32, causal, batch_heads, n, sms):
    """The small-grid entries stop at a grid size: more sequence or more heads never return to
    them (from three splits' worth of keys: below that the split forward has nothing to split)."""
    for pick in (lambda bh, m: ft.pick_forward_config(fp32, bucket, bh, m, sms, causal),
                 lambda bh, m: ft.pick_backward_config(fp32, bucket, causal, bh, m, sms)):
        if pick(batch_heads, n) == pick(1 << 20, 1 << 20):  # the table's entry for this key
            assert pick(2 * batch_heads, n) == pick(batch_heads, n)
            assert pick(batch_heads, 2 * n) == pick(batch_heads, n)


# ---------------------------------------------------------------------------------------
# Mutants
# ---------------------------------------------------------------------------------------


@triton.jit
def _tile_coords_reversed_off_by_one(pid, n_row_tiles, H, LONGEST_FIRST: tl.constexpr, WORK_GROWS: tl.constexpr):
    """Longest-first with the classic reversal slip: tile n - rank instead of n - 1 - rank."""
    if LONGEST_FIRST:
        n_bh = tl.num_programs(0) // n_row_tiles
        rank = pid // n_bh
        bh = pid % n_bh
        if WORK_GROWS:
            tile = n_row_tiles - rank
        else:
            tile = rank
    else:
        tile = pid % n_row_tiles
        bh = pid // n_row_tiles
    return tile, (bh // H).to(tl.int64), (bh % H).to(tl.int64)


@triton.jit
def _tile_source_contiguous_rows(base, n_rows, stride_rows, BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                                 BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Descriptors whose row stride is the head dim: right for contiguous tensors only."""
    if USE_TMA:
        src = tl.make_tensor_descriptor(base, shape=[n_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                        block_shape=[BLOCK_ROWS, BLOCK_D])
    else:
        src = base
    return src


@triton.jit
def _add_rows_by_storing(ptrs, values, mask):
    """The one-pass backward's dQ shares stored, not added: the last key tile's share wins."""
    tl.store(ptrs, values, mask=mask)


def _one_launch_grid_as_two_dq_grids(*args, **kwargs):
    """The one-launch backward's grid sized as twice the dQ programs: where the dK/dV tiles
    are more than the dQ ones, the last key tiles' dK/dV programs never run."""
    launch = _REAL_ONE_LAUNCH(*args, **kwargs)
    n_dq = launch.rest[-2]  # (..., n_m_tiles, n_n_tiles, n_dq_programs, scale)
    launch.grid = (2 * n_dq, 1, 1)
    return launch


_REAL_ONE_LAUNCH = ft.one_launch_backward


@triton.jit
def _split_weight_without_rescaling(m_s, m, qk_scale):
    """Every non-empty split weighed 1, as if each split's sums were under the common max."""
    return tl.where(m_s > float("-inf"), 1.0, 0.0)


MUTANTS = {
    # name: (helper replaced, replacement, a case and configs that exercise it)
    "longest_first_off_by_one": (
        "_tile_coords", _tile_coords_reversed_off_by_one,
        AttentionCase((1, 2), 70, 70, 16, torch.float32, True, None, 1.0, "contiguous", 7),
        ft.ForwardConfig(32, 32, longest_first=True), ft.BackwardConfig(32, 32, 32, 32, longest_first=True)),
    "descriptors_assume_contiguous_rows": (
        "_tile_source", _tile_source_contiguous_rows,
        AttentionCase((1, 2), 40, 40, 16, torch.float32, False, None, 1.0, "transposed", 8),
        ft.ForwardConfig(16, 16, tma=True), ft.BackwardConfig(16, 16, 16, 16, tma=True)),
    "split_sums_merged_without_rescaling": (
        "_split_weight", _split_weight_without_rescaling,
        AttentionCase((1, 1), 70, 70, 16, torch.float32, True, None, 1.0, "contiguous", 10),
        ft.ForwardConfig(16, 16, split_keys=32), ft.BackwardConfig(16, 16, 16, 16)),
    "one_launch_grid_as_two_dq_grids": (
        "one_launch_backward", _one_launch_grid_as_two_dq_grids,
        AttentionCase((1, 2), 40, 40, 16, torch.float32, True, None, 1.0, "contiguous", 12),
        ft.ForwardConfig(16, 16), ft.BackwardConfig(16, 16, 32, 16, one_launch=True)),
    "dq_shares_stored_not_added": (
        "_add_rows", _add_rows_by_storing,
        AttentionCase((1, 1), 40, 40, 16, torch.float32, True, None, 1.0, "contiguous", 9),
        ft.ForwardConfig(16, 16), ft.BackwardConfig(16, 16, 16, 16, dq_atomic=True)),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_config_mutant_is_rejected(name, device, monkeypatch):
    if device.type != "cpu":
        pytest.skip("mutants patch kernel helpers, which only the Triton interpreter resolves at run time")
    helper, replacement, case, fwd, bwd = MUTANTS[name]
    check_config(case, fwd, bwd, device)  # the case passes with the real helpers
    monkeypatch.setattr(ft, helper, replacement)
    monkeypatch.setattr(ft, "_cached_plan", PlanCache().get)  # plans made with the real code stay out of the way
    with pytest.raises(AssertionError):
        check_config(case, fwd, bwd, device)


# ---------------------------------------------------------------------------------------
# Deterministic algorithms: the one-pass backward (atomic dQ) steps aside
# ---------------------------------------------------------------------------------------

ONE_PASS = ft.BackwardConfig(32, 32, 32, 32, dq_atomic=True)


def check_one_pass_respects_deterministic_algorithms(device) -> None:
    """Under torch.use_deterministic_algorithms(True) the default table's one-pass backward
    gives way to the two kernels; a caller's config asking for it is refused, or warned about
    under warn_only; with the setting off it runs."""
    case = AttentionCase((1, 2), 70, 70, 16, torch.float32, True, None, 1.0, "contiguous", 11)
    (q, k, v, do), _ = case.make(device, requires_grad=False)
    o, lse = ft.flash_forward(q, k, v, True)
    was = ft._determinism()
    try:
        torch.use_deterministic_algorithms(True)
        assert not ft._one_pass(ONE_PASS, requested=False), \
            "the table's one-pass (atomic dQ) backward kept while deterministic algorithms are on"
        with pytest.raises(RuntimeError, match="dq_atomic=True adds dQ with atomics"):
            ft.flash_backward(q, k, v, o, lse, do, True, config=ONE_PASS)
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="dq_atomic=True adds dQ with atomics"):
            ft.flash_backward(q, k, v, o, lse, do, True, config=replace(ONE_PASS, dkdv_block_n=16))
        torch.use_deterministic_algorithms(False)
        assert ft._one_pass(ONE_PASS, requested=False) and ft._one_pass(ONE_PASS, requested=True)
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])


def test_one_pass_backward_gives_way_under_deterministic_algorithms(device):
    check_one_pass_respects_deterministic_algorithms(device)


def test_one_pass_backward_ignoring_deterministic_algorithms_is_rejected(device, monkeypatch):
    monkeypatch.setattr(ft, "_one_pass", lambda cfg, requested: bool(cfg.dq_atomic))  # ignores the setting
    monkeypatch.setattr(ft, "_cached_plan", PlanCache().get)  # the mutant's plans leave with it
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check_one_pass_respects_deterministic_algorithms(device)


def test_the_default_one_pass_backward_is_reproducible_under_deterministic_algorithms(device):
    """On a GPU, at a shape whose table entry is the one pass, two backwards under
    deterministic algorithms give the same bits (they run the two kernels)."""
    if device.type != "cuda":
        pytest.skip("the interpreter runs one program at a time: every order is the same there")
    # (B1 N32768: two waves of 128-row tiles, past the one launch's grids: the one pass's)
    shape = next(((bh, n) for bh in (1, 16) for n in (4096, 16384, 32768)
                  if ft.default_backward_config(torch.bfloat16, 64, device, True, bh, n).dq_atomic), None)
    if shape is None:
        pytest.skip("no table entry on this GPU picks the one-pass backward")
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(1, shape[0], shape[1], 64, device=device, dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    o, lse = ft.flash_forward(q, k, v, True)
    was = ft._determinism()
    try:
        torch.use_deterministic_algorithms(True)
        first = ft.flash_backward(q, k, v, o, lse, do, True)
        for _ in range(3):
            again = ft.flash_backward(q, k, v, o, lse, do, True)
            for name, a, b in zip(("dQ", "dK", "dV"), first, again):
                assert torch.equal(a, b), f"{name} differs between calls under deterministic algorithms"
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])


# ---------------------------------------------------------------------------------------
# A config too large for the GPU: a clear refusal (the interpreter has no shared memory to
# run out of, so the launch is faked; on a GPU the config law above meets the real one)
# ---------------------------------------------------------------------------------------


class _TooLargeKernel:
    """Stands in for a JITFunction whose every compile needs more shared memory than there is."""

    arg_names = ["x", "BLOCK_M"]

    fn = types.SimpleNamespace(__name__="_fake_kernel")

    def __init__(self):
        self.stages_tried = []

    def __getitem__(self, grid):
        def launch(*args, num_stages=None, **kwargs):
            self.stages_tried.append(num_stages)
            raise triton.runtime.errors.OutOfResources(262152, 232448, "shared memory")

        return launch


def test_a_config_that_does_not_fit_the_gpu_is_refused_by_name_after_one_retry_with_one_stage():
    from impl.attention.triton_launch import Launch

    kernel = _TooLargeKernel()
    launch = Launch(kernel, (1,), (), {"BLOCK_M": 64}, {"num_warps": 4, "num_stages": 3}, torch.device("cpu"))
    with pytest.warns(RuntimeWarning, match="retrying with num_stages=1"), \
            pytest.raises(ConfigDoesNotFit, match=r"_fake_kernel: the tile configuration \{'BLOCK_M': 64\}.*shared memory"):
        launch._through_triton((torch.zeros(1),))
    assert kernel.stages_tried == [3, 1]


def test_split_forward_launches_take_the_direct_path(device):
    """Both launches of a split-KV forward plan (the forward and its combine) pass their
    constexprs last and in signature order, which the direct launch path needs; a kernel that
    gained a constexpr the plan does not pass would quietly fall back to Triton's own (slower)
    launch on every call.  (On the device under test: CPU tensors on a GPU run are refused.)"""
    q, k, v = (torch.randn(1, 2, 100, 32, device=device, dtype=torch.float16) for _ in range(3))
    plan = ft._ForwardPlan(q, k, v, True, None, config=ft.ForwardConfig(16, 32, split_keys=32))
    assert plan.combine is not None  # the keys are split
    for launch in (plan.launch, plan.combine):
        assert launch.direct_ok, launch.kernel.fn.__name__
