"""The Gluon flavour's kernels compiled for Hopper (sm_90a) without a GPU.

Each Gluon kernel a plan of impl's Gluon flavour launches goes through Triton's compiler and
ptxas, with the plan's own constexprs, launch options and argument types (tensor descriptors
with their boxes and shared-memory layouts, pointers, integers); ``check_fits_hopper`` says
what a Hopper SM would lack of the result.  Used by ``properties/test_gluon_kernels_compile.py``
(CI) and ``perf/scripts/gluon_ptxas_report.py``.

The compiles must run where TRITON_INTERPRET is unset: under the interpreter, which the suite
switches on where there is no GPU, Triton's own library functions (the reductions ``gl.max``
and ``gl.sum`` among them) are interpreter objects that the compiler refuses.
``compile_in_child`` runs them in a child process (``python -m`` this module) for that reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
GLUON_KERNELS = ("_flash_fwd_kernel", "_flash_bwd_dq_kernel", "_flash_bwd_dkdv_kernel")
HOPPER_SHARED_BYTES = 227 * 1024  # the most a block may opt in to on an H100 or H200


def ptxas_missing() -> str | None:
    """Why nothing can be compiled here (Triton's NVIDIA backend or its ptxas absent), or None."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return None if os.path.exists(get_ptxas(90).path) else "its ptxas binary is missing"
    except Exception as exc:  # a Triton without its NVIDIA backend
        return f"{type(exc).__name__}: {exc}"


# A backward grid past the one-launch backward's (flash_gluon.ONE_LAUNCH_CONFIGS: 160 programs at
# either head dim), so that its plan launches the Gluon kernels.
BACKWARD_SHAPE = (2, 8, 300, 64)


def plan_cases(mutants: dict) -> dict:
    """Cases (pass, (B, H, N, d), dtype, causal, deterministic, kept mutant) in groups, one child
    process each.  Between them they give every specialisation the tables make: the persistent
    forward of three consumers (B2 H16 N1024: a wave of 192-row items) and of two (B1 H16 N640),
    the split forward (B1 H1 leaves SMs idle), the five-product backward and the
    deterministic seven; and each kept mutant of the schedule's kernel (``mutants``: the
    module's MUTANTS), whose rejection on a GPU means something only if it compiles (a mutant
    that failed to compile would be "rejected" by any law)."""
    forward = {
        f"forward-d{d}": [("forward", shape, dtype, causal, False, 0)
                          for shape in ((2, 16, 1024, d), (1, 16, 640, d), (1, 1, 2048, d)) for causal in (False, True)
                          for dtype in (("bfloat16", "float16") if shape[0] == 2 and causal else ("bfloat16",))]
        for d in (64, 128)
    }
    backward = {
        f"backward-d{d}": [("backward", BACKWARD_SHAPE[:3] + (d,), dtype, causal, deterministic, 0)
                           for causal in (False, True) for deterministic in (False, True)
                           for dtype in (("bfloat16", "float16") if not causal and not deterministic else ("bfloat16",))]
        for d in (64, 128)
    }
    kept = [("forward", shape, "bfloat16", True, False, mutants[name])  # both forwards: three consumers, two
            for shape in ((2, 16, 1024, 64), (1, 16, 640, 64))
            for name in ("v_slot_freed_before_its_product", "ready_phase_off_by_one", "rescale_skipped",
                         "q_freed_before_its_last_scores")]
    kept += [("forward", (1, 1, 2048, 64), "bfloat16", False, False, mutants["discarded_split_counted"])]
    kept += [("backward", BACKWARD_SHAPE[:3] + (d,), "bfloat16", False, False, mutants[name])
             for d in (64, 128) for name in ("last_dq_partial_never_added", "stats_read_from_the_next_slot")]
    return forward | backward | {"kept-mutants": kept}


def compile_launch(launch, tensors):
    """Triton's compile of ``launch`` (a triton_launch.Launch of a Gluon kernel) for sm_90a, its
    leading arguments ``tensors`` (CPU tensors: only their dtypes, shapes and strides count)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    kernel = launch.kernel
    args = [describe(t) if describe is not None else t
            for t, describe in zip(tensors, launch.descriptors + (None,) * len(tensors))]
    args += list(launch.rest)
    signature, constexprs, given = {}, {}, iter(args)
    for i, (name, param) in enumerate(zip(kernel.arg_names, kernel.params)):
        if param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[(i,)] = launch.constexprs[name]
        else:
            signature[name] = mangle_type(next(given))
    options = {"num_warps": launch.constexprs.get("num_warps", 4), **(launch.options or {})}
    return triton.compile(GluonASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def _tensors(plan, q, k, v, lse):
    """CPU tensors for a plan's TENSORS: inputs and outputs shaped as the call's, scratch as the
    plan keeps it (None for a scratch name the plan keeps nothing for, and launches nothing with)."""
    like = {"q": q, "k": k, "v": v, "o": q, "do": q, "dq": q, "dk": k, "dv": v, "lse": lse}
    scratch = iter(plan.scratch)
    out = []
    for name in plan.TENSORS:
        if name in like:
            out.append(torch.empty_like(like[name]))
        else:  # the split forward's partial sums, or the backward's D and float32 dQ, in the plan's order
            kept = next(scratch, None)
            out.append(None if kept is None else torch.empty(kept[0], dtype=kept[1]))
    return out


def cpu_plans(module) -> None:
    """Let ``module``'s plans build on the CPU: its Hopper check answered (the device queries
    already answer for an H100 there)."""
    module._validate = lambda q, k, v, causal, scale: scale or q.shape[-1] ** -0.5


def gluon_launches(module, kind, shape, dtype, causal, deterministic, mutant=0):
    """(kernel name, Launch, its tensors) for each Gluon kernel a forward or backward plan of
    ``module`` (impl's flash_gluon or a copy of it) for ``shape`` (B, H, N, d) launches, the plan
    built on the CPU (after ``cpu_plans``)."""
    b, h, n, d = shape
    q, k, v = (torch.empty(b, h, n, d, dtype=getattr(torch, dtype)) for _ in range(3))
    lse = torch.empty(b, h, n)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        plan = (module._ForwardPlan(q, k, v, causal, None, mutant) if kind == "forward"
                else module._BackwardPlan(q, k, v, q, lse, q, causal, None, mutant))
    finally:
        torch.use_deterministic_algorithms(was)
    tensors = _tensors(plan, q, k, v, lse)
    names = {id(getattr(module, name)): name for name in GLUON_KERNELS}
    return [(names[id(launch.kernel)], launch, [tensors[i] for i in where])
            for launch, where in plan.steps if id(launch.kernel) in names]


def check_fits_hopper(name, compiled):
    """What a Hopper SM needs of the compiled kernel: a list of what it lacks."""
    problems = []
    if compiled.metadata.shared > HOPPER_SHARED_BYTES:
        problems.append(f"{name}: {compiled.metadata.shared} bytes of shared memory, over Hopper's "
                        f"{HOPPER_SHARED_BYTES} a block")
    if "ttg.warp_specialize" not in compiled.asm["ttgir"]:
        problems.append(f"{name}: not warp-specialised (no ttg.warp_specialize in its TTGIR)")
    if "setmaxnreg" not in compiled.asm["ptx"]:
        problems.append(f"{name}: its partitions' registers are not handed out (no setmaxnreg in its PTX)")
    return problems


# Forward kernels whose loop must overlap the softmax of S_j with the product P_{j-1} V_{j-1}
# (head dims): ptxas hoists the wait for all products above the softmax unless the kernel keeps it
# below (impl/attention/flash_gluon.py, _fwd_consumer; d 128 full forward 1.7-3.5 % faster on an H200,
# perf/results/2026-11-28-h200-softmax-overlap/).  d 64 keeps the hoisted wait: level or slower.
OVERLAP_HEAD_DIMS = (128,)


def sass(compiled) -> str:
    """The kernel's SASS (cuobjdump, shipped beside Triton's ptxas)."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    tool = Path(get_ptxas(90).path).with_name("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([str(tool), "-sass", cubin.name], capture_output=True, text=True, check=True).stdout


def wgmma_order(sass_text: str) -> str:
    """The kernel's schedule in a few letters, in SASS order: G a wgmma group's last product,
    D0 / D1 a wait for all / all but one groups, | a bar.sync, [Ne] a run of N exp2 (MUFU.EX2)."""
    marks = []
    for line in sass_text.splitlines():
        if "WARPGROUP.DEPBAR.LE" in line:
            marks.append("D" + line.split(";")[0].strip()[-1])
        elif "MUFU.EX2" in line:
            marks.append("e")
        elif "HGMMA" in line and "gsb0" in line:
            marks.append("G")
        elif "BAR.SYNC" in line:
            marks.append("|")
    return re.sub(r"e{3,}", lambda run: f"[{len(run.group())}e]", "".join(marks))


def check_softmax_overlaps_pv(name, sass_text: str) -> list[str]:
    """A forward loop step waits for its scores (D1) and then runs the softmax before it waits for
    every product (D0); a D0 right after a D1 means the softmax waits for P V instead of running
    under it.  A SASS with no such step at all (none read, or the loop written another way) is
    named too: the check must see the step it vouches for."""
    order = wgmma_order(sass_text)
    if re.search(r"D1\|*D0", order):
        return [f"{name}: the loop waits for every product before its softmax (wgmma order {order[:120]})"]
    if not re.search(r"D1\|*\[\d+e\]\|*D0", order):
        return [f"{name}: no loop step that waits for its scores, runs the softmax, then waits for P V "
                f"(wgmma order {order[:120]!r})"]
    return []


# Kernels whose registers must hold without spilling (no local-memory load or store in their
# SASS): the three-consumer forward (160 registers a consumer, sized to fit:
# perf/results/2026-11-29-h200-three-consumer-forward/) and the d 128 five-product dK/dV kernel,
# whose K and V wgmma descriptors, held across the loop, spilled 68-204 bytes and cost its
# backward 3.5 % (full) and 6.2 % (causal) on an H200 until they were formed each tile
# (flash_gluon._fixed_tile_at; perf/results/2026-11-29-h200-backward-descriptors/).  The
# deterministic d 128 dK/dV kernel still spills (36-88 bytes): not held to it.
SPILL_FREE = ("three_consumer_forward", "d128_fused_backward")


def _held_spill_free(name, case, launch, kinds) -> bool:
    """Whether this kernel of this case is one of ``kinds`` (SPILL_FREE's names)."""
    return (("three_consumer_forward" in kinds and name == "_flash_fwd_kernel" and launch.constexprs.get("CONSUMERS") == 3)
            or ("d128_fused_backward" in kinds and name == "_flash_bwd_dkdv_kernel" and case[1][3] == 128
                and bool(launch.constexprs.get("FUSE_DQ"))))


def check_no_spills(name, sass_text: str) -> list[str]:
    """No local-memory load or store (LDL, STL: ptxas's spills; these kernels keep no local
    arrays).  A SASS without a wgmma is named too: the check must see the kernel it vouches for."""
    if "HGMMA" not in sass_text:
        return [f"{name}: no wgmma (HGMMA) in its SASS: not the kernel the spill check is for"]
    spills = re.findall(r"\b(?:LDL|STL)(?:\.[\w.]+)?\s", sass_text)
    if spills:
        return [f"{name}: {len(spills)} local-memory loads and stores in its SASS (spilled registers: "
                f"{sum(s.startswith('LDL') for s in spills)} LDL, {sum(s.startswith('STL') for s in spills)} STL)"]
    return []


def _hold_fixed_tiles_in_registers(module) -> None:
    """The spill check's own mutant: the program's fixed K and V seen at the constant slot 0, so
    the compiler forms their descriptors once before the loop and holds them (as before
    flash_gluon._fixed_tile_at)."""
    from conformance.laws.attention.held_fixed_tiles import fixed_tile_at_slot_0

    module._fixed_tile_at = fixed_tile_at_slot_0


def _why(exc: BaseException) -> str:
    """A compile error in a line or two: Triton's CompilationError opens with the kernel's source
    around the failing line; its cause says what failed."""
    while exc.__cause__ is not None:  # a partition's error is the cause of its kernel's, and so on
        exc = exc.__cause__
    text = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {' '.join(text[-1].split())[:400]}"


def report(cases, extra_backward_stages=0, overlap_head_dims=OVERLAP_HEAD_DIMS, spill_free=SPILL_FREE,
           fixed_tiles_held=False):
    """Per Gluon kernel of each case's plan (impl's flavour): (case, kernel name, what it lacks,
    or why it did not compile).  ``extra_backward_stages``: the five-product backward's table
    entries with that many more ring slots (the check's own mutant).  ``overlap_head_dims``:
    the forwards held to check_softmax_overlaps_pv.  ``spill_free``: the kernels held to
    check_no_spills (SPILL_FREE's names);
    ``fixed_tiles_held``: that check's own mutant (_hold_fixed_tiles_in_registers).  Changes the
    module's tables and its Hopper check: for a process of its own (``compile_in_child``)."""
    module = importlib.import_module("impl.attention.flash_gluon")
    cpu_plans(module)
    if fixed_tiles_held:
        _hold_fixed_tiles_in_registers(module)
    if extra_backward_stages:
        for d, cfg in list(module.BACKWARD_FUSED_CONFIGS.items()):
            module.BACKWARD_FUSED_CONFIGS[d] = dataclasses.replace(cfg, stages=cfg.stages + extra_backward_stages)
    rows = []
    for case in cases:
        launches = gluon_launches(module, *case)
        if not launches:
            rows.append((case, None, ["the plan launched no Gluon kernel"]))
        for name, launch, tensors in launches:
            try:
                compiled = compile_launch(launch, tensors)
            except Exception as exc:  # the finding: the kernel does not compile
                rows.append((case, name, [f"{name}: does not compile: {_why(exc)}"]))
                continue
            problems = check_fits_hopper(name, compiled)
            # the two-consumer forward (OVERLAP); the three-consumer one runs a product at a time
            if name == "_flash_fwd_kernel" and case[1][3] in overlap_head_dims and launch.constexprs.get("OVERLAP"):
                try:
                    problems += check_softmax_overlaps_pv(name, sass(compiled))
                except (OSError, subprocess.CalledProcessError) as exc:
                    problems.append(f"{name}: its SASS could not be read (cuobjdump): {exc}")
            if _held_spill_free(name, case, launch, spill_free):
                try:
                    problems += check_no_spills(name, sass(compiled))
                except (OSError, subprocess.CalledProcessError) as exc:
                    problems.append(f"{name}: its SASS could not be read (cuobjdump): {exc}")
            rows.append((case, name, problems))
    return rows


def compile_in_child(cases, extra_backward_stages=0, overlap_head_dims=OVERLAP_HEAD_DIMS, spill_free=SPILL_FREE,
                     fixed_tiles_held=False, timeout=900):
    """``report`` run in a child process without TRITON_INTERPRET; its rows (cases as JSON lists)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    request = {"cases": cases, "extra_backward_stages": extra_backward_stages,
               "overlap_head_dims": list(overlap_head_dims), "spill_free": list(spill_free),
               "fixed_tiles_held": fixed_tiles_held}
    run = subprocess.run([sys.executable, "-m", "conformance.laws.attention.hopper_compile"],
                         input=json.dumps(request),
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"the compiling process failed (exit {run.returncode}): {run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # the child: a request on stdin, the rows on stdout
    request = json.load(sys.stdin)
    print(json.dumps(report([tuple(c) for c in request["cases"]], request.get("extra_backward_stages", 0),
                            tuple(request.get("overlap_head_dims", OVERLAP_HEAD_DIMS)),
                            tuple(request.get("spill_free", SPILL_FREE)), request.get("fixed_tiles_held", False))))
