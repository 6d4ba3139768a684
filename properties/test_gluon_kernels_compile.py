"""The Gluon flavour's kernels compile for Hopper (sm_90a) on any machine.

Each Gluon kernel a plan launches, and each kept mutant's, goes through Triton's compiler and
ptxas here (``conformance.laws.attention.hopper_compile``, in a child process without the
interpreter), and the result must fit one Hopper SM: at most 227 KiB of shared memory a
block, its consumer and loader partitions really warp-specialised (the schedule the module's
docstring describes), their registers handed out by ``setmaxnreg``.  No GPU is needed: a
kernel that no longer compiles, or a table entry whose buffers overflow shared memory, fails
in CI instead of on the first Hopper machine.  The d 128 forward's loop must also run its
softmax under the P V product (``check_softmax_overlaps_pv``: ptxas hoists the wait otherwise),
and the three-consumer forward and the d 128 five-product dK/dV kernel must not spill
(``check_no_spills``: the latter's held descriptors once cost it 3.5-6.2 %).
The laws that run the kernels stay "not run here" without one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

fg = pytest.importorskip("impl.attention.flash_gluon")
if fg.GLUON_IMPORT_ERROR is not None:  # pragma: no cover - a Triton without Gluon
    pytest.skip(f"not run here: this Triton has no Gluon ({fg.GLUON_IMPORT_ERROR})", allow_module_level=True)

from conformance.laws.attention.hopper_compile import (  # noqa: E402
    BACKWARD_SHAPE, HOPPER_SHARED_BYTES, check_fits_hopper, check_no_spills, check_softmax_overlaps_pv, compile_in_child,
    plan_cases, ptxas_missing)

GROUPS = plan_cases(fg.MUTANTS)
PTXAS_MISSING = ptxas_missing()
needs_ptxas = pytest.mark.skipif(PTXAS_MISSING is not None,
                                 reason=f"not run here: Triton's NVIDIA backend cannot compile ({PTXAS_MISSING})")


@needs_ptxas
@pytest.mark.parametrize("group", list(GROUPS))
def test_every_gluon_kernel_compiles_for_hopper_and_fits_an_sm(group):
    rows = compile_in_child(GROUPS[group])
    compiled = {tuple(map(str, case)) for case, name, _ in rows if name}
    assert len(compiled) == len(GROUPS[group]), f"cases without a Gluon kernel: {rows}"
    problems = [f"{case[0]} {tuple(case[1])} {case[2]} causal={case[3]} deterministic={case[4]} mutant={case[5]}: {p}"
                for case, _, found in rows for p in found]
    assert not problems, "\n".join(problems)


@needs_ptxas
def test_a_table_entry_past_hoppers_shared_memory_is_caught():
    """The check can fail: one more Q/dO ring slot at d 128 puts the dK/dV kernel's buffers past
    227 KiB (it already holds K and V, two slots, P, dS and dQ's staging)."""
    rows = compile_in_child([("backward", BACKWARD_SHAPE[:3] + (128,), "bfloat16", False, False, 0)],
                            extra_backward_stages=1)
    [(_, name, problems)] = rows
    assert name == "_flash_bwd_dkdv_kernel" and any("shared memory" in p for p in problems), rows


@needs_ptxas
def test_a_forward_whose_softmax_waits_for_its_pv_product_is_caught():
    """The overlap check can fail: d 64's forward keeps ptxas's hoisted wait for every product
    (level or slower with it held below; only d 128 holds it), so held to the check it is
    named."""
    rows = compile_in_child([("forward", (1, 16, 640, 64), "bfloat16", False, False, 0)], overlap_head_dims=(64,))
    [(_, name, problems)] = rows
    assert name == "_flash_fwd_kernel" and any("waits for every product before its softmax" in p
                                               for p in problems), rows


@needs_ptxas
def test_a_dkdv_kernel_holding_its_fixed_tiles_descriptors_in_registers_is_caught():
    """The spill check can fail, on the bug it exists for: K and V seen at the constant slot 0, so
    the compiler holds their wgmma descriptors across the loop (as before _fixed_tile_at), and
    the d 128 five-product dK/dV kernel spills; with the module's own view it does not."""
    case = ("backward", BACKWARD_SHAPE[:3] + (128,), "bfloat16", True, False, 0)
    [(_, name, problems)] = compile_in_child([case], fixed_tiles_held=True)
    assert name == "_flash_bwd_dkdv_kernel" and any("local-memory" in p for p in problems), problems
    [(_, name, problems)] = compile_in_child([case])
    assert name == "_flash_bwd_dkdv_kernel" and problems == [], problems


def test_the_spill_check_names_local_memory_and_a_sass_without_the_kernel():
    """On SASS text alone: a loop of wgmma and shared-memory loads passes; a spill reload or store
    (LDL, STL, any width) is counted; a SASS without a wgmma is named, so it never passes on nothing."""
    loop = "HGMMA.64x64x16.F32.BF16 R152, gdesc[UR44], RZ, !UPT ;\nLDS.128 R4, [R2] ;\nULDC UR4, c[0x0][0x0] ;\n"
    assert check_no_spills("k", loop) == []
    spilled = loop + "LDL.64 R20, [R1+0x18] ;\nLDL R12, [R1+0x2c] ;\nSTL [R1+0x8], R224 ;\n"
    [problem] = check_no_spills("k", spilled)
    assert "3 local-memory" in problem and "2 LDL, 1 STL" in problem, problem
    [problem] = check_no_spills("k", "")
    assert "no wgmma" in problem


def test_the_fit_check_names_each_thing_a_kernel_lacks():
    """The other two properties can fail too: a compiled kernel (its metadata and assembly, as
    Triton hands them back) without warp specialisation or register hand-out is named for each."""
    def compiled(shared, ttgir, ptx):
        return SimpleNamespace(metadata=SimpleNamespace(shared=shared), asm={"ttgir": ttgir, "ptx": ptx})

    fits = compiled(HOPPER_SHARED_BYTES, "ttg.warp_specialize", "setmaxnreg.inc.sync.aligned.u32 240;")
    assert check_fits_hopper("k", fits) == []
    lacks = check_fits_hopper("k", compiled(HOPPER_SHARED_BYTES + 16, "scf.for", "mma.sync"))
    assert len(lacks) == 3, lacks
    assert "shared memory" in lacks[0] and "not warp-specialised" in lacks[1] and "setmaxnreg" in lacks[2], lacks


def test_the_overlap_check_names_a_hoisted_wait_and_a_loop_it_cannot_see():
    """On SASS text alone: the overlapped step passes; a wait for every product right after the
    scores' wait (bar.syncs between or not) is named; so is a SASS without the step (empty, or
    a loop without the softmax between its waits), so the check never passes on nothing."""
    def text(*ops):
        return "\n".join(f"        /*{i:04x}*/    {op} ;" for i, op in enumerate(ops))

    exps = ["MUFU.EX2 R2, R2"] * 8
    step = ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
            "BAR.SYNC.DEFER_BLOCKING 0x0, 0x80"]
    assert check_softmax_overlaps_pv("k", text(*step, *exps, "WARPGROUP.DEPBAR.LE gsb0, 0x0")) == []
    hoisted = check_softmax_overlaps_pv("k", text(*step, "WARPGROUP.DEPBAR.LE gsb0, 0x0", *exps))
    assert len(hoisted) == 1 and "before its softmax" in hoisted[0], hoisted
    for unseen in ("", text(*exps), text(*step)):
        missing = check_softmax_overlaps_pv("k", unseen)
        assert len(missing) == 1 and "no loop step" in missing[0], (unseen, missing)
