"""The Gluon flavour's host plans launch each kernel with arguments its signature takes:
tensor descriptors whose boxes are the kernel's tiles over the (B, H, N, d) view of each
input, outputs of the inputs' shapes, the grid the kernel indexes, and the config table's
tiles and warps.  Checked on the CPU with the three kernels replaced by recorders that bind
every launch against the kernel's own signature (no GPU runs Gluon here; a mistake of this
kind otherwise shows only on a Hopper machine)."""

from __future__ import annotations

import inspect
import types

import pytest
import torch
import triton

fg = pytest.importorskip("impl.attention.flash_gluon")
if fg.GLUON_IMPORT_ERROR is not None:  # pragma: no cover - a Triton without Gluon
    pytest.skip(f"not run here: this Triton has no Gluon ({fg.GLUON_IMPORT_ERROR})", allow_module_level=True)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

KERNELS = ("_flash_fwd_kernel", "_flash_bwd_dq_kernel", "_flash_bwd_dkdv_kernel")
# per kernel: its descriptor parameters and the constexpr that gives each one's box rows
DESCRIPTOR_ROWS = {
    "_flash_fwd_kernel": {"q_desc": "BLOCK_M", "k_desc": "BLOCK_N", "v_desc": "BLOCK_N"},
    "_flash_bwd_dq_kernel": {"q_desc": "BLOCK_M", "do_desc": "BLOCK_M", "k_desc": "BLOCK_N", "v_desc": "BLOCK_N"},
    "_flash_bwd_dkdv_kernel": {"k_desc": "BLOCK_N", "v_desc": "BLOCK_N", "q_desc": "BLOCK_M", "do_desc": "BLOCK_M",
                               "dqacc_desc": "BLOCK_M"},
}


def _forward_config(bh, n_q, d):
    """The forward's config for a grid: WIDE_FORWARD_CONFIGS' (192-row items, three consumers)
    where those items fill every SM at least once, FORWARD_CONFIGS' elsewhere."""
    wide = fg.WIDE_FORWARD_CONFIGS[d]
    full = bh * triton.cdiv(n_q, wide.block_m) >= fg._resident_programs(torch.device("cpu"))
    return wide if full and fg.WIDE_FORWARD else fg.FORWARD_CONFIGS[d]


def _plan_of(d, causal):
    """(the Gluon kernels a forward + backward launches, in order; their configs; whether the
    dK/dV kernel adds dQ): five products where the table has them, outside deterministic mode
    (the Triton flavour's preprocess and convert kernels around it are not Gluon's)."""
    if d in fg.BACKWARD_FUSED_CONFIGS and not torch.are_deterministic_algorithms_enabled():
        return (("_flash_fwd_kernel", "_flash_bwd_dkdv_kernel"),
                {"_flash_fwd_kernel": fg.FORWARD_CONFIGS[d], "_flash_bwd_dkdv_kernel": fg.BACKWARD_FUSED_CONFIGS[d]}, True)
    return KERNELS, {"_flash_fwd_kernel": fg.FORWARD_CONFIGS[d], "_flash_bwd_dq_kernel": fg.BACKWARD_DQ_CONFIGS[d],
                     "_flash_bwd_dkdv_kernel": fg.BACKWARD_DKDV_CONFIGS[d]}, False


# The Triton flavour's kernels a Gluon plan launches around its own: the split forward's
# combine, the five-product backward's D and dQ conversion.  Recorded too (into a list of
# their own), never launched: on a machine with a GPU Triton would run them on the CUDA driver,
# which cannot read these CPU tensors.
TRITON_HELPERS = ("_flash_fwd_combine_kernel", "_flash_bwd_preprocess_kernel", "_flash_bwd_dq_convert_kernel",
                  "_flash_bwd_one_launch_kernel")
ONE_LAUNCH_CONFIGS = dict(fg.ONE_LAUNCH_CONFIGS)  # as the module was imported (the fixture below clears it)
TRITON_FORWARD_KEYS = dict(fg.TRITON_FORWARD_KEYS)  # likewise


class _Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kwargs)`` binds the arguments to the
    kernel's signature (TypeError on a mismatch) and records them; launch options (``options``)
    are recorded apart."""

    def __init__(self, kernel, calls, options=("maxnreg",)):
        self.kernel, self.fn, self.arg_names, self.calls = kernel, kernel.fn, kernel.arg_names, calls
        self.option_names = options

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            options = {k: kwargs.pop(k) for k in self.option_names if k in kwargs}
            signature = inspect.signature(self.fn)
            bound = signature.bind(*args, **kwargs)
            missing = [n for n, p in signature.parameters.items() if n not in bound.arguments and p.default is p.empty]
            assert not missing, f"{self.fn.__name__} launched without {missing}"
            self.calls.append((self.fn.__name__, tuple(grid), dict(bound.arguments), options))
            return types.SimpleNamespace(run=None)  # a compiled kernel without Triton's launcher

        return launch


@pytest.fixture
def launches(monkeypatch):
    calls, helper_calls = [], []
    for name in KERNELS:
        monkeypatch.setattr(fg, name, _Recorder(getattr(fg, name), calls))
    from impl.attention import flash_triton

    for name in TRITON_HELPERS:
        monkeypatch.setattr(flash_triton, name, _Recorder(getattr(flash_triton, name), helper_calls,
                                                          ("num_warps", "num_stages", "enable_fp_fusion", "maxnreg")))
    monkeypatch.setattr(fg, "_validate", lambda q, k, v, causal, scale: scale or q.shape[-1] ** -0.5)
    # The Gluon kernels at every grid (the one-launch backward and the Triton forward on small ones
    # have tests of their own)
    monkeypatch.setattr(fg, "ONE_LAUNCH_CONFIGS", {})
    monkeypatch.setattr(fg, "TRITON_FORWARD_KEYS", {})
    monkeypatch.setattr(fg, "_PLANS", fg.PlanCache(16))
    monkeypatch.setattr(fg, "_plan", fg._PLANS.get)
    return calls


def _record_triton_kernel(monkeypatch, name) -> list:
    """The Triton flavour's kernel ``name`` replaced by a recorder; its launches' list."""
    from impl.attention import flash_triton

    calls = []
    monkeypatch.setattr(flash_triton, name, _Recorder(getattr(flash_triton, name), calls,
                                                      ("num_warps", "num_stages", "enable_fp_fusion", "maxnreg")))
    return calls


def _inputs(shape_q, n_k, transposed):
    *lead, n_q, d = shape_q
    make = (lambda n: torch.randn(*lead[:-1], n, lead[-1], d).transpose(-3, -2)) if transposed and len(lead) >= 2 else (
        lambda n: torch.randn(*lead, n, d))
    return (make(n_q).to(torch.bfloat16), make(n_k).to(torch.bfloat16), make(n_k).to(torch.bfloat16))


@pytest.fixture(params=[False, True], ids=["default", "deterministic"])
def deterministic(request):
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(request.param)
    yield request.param
    torch.use_deterministic_algorithms(was[0], warn_only=was[1])


@pytest.mark.parametrize("shape_q, n_k, causal, transposed", [
    ((2, 3, 100, 64), 100, True, False),
    ((1, 2, 300, 128), 77, False, True),
    ((129, 64), 129, True, False),
    ((2, 2, 3, 65, 128), 200, False, False),
    ((2, 77, 128), 290, True, False),
    ((3, 50, 200, 64), 200, True, False),  # 300 forward work items: more than the programs
    ((1, 2, 1000, 64), 1000, True, False),  # 16 query tiles of 8 key tiles: the forward's keys in 4 splits
    ((3, 700, 128), 1500, False, False),  # 18 query tiles of 12 key tiles: 4 splits
])
def test_every_launch_binds_to_its_kernel_with_the_tables_tiles(launches, deterministic, shape_q, n_k, causal,
                                                                  transposed):
    q, k, v = _inputs(shape_q, n_k, transposed)
    o, lse = fg.flash_forward(q, k, v, causal)
    assert o.shape == q.shape and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    dq, dk, dv = fg.flash_backward(q, k, v, o, lse, torch.randn_like(o), causal)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)

    d = q.shape[-1]
    q4 = fg.as_4d(q)
    bh, n_q = q4.shape[0] * q4.shape[1], q4.shape[2]
    kernels, tables, fused = _plan_of(d, causal)
    assert fused == (not deterministic)  # five products at both head dims outside deterministic mode
    assert [c[0] for c in launches] == list(kernels)
    for name, grid, args, options in launches:
        cfg = tables[name] if name != "_flash_fwd_kernel" else _forward_config(bh, n_q, d)
        assert (args["BLOCK_M"], args["BLOCK_N"], args["STAGES"], args["HEAD_DIM"]) == (
            cfg.block_m, cfg.block_n, cfg.stages, d), name
        assert args["num_warps"] == cfg.num_warps and options == {"maxnreg": cfg.maxnreg}, name
        assert args["IS_CAUSAL"] is causal and args["n_q"] == n_q and args["n_k"] == n_k, name
        assert 1 <= args["group_heads"] <= bh, name
        rows = cfg.block_n if name == "_flash_bwd_dkdv_kernel" else cfg.block_m
        tiles = triton.cdiv(n_k if name == "_flash_bwd_dkdv_kernel" else n_q, rows)
        if name == "_flash_fwd_kernel":  # persistent: at most a program an SM, each walking work items
            splits = fg._forward_splits(bh * tiles, triton.cdiv(n_k, cfg.block_n), q.device, head_dim=d)
            assert tuple(grid) == (fg._forward_programs(bh * tiles * splits, causal, True, q.device), 1, 1), name
            assert args["n_bh"] == bh and args["n_splits"] == splits and args["SPLIT"] == (splits > 1), name
            # every key tile in exactly one split
            assert args["chunk"] * splits >= triton.cdiv(n_k, cfg.block_n) > args["chunk"] * (splits - 1), name
            if splits > 1:  # the splits' sums, in float32, for the combine kernel
                assert args["o_ptr"].shape == (splits * bh, n_q, d) and args["o_ptr"].dtype == torch.float32, name
                assert args["lse_ptr"].shape == (splits * bh, 2, n_q), name
        elif name == "_flash_bwd_dkdv_kernel" and fused and d > 64 and causal:  # query rows, causal: heads fastest
            assert tuple(grid) == (bh, tiles, 1) and args["group_heads"] == bh, name
        else:  # one-dimensional, a group of heads' tiles adjacent (_tile_and_head)
            assert tuple(grid) == (bh * tiles, 1, 1), name
        if name == "_flash_fwd_kernel":  # two consumers overlapping their own products, or three in turn
            assert args["CONSUMERS"] == cfg.consumers and args["OVERLAP"] is (cfg.consumers == 2), name
            assert not (args["SPLIT"] and cfg.consumers == 3), name  # a causal split of 192 rows could hold no keys
        for param, tile in DESCRIPTOR_ROWS[name].items():
            desc = args[param]
            assert isinstance(desc, TensorDescriptor), f"{name}.{param} is a {type(desc).__name__}"
            n = n_q if param in ("q_desc", "do_desc", "dqacc_desc") else n_k
            assert list(desc.shape) == [*q4.shape[:2], n, d], f"{name}.{param} covers {desc.shape}"
            # d 128 at five products (scores in query rows): each consumer adds half of dQ's columns
            cols = d // 2 if param == "dqacc_desc" and fused and d > 64 else d
            rows = args[tile]
            if name == "_flash_fwd_kernel" and param == "q_desc" and rows & (rows - 1):
                rows //= args["CONSUMERS"]  # TMA boxes are powers of two: Q of 192 rows lands as three
            assert list(desc.block_shape) == [1, 1, rows, cols], f"{name}.{param} box {desc.block_shape}"
        if name == "_flash_bwd_dkdv_kernel":
            assert args["FUSE_DQ"] is fused, name
            # five products: the float32 dQ the reductions add into; seven: q stands in, unread
            assert args["dqacc_desc"].base.dtype == (torch.float32 if fused else q.dtype), name


@pytest.mark.parametrize("shape, causal, wide", [
    ((4, 16, 4096, 128), False, True),  # the tracked d 128 shape: 22 items of 192 rows a head
    ((1, 16, 16384, 64), True, True),  # the leaderboard's
    ((2, 16, 1024, 64), True, True),
    ((1, 1, 4096, 128), True, False),  # B1 H1: the keys in splits, so 128-row tiles
    ((1, 1, 4096, 64), False, False),
    ((1, 40, 1000, 128), False, True),  # the laws' 40 heads of a thousand keys
    ((1, 16, 640, 128), True, False),  # 80 query tiles of 128 rows, 64 items of 192: fewer than the SMs
    ((1, 1, 128, 128), False, False),  # one tile
])
def test_forwards_of_a_wave_of_192_row_items_run_three_consumers_of_64_rows(launches, shape, causal, wide):
    """A forward whose grid has at least a wave of 192-row work items (one an SM) runs them over
    three consumers of 64 rows, Q in three 64-row boxes and no key splits; a smaller grid, split or
    not, runs 128-row tiles over two consumers; a kept mutant takes the kernel the grid takes."""
    q = torch.empty(shape, dtype=torch.bfloat16)
    fg.flash_forward(q, q, q, causal)
    (name, grid, args, _), = launches
    assert (args["BLOCK_M"], args["CONSUMERS"], args["OVERLAP"]) == ((192, 3, False) if wide else (128, 2, True))
    assert not (wide and args["SPLIT"])
    assert args["q_desc"].block_shape[2] == (64 if wide else 128) and args["n_q"] == shape[2]
    # a kept mutant takes the same kernel, so the laws see its bug where the flavour runs
    launches.clear()
    fg.flash_forward(q, q, q, causal, mutant=fg.MUTANTS["rescale_skipped"])
    assert launches[0][2]["CONSUMERS"] == args["CONSUMERS"]


def test_grids_group_as_many_heads_as_fit_a_share_of_l2():
    """Every head at once where all heads' streamed operands fit in L2 (heads fastest, the
    causal grids longest-first across all); otherwise groups that fill L2_SHARE of it, at
    least one head (_tile_and_head's order)."""
    cpu = torch.device("cpu")
    l2 = fg._l2_bytes(cpu)
    assert fg._group_heads(48, l2 // 48, cpu) == 48  # all fit
    per_head = l2 // 16
    assert fg._group_heads(64, per_head, cpu) == int(fg.L2_SHARE * l2) // per_head  # a quarter: 4 heads
    assert fg._group_heads(64, 2 * l2, cpu) == 1  # one head larger than L2
    assert fg._group_heads(3, l2, cpu) == 1


def test_persistent_forward_runs_a_program_an_sm_unless_causal_items_restart_each_group(launches):
    """The forward's grid: at most a program an SM (each walking its rounds of work items) for
    full attention, and for causal where every head is one group (the items shorten in one
    run, which the snake rounds balance); one program an item for causal in groups of heads."""
    programs = fg._resident_programs(torch.device("cpu"))
    assert fg._forward_programs(1000, False, False, torch.device("cpu")) == programs
    assert fg._forward_programs(1000, True, True, torch.device("cpu")) == programs
    assert fg._forward_programs(1000, True, False, torch.device("cpu")) == 1000
    assert fg._forward_programs(7, False, True, torch.device("cpu")) == 7
    q, k, v = _inputs((3, 50, 200, 64), 200, False)  # 300 items
    fg._PLANS.clear()
    for causal, group, expected in ((True, 150, programs), (True, 4, 300), (False, 4, programs)):
        launches.clear()
        fg._PLANS.clear()
        fg._group_heads, saved = (lambda n_heads, per_head_bytes, device, group=group: group), fg._group_heads
        try:
            fg.flash_forward(q, k, v, causal)
        finally:
            fg._group_heads = saved
        (name, grid, args, _), = launches
        assert name == "_flash_fwd_kernel" and tuple(grid) == (expected, 1, 1), (causal, group, grid)


def test_forward_splits_the_keys_only_where_query_tiles_leave_sms_idle():
    """Split-KV where the query tiles fill few SMs: a power of two, items x splits within a
    program an SM, and at least MIN_SPLIT_TILES key tiles a split; no split on a full grid or
    with few keys."""
    cpu = torch.device("cpu")
    programs = fg._resident_programs(cpu)
    assert fg._forward_splits(programs, 512, cpu) == 1  # a full grid
    assert fg._forward_splits(programs // 2 + 1, 512, cpu) == 1
    assert fg._forward_splits(1, 1, cpu) == 1  # one key tile: nothing to split
    assert fg._forward_splits(1, 3, cpu) == 2  # three key tiles: four splits would leave one none
    assert fg._forward_splits(2, 2, cpu) == 2  # B1 H1 N 256, no head dim given: a key tile a split
    assert fg._forward_splits(32, 32, cpu) == 4  # B1 H1 N4096 d64 (128-row tiles): 128 programs
    assert fg._forward_splits(8, 8, cpu) == 8  # N 1024: 64 programs, a key tile each
    # d 64 splits only from four key tiles (MIN_KEY_TILES_TO_SPLIT): N 256 and 384 run unsplit, one launch
    assert fg._forward_splits(2, 2, cpu, head_dim=64) == 1 and fg._forward_splits(3, 3, cpu, head_dim=64) == 1
    assert fg._forward_splits(4, 4, cpu, head_dim=64) == 4 and fg._forward_splits(2, 2, cpu, head_dim=128) == 2
    for items in (1, 5, 17, 40, 70):
        for key_tiles in (1, 2, 7, 64, 513):
            splits = fg._forward_splits(items, key_tiles, cpu)
            assert splits & (splits - 1) == 0 and items * splits <= max(programs, items)
            assert splits == 1 or key_tiles // splits >= fg.MIN_SPLIT_TILES
            assert items * splits * 2 > programs or key_tiles // (2 * splits) < fg.MIN_SPLIT_TILES  # the largest


def _early_combines_that_do_not_wait(plans: dict) -> list:
    """The plans (by N) whose combine is launched as the forward's programmatic dependent (it
    may start while the forward still runs) but does not wait for the forward's grid
    (WAIT_PRIOR: griddepcontrol.wait) before reading the splits' sums."""
    return [n for n, plan in plans.items()
            if plan.combine.options["launch_pdl"] and not plan.combine.constexprs["WAIT_PRIOR"]]


@pytest.mark.parametrize("mutant", [0, fg.MUTANTS["combine_reads_before_the_forward_ends"]],
                         ids=["kernel", "combine_reads_before_the_forward_ends"])
def test_split_forward_combine_is_a_waiting_programmatic_dependent_only_beside_idle_sms(launches, monkeypatch,
                                                                                        mutant):
    """The combine is launched as the split forward's programmatic dependent only where the
    forward's grid leaves half the SMs idle, and then it waits for the forward before reading
    the splits' sums (``_early_combines_that_do_not_wait`` finds none); its loops are unrolled
    for the plan's split count.  The kept mutant drops the wait, and the check names its early
    plans: this test is what rejects it.  On an H200 the race showed in one of four GPU law runs
    (perf/results/2026-11-28-h200-split-combine): where the plan launches early the forward takes
    5-10 us, about the dependent's own launch latency, so reading too soon is seldom seen."""
    from impl.attention import flash_triton

    monkeypatch.setattr(flash_triton, "_options", lambda device, num_warps, num_stages, fp_fusion=False: dict(
        num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=fp_fusion))  # as on a GPU
    sms = fg._resident_programs(torch.device("cpu"))
    plans = {}
    for n in (512, 1000, 2048, 4096):
        q, k, v = _inputs((1, 1, n, 64), n, False)
        plans[n] = plan = fg._forward_plan(q, k, v, False, None, mutant)[0]
        splits = plan.launch.rest[-2]  # the launch's scalars end (..., n_splits, chunk)
        assert splits > 1 and plan.combine.constexprs["SPLITS"] == splits, n
        assert plan.combine.options["launch_pdl"] is (2 * plan.launch.grid[0] <= sms), (n, plan.launch.grid)
        assert plan.launch.direct_ok and plan.combine.direct_ok, n  # constexprs last, in signature order
    early = [n for n, plan in plans.items() if plan.combine.options["launch_pdl"]]
    assert early == [512, 1000]  # both sides of the rule drawn: 16 and 64 programs early, 128 plain
    assert _early_combines_that_do_not_wait(plans) == (early if mutant else [])


def test_causal_forward_splits_only_where_every_row_sees_the_first_key_of_its_splits(launches):
    """With key tiles smaller than query tiles a causal split could start past a row's last
    key (NaN sums for that row): the plan does not split then; full attention still does."""
    q, k, v = _inputs((1, 1, 2000, 64), 2000, False)  # 16 query tiles: split with the table's tiles
    saved = fg.FORWARD_CONFIGS
    try:
        for causal, configs, split in ((True, saved, True), (True, {64: fg.GluonConfig(128, 64, 2)}, False),
                                       (False, {64: fg.GluonConfig(128, 64, 2)}, True)):
            fg.FORWARD_CONFIGS = configs
            launches.clear()
            fg._PLANS.clear()
            fg.flash_forward(q, k, v, causal)
            (name, grid, args, _), = launches
            assert args["SPLIT"] is split and (args["n_splits"] > 1) == split, (causal, configs)
    finally:
        fg.FORWARD_CONFIGS = saved


def _roles(calls, inputs):
    """The recorded launches with each tensor named by its role: an input by its name, any other
    by the order it first appeared in (so a buffer shared by two launches is seen as shared)."""
    names, seen = {t.data_ptr(): name for name, t in inputs.items()}, {}

    def role(value):
        if isinstance(value, TensorDescriptor):
            return ("descriptor", role(value.base), tuple(value.shape), tuple(value.strides), tuple(value.block_shape))
        if isinstance(value, torch.Tensor):
            ptr = value.data_ptr()
            name = names.get(ptr) or seen.setdefault(ptr, f"buffer {len(seen)}")
            return (name, tuple(value.shape), value.stride(), value.dtype)
        return value

    return [(name, grid, {k: role(v) for k, v in args.items()}, options) for name, grid, args, options in calls]


@pytest.fixture
def emulated_passes(monkeypatch):
    """Call graphs off, the C++ launcher on, and ``native_launch``'s passes emulated as
    csrc/native_launch.cpp runs them (outputs by the registered sizes, strides and dtypes;
    scratch; each launch handed the tensors its binding names): (registered passes, ids run)."""
    registered, runs = [], []

    def register_pass(n_inputs, steps, outputs, scratch):
        assert all(step.native is None for step, _ in steps)  # the fake: no C++ launch ids here
        registered.append((n_inputs, steps, outputs, scratch))
        return len(registered) - 1

    def run_pass(pass_id, stream, inputs):
        runs.append(pass_id)
        n_inputs, steps, outputs, scratch = registered[pass_id]
        assert len(inputs) == n_inputs and stream == 7
        made = [torch.empty_strided(size, strides, dtype=dtype) for size, strides, dtype in outputs]
        named = [*inputs, *made, *(torch.empty(size, dtype=dtype) for size, dtype in scratch)]
        for step, binding in steps:
            step._through_triton(tuple(named[i] for i in binding))
        return made

    monkeypatch.setattr(fg.call_graphs, "ENABLED", False)
    monkeypatch.setenv("LLM_SYSTEMS_NATIVE_LAUNCH", "1")
    monkeypatch.setattr(fg.native_launch, "register_pass", register_pass)
    monkeypatch.setattr(fg.native_launch, "run_pass", run_pass)
    monkeypatch.setattr(fg.native_launch, "bind", None)  # the Function's C++ keys: see bound_passes
    monkeypatch.setattr(fg.native_launch, "run_bound", None)
    monkeypatch.setattr(fg.native_launch, "bound_pass", None)
    monkeypatch.setattr(fg, "fast_stream", lambda index: 7)
    monkeypatch.setattr(fg.Launch, "issue", lambda self, stream, *tensors: self._through_triton(tensors))
    return registered, runs


@pytest.fixture
def bound_passes(monkeypatch, emulated_passes):
    """``emulated_passes`` with the C++ key table emulated as csrc/native_launch.cpp keeps it
    (``bind``, ``run_bound``: kind, each tensor's signature, causal, scale sent, the deterministic
    mode for a backward): (bindings made, run_bound's calls as "hit" or "miss")."""
    table, binds, looks = {}, [], []

    def key(kind, tensors, is_causal, scale):
        assert type(is_causal) is bool and type(scale) is float  # what the C++ signature converts
        return (kind, fg.signature(*tensors), is_causal, scale,
                kind == 1 and torch.are_deterministic_algorithms_enabled())

    def bind(kind, tensors, is_causal, scale, pass_id):
        binds.append((kind, pass_id))
        table[key(kind, tensors, is_causal, scale)] = pass_id

    def run_bound(kind, stream, tensors, is_causal, scale):
        pass_id = table.get(key(kind, tensors, is_causal, scale))
        looks.append("miss" if pass_id is None else "hit")
        return None if pass_id is None else fg.native_launch.run_pass(pass_id, stream, tensors)

    def bound_pass(kind, tensors, is_causal, scale):
        return table.get(key(kind, tensors, is_causal, scale), -1)

    monkeypatch.setattr(fg.native_launch, "bind", bind)
    monkeypatch.setattr(fg.native_launch, "run_bound", run_bound)
    monkeypatch.setattr(fg.native_launch, "bound_pass", bound_pass)
    return binds, looks


@pytest.mark.parametrize("one_launch", [False, True], ids=["gluon-backward", "one-launch-backward"])
@pytest.mark.parametrize("shape_q, n_k, causal, transposed", [
    ((2, 3, 100, 64), 100, True, False),
    ((1, 2, 300, 128), 77, False, True),  # (B, N, H, d) storage: outputs in the inputs' layout
    ((1, 2, 1000, 64), 1000, True, False),  # the forward's keys in 4 splits: the combine and its scratch
])
def test_the_native_pass_issues_what_the_python_path_issues(launches, deterministic, monkeypatch, emulated_passes,
                                                             shape_q, n_k, causal, transposed, one_launch):
    """With call graphs off and the C++ launcher on, a plan registers its call as one C++ pass
    (``native_launch.register_pass``) after its first call through Python, and every launch of
    the second call (through the pass), Gluon's and the Triton helpers', must match the first
    call's.  These grids are small enough for the one-launch backward where it is on."""
    from impl.attention import flash_triton

    if one_launch:
        if not ONE_LAUNCH_CONFIGS:
            pytest.skip("the one-launch backward is switched off (LLM_SYSTEMS_GLUON_ONE_LAUNCH=0)")
        monkeypatch.setattr(fg, "ONE_LAUNCH_CONFIGS", ONE_LAUNCH_CONFIGS)
    helpers = []
    for name in TRITON_HELPERS:
        monkeypatch.setattr(flash_triton, name, _Recorder(getattr(flash_triton, name), helpers,
                                                          ("num_warps", "num_stages", "enable_fp_fusion", "maxnreg")))
    registered, runs = emulated_passes
    q, k, v = _inputs(shape_q, n_k, transposed)
    grad_o = torch.randn_like(q)
    recorded = []
    for _ in range(2):  # through Python (registering the passes), then through the passes
        launches.clear(), helpers.clear()
        o, lse = fg.flash_forward(q, k, v, causal)
        dq, dk, dv = fg.flash_backward(q, k, v, o, lse, grad_o, causal)
        assert (o.shape, dq.shape, dk.shape, dv.shape) == (q.shape, q.shape, k.shape, v.shape)
        assert (o.stride(), dq.stride(), dk.stride(), dv.stride()) == (q.stride(), q.stride(), k.stride(), v.stride())
        named = dict(q=q, k=k, v=v, grad_o=grad_o)
        recorded.append((_roles(launches, named), _roles(helpers, named), lse.shape, lse.dtype))
    assert len(registered) == 2 and runs == [0, 1]  # the forward's pass and the backward's, each run once
    assert recorded[1] == recorded[0]
    assert one_launch == any(call[0] == "_flash_bwd_one_launch_kernel" for call in recorded[0][1])


def _one_launch_threshold(d):
    """(batch-heads at a 64-long sequence whose one-launch grid is the largest that takes it, its
    programs): dQ and dK/dV programs together within the config's share of the SMs."""
    cfg, share = ONE_LAUNCH_CONFIGS[d]
    per_head = triton.cdiv(64, cfg.dq_block_m) + triton.cdiv(64, cfg.dkdv_block_n)
    limit = int(share * fg._resident_programs(torch.device("cpu")))
    return limit // per_head, per_head


@pytest.mark.parametrize("d", sorted(ONE_LAUNCH_CONFIGS))
@pytest.mark.parametrize("causal", [True, False])
def test_small_grids_take_the_one_launch_backward_larger_ones_and_mutants_the_gluon_kernels(launches, monkeypatch,
                                                                                          d, causal):
    """Up to the head dim's share of the SMs (dQ and dK/dV programs counted together) the
    backward is one launch of the Triton flavour's one-launch kernel, bound to its signature:
    q, k, v, O, dO, L in, dQ, dK, dV out (shaped and laid out like q, k, v), the grid every dQ
    program then every dK/dV program, the config's tiles, pointer loads (no in-kernel
    descriptors: the C++ launcher takes no global scratch).  One batch-head more, and a kept
    mutant of the Gluon kernels at any grid, take the Gluon kernels."""
    helpers = _record_triton_kernel(monkeypatch, "_flash_bwd_one_launch_kernel")
    monkeypatch.setattr(fg, "ONE_LAUNCH_CONFIGS", ONE_LAUNCH_CONFIGS)
    cfg, _ = ONE_LAUNCH_CONFIGS[d]
    heads, per_head = _one_launch_threshold(d)
    for bh, mutant, expect_one in ((heads, 0, True), (heads + 1, 0, False), (1, fg.MUTANTS["rescale_skipped"], False)):
        q, k, v = _inputs((bh, 64, d), 64, False)
        o, lse = torch.randn_like(q), torch.randn(bh, 64)
        grad_o = torch.randn_like(q)
        launches.clear(), helpers.clear()
        dq, dk, dv = fg.flash_backward(q, k, v, o, lse, grad_o, causal, mutant=mutant)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        gluon = [c[0] for c in launches]
        if not expect_one:
            assert not helpers and "_flash_bwd_dkdv_kernel" in gluon, (bh, mutant, gluon)
            continue
        assert not gluon, gluon
        (name, grid, args, options), = helpers
        assert tuple(grid) == (bh * per_head, 1, 1) and args["n_dq_programs"] == bh * triton.cdiv(64, cfg.dq_block_m)
        assert (args["DQ_BLOCK_M"], args["DQ_BLOCK_N"], args["DKDV_BLOCK_M"], args["DKDV_BLOCK_N"]) == (
            cfg.dq_block_m, cfg.dq_block_n, cfg.dkdv_block_m, cfg.dkdv_block_n)
        assert args["USE_TMA"] is False and args["IS_CAUSAL"] is causal and args["HEAD_DIM"] == d
        for param, t in (("Q", q), ("K", k), ("V", v), ("O", o), ("DO", grad_o), ("L", lse),
                         ("DQ", dq), ("DK", dk), ("DV", dv)):
            assert args[param].data_ptr() == t.data_ptr(), param


@pytest.mark.parametrize("causal", [True, False])
def test_few_keys_on_small_grids_take_the_triton_forward_the_rest_and_mutants_the_gluon_kernel(launches, monkeypatch,
                                                                                               causal):
    """A forward over at most TRITON_FORWARD_KEYS[d] keys whose 128-row query tiles are at most
    one an SM is one launch of the Triton flavour's forward kernel, as that flavour's own plan
    launches it (its config, no split), with q, k, v, O and L at the call's addresses and O
    laid out like q, in every layout (pointer loads: nothing copied).  One key more, one
    batch-head more, another head dim, and a kept mutant of the Gluon kernels take the Gluon
    kernel."""
    from impl.attention import flash_triton

    if not TRITON_FORWARD_KEYS:
        pytest.skip("the Triton forward is switched off (LLM_SYSTEMS_GLUON_ONE_LAUNCH=0)")
    helpers = _record_triton_kernel(monkeypatch, "_flash_fwd_kernel")
    monkeypatch.setattr(fg, "TRITON_FORWARD_KEYS", TRITON_FORWARD_KEYS)
    programs = fg.TRITON_FORWARD_WAVES * fg._resident_programs(torch.device("cpu"))
    for d, keys in TRITON_FORWARD_KEYS.items():
        cases = [((1, 1, 100, d), keys, False, 0, True), ((programs, 128, d), keys, False, 0, True),
                 ((2, 3, 128, d), keys, True, 0, True),  # stored (B, N, H, d): strides as they come
                 ((6, 128, d), keys, "rows_off_16_bytes", 0, True),  # no TMA could read it: not copied either
                 ((1, 1, 100, d), keys + 1, False, 0, False), ((programs + 1, 128, d), keys, False, 0, False),
                 ((2, 64, 257, d), 64, False, 0, False),  # 3 query tiles of 128 heads: 384 > 264 programs
                 ((1, 1, 100, d), keys, False, fg.MUTANTS["rescale_skipped"], False)]
        for shape_q, n_k, layout, mutant, expect_triton in cases:
            if layout == "rows_off_16_bytes":  # rows of d + 4 columns, the last 4 cut off
                q, k, v = (torch.randn(shape_q[0], n, d + 4).to(torch.bfloat16)[..., :d]
                           for n in (shape_q[1], n_k, n_k))
            else:
                q, k, v = _inputs(shape_q, n_k, layout)
            launches.clear(), helpers.clear()
            o, lse = fg.flash_forward(q, k, v, causal, mutant=mutant)
            assert o.shape == q.shape and lse.shape == q.shape[:-1] and o.stride() == fg.dense_strides_like(q)
            gluon = [c[0] for c in launches]
            if not expect_triton:
                assert not helpers and gluon == ["_flash_fwd_kernel"], (shape_q, n_k, mutant, gluon)
                continue
            assert not gluon, (shape_q, n_k, gluon)
            (_, grid, args, _), = helpers
            own = flash_triton._ForwardPlan(q, k, v, causal, None)
            assert tuple(grid) == tuple(own.launch.grid) + (1,) * (3 - len(own.launch.grid))
            assert args["SPLIT_KEYS"] == 0 and args["IS_CAUSAL"] is causal and args["HEAD_DIM"] == d
            for param, t in (("Q", q), ("K", k), ("V", v), ("O", o), ("L", lse)):
                assert args[param].data_ptr() == t.data_ptr(), param
            q4 = fg.as_4d(q)
            assert tuple(args[f"stride_q{dim}"] for dim in "bhnd") == q4.stride()
    for d in sorted(set(fg.GLUON_HEAD_DIMS) - set(TRITON_FORWARD_KEYS)):  # a head dim it does not take
        q, k, v = _inputs((1, 1, 100, d), 64, False)
        launches.clear(), helpers.clear()
        fg.flash_forward(q, k, v, causal)
        assert not helpers and [c[0] for c in launches] == ["_flash_fwd_kernel"], d


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "rows_off_16_bytes", "head_dim_strided"])
def test_the_one_launch_backward_reads_each_tensor_with_its_own_strides(launches, monkeypatch, layout):
    """The one launch reads by pointers with the strides the plan fixed, so every tensor it is
    handed must have exactly those strides, in every layout, TMA-readable or not (rows whose
    stride is no multiple of 16 bytes, a head dim that is not contiguous: the Gluon kernels
    take copies of those, which the one launch must not be handed with the originals'
    strides).  Its gradients come out laid out like q, k, v."""
    if not ONE_LAUNCH_CONFIGS:
        pytest.skip("the one-launch backward is switched off (LLM_SYSTEMS_GLUON_ONE_LAUNCH=0)")
    helpers = _record_triton_kernel(monkeypatch, "_flash_bwd_one_launch_kernel")
    monkeypatch.setattr(fg, "ONE_LAUNCH_CONFIGS", ONE_LAUNCH_CONFIGS)
    B, H, N, d = 2, 3, 100, 64

    def make():
        if layout == "transposed":
            return torch.randn(B, N, H, d).transpose(1, 2).to(torch.bfloat16)
        if layout == "rows_off_16_bytes":  # 68 columns: a row is 136 bytes
            return torch.randn(B, H, N, d + 4).to(torch.bfloat16)[..., :d]
        if layout == "head_dim_strided":
            return torch.randn(B, H, d, N).to(torch.bfloat16).transpose(-1, -2)
        return torch.randn(B, H, N, d).to(torch.bfloat16)

    q, k, v, grad_o = make(), make(), make(), make()
    o, lse = torch.randn_like(q), torch.randn(B, H, N)
    for _ in range(2):  # the plan's first call and a repeat
        helpers.clear()
        dq, dk, dv = fg.flash_backward(q, k, v, o, lse, grad_o, True)
        (_, _, args, _), = helpers
        for param, prefix in (("Q", "q"), ("K", "k"), ("V", "v"), ("O", "o"), ("DO", "do"),
                              ("DQ", "dq"), ("DK", "dk"), ("DV", "dv")):
            fixed = tuple(args[f"stride_{prefix}{dim}"] for dim in "bhnd")
            assert args[param].stride() == fixed, f"{layout}: {param} has strides {args[param].stride()}, " \
                                                   f"the launch reads it with {fixed}"
        assert (dq.stride(), dk.stride(), dv.stride()) == tuple(fg.dense_strides_like(t) for t in (q, k, v))


def test_a_plans_pass_gives_way_to_call_graphs_switched_on_later(launches, monkeypatch, emulated_passes):
    """``call_graphs.ENABLED`` is read on every call: a plan that bound its C++ pass while the
    graphs were off goes through its graphs once they are switched on, and back to the pass
    once they are off again (gate run 31: a plan that kept its pass bypassed the graphs)."""
    registered, runs = emulated_passes
    q, k, v = _inputs((1, 2, 100, 64), 100, False)
    fg.flash_forward(q, k, v, True)  # through Python: registers the pass
    fg.flash_forward(q, k, v, True)
    assert len(registered) == 1 and runs == [0]
    monkeypatch.setattr(fg.call_graphs, "ENABLED", True)
    fg.call_graphs.clear()
    fg.flash_forward(q, k, v, True)
    assert runs == [0], "a call with the graphs on ran the C++ pass"
    assert fg.call_graphs.stats()["direct"] == 1  # the graphs took it (direct on this CPU: nothing to record)
    monkeypatch.setattr(fg.call_graphs, "ENABLED", False)
    fg.flash_forward(q, k, v, True)
    assert runs == [0, 0]


def _function_call(fn, q, k, v, causal, scale=None):
    """O, then dQ, dK, dV of a loss with a fixed dO, through the autograd.Function ``fn``."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = fn.apply(q, k, v, causal, scale)
    o.backward(torch.ones_like(o))
    return o, q.grad, k.grad, v.grad


@pytest.mark.parametrize("shape_q, n_k, causal, transposed", [
    ((2, 3, 100, 64), 100, True, False),
    ((1, 2, 300, 128), 77, False, True),
    ((1, 2, 1000, 64), 1000, True, False),  # the forward's keys in 4 splits
])
def test_the_functions_repeats_run_the_pass_bound_to_their_key(launches, deterministic, emulated_passes, bound_passes,
                                                                shape_q, n_k, causal, transposed):
    """The autograd.Function binds the pass its plan registered to the call's C++ key, and a
    repeat of that signature (other tensors) runs it by ``run_bound`` with the launches the
    plan's path made, outputs laid out as they were; in the other deterministic mode the
    backward's key is another."""
    registered, runs = emulated_passes
    binds, looks = bound_passes
    q, k, v = _inputs(shape_q, n_k, transposed)
    recorded = []
    for call in range(3):
        launches.clear()
        inputs = dict(zip("qkv", (t.clone() for t in (q, k, v))))  # the same signature at other addresses
        o, dq, dk, dv = _function_call(fg.FlashAttentionGluon, *inputs.values(), causal)
        recorded.append((_roles(launches, inputs), o.stride(), dq.stride(), dk.stride(), dv.stride()))
    assert looks == ["miss", "miss"] + ["hit", "hit"] * 2, looks
    assert binds == [(0, 0), (1, 1)] and runs == [0, 1] * 2
    assert recorded[2] == recorded[1] == recorded[0]
    torch.use_deterministic_algorithms(not deterministic)
    looks.clear()
    _function_call(fg.FlashAttentionGluon, q, k, v, causal)
    assert looks == ["hit", "miss"], "a backward's key ignored the deterministic mode"


def test_the_function_binds_nothing_for_a_mutant_for_other_scalar_types_or_with_call_graphs_on(
        launches, monkeypatch, emulated_passes, bound_passes):
    """No pass is bound where the C++ key could not tell the call apart as the plan's key does
    (is_causal given as 1, an integer scale) or where the call is a kept mutant's (its pass
    must never serve the kernel's calls); with the call graphs on, run_bound is not asked.
    (The backward of is_causal=1 holds it as a bool, so it keys and binds as True's.)"""
    binds, looks = bound_passes
    q, k, v = _inputs((1, 2, 100, 64), 100, False)
    _function_call(fg.mutant_function("rescale_skipped"), q, k, v, True)
    _function_call(fg.FlashAttentionGluon, q, k, v, True, 1)
    assert binds == [] and looks == [], (binds, looks)
    _function_call(fg.FlashAttentionGluon, q, k, v, 1)
    assert [kind for kind, _ in binds] == [1], binds
    binds.clear()
    _function_call(fg.FlashAttentionGluon, q, k, v, True, 0.125)
    assert [kind for kind, _ in binds] == [0, 1]
    monkeypatch.setattr(fg.call_graphs, "ENABLED", True)
    looks.clear()
    _function_call(fg.FlashAttentionGluon, q, k, v, True, 0.125)
    assert looks == [], "run_bound was asked with the call graphs on"


@pytest.mark.parametrize("fn_name, shares", [("kernel", False), ("bound_key_without_strides", True)])
def test_the_bound_key_mutant_runs_one_layouts_pass_for_another(launches, emulated_passes, bound_passes, fn_name,
                                                               shares):
    """The kept mutant bound_key_without_strides (a key that forgets the tensors' layout) hands a
    call of the same shapes in another layout the first layout's passes, whose launches fix the
    first layout's strides (the GPU law results_do_not_depend_on_earlier_calls rejects it); the
    kernel's key tells the layouts apart, so the second layout gets passes of its own."""
    registered, runs = emulated_passes
    fn = fg.FlashAttentionGluon if fn_name == "kernel" else fg.mutant_function(fn_name)
    contiguous = _inputs((1, 2, 100, 64), 100, False)
    transposed = _inputs((1, 2, 100, 64), 100, True)
    assert [t.stride() for t in contiguous] != [t.stride() for t in transposed]
    _function_call(fn, *contiguous, True)  # through the plans: registers and binds passes 0 and 1
    runs.clear()
    _function_call(fn, *transposed, True)
    if shares:
        assert runs == [0, 1], f"the mutant's second layout ran passes {runs}, not the first layout's"
    else:
        assert 0 not in runs and 1 not in runs and len(registered) == 4, (runs, len(registered))
