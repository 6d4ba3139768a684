"""The Gluon flavour's kernels compile for Hopper (sm_90a) on any machine.

Each Gluon kernel a plan launches goes through Triton's compiler and ptxas here, with the
plan's own constexprs, launch options and argument types (tensor descriptors with their
boxes and shared-memory layouts, pointers, integers), and the result must fit one Hopper SM:
at most 227 KiB of shared memory a block, its consumer and loader partitions really
warp-specialised (the schedule the module's docstring describes), their registers handed out
by ``setmaxnreg``.  No GPU is needed: a kernel that no longer compiles, or a table entry whose
buffers overflow shared memory, fails in CI instead of on the first Hopper machine.  The laws
that run the kernels stay "not run here" without one.

The compiles run in a child process without TRITON_INTERPRET: under the interpreter (which
the suite switches on where there is no GPU) Triton's own library functions, the reductions
``gl.max`` and ``gl.sum`` among them, are interpreter objects that the compiler refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

fg = pytest.importorskip("impl.attention.flash_gluon")
if fg.GLUON_IMPORT_ERROR is not None:  # pragma: no cover - a Triton without Gluon
    pytest.skip(f"not run here: this Triton has no Gluon ({fg.GLUON_IMPORT_ERROR})", allow_module_level=True)

try:  # ptxas ships with Triton's NVIDIA backend; without it nothing can be compiled here
    from triton.backends.nvidia.compiler import get_ptxas

    PTXAS_MISSING = None if os.path.exists(get_ptxas(90).path) else "its ptxas binary is missing"
except Exception as exc:  # pragma: no cover - a Triton without its NVIDIA backend
    PTXAS_MISSING = f"{type(exc).__name__}: {exc}"

ROOT = Path(__file__).resolve().parents[1]
GLUON_KERNELS = ("_flash_fwd_kernel", "_flash_bwd_dq_kernel", "_flash_bwd_dkdv_kernel")
HOPPER_SHARED_BYTES = 227 * 1024  # the most a block may opt in to on an H100 or H200

# (pass, (B, H, N, d), dtype, causal, deterministic, kept mutant), grouped into one child process
# each.  Between them they give every specialisation the tables make: the persistent and the
# split forward (B1 H1 leaves SMs idle), the five-product backward and the deterministic seven;
# and each kept mutant of the schedule's kernel, whose rejection on a GPU means something only
# if it compiles (a mutant that failed to compile would be "rejected" by any law).
GROUPS = {
    f"forward-d{d}": [("forward", shape, dtype, causal, False, 0)
                      for shape in ((2, 16, 1024, d), (1, 1, 2048, d)) for causal in (False, True)
                      for dtype in (("bfloat16", "float16") if shape[0] == 2 and causal else ("bfloat16",))]
    for d in (64, 128)
} | {
    f"backward-d{d}": [("backward", (1, 2, 300, d), dtype, causal, deterministic, 0)
                       for causal in (False, True) for deterministic in (False, True)
                       for dtype in (("bfloat16", "float16") if not causal and not deterministic else ("bfloat16",))]
    for d in (64, 128)
} | {
    "kept-mutants": [("forward", (2, 16, 1024, 64), "bfloat16", True, False, fg.MUTANTS[name])
                     for name in ("v_slot_freed_before_its_product", "ready_phase_off_by_one", "rescale_skipped",
                                  "q_freed_before_its_last_scores")]
                    + [("forward", (1, 1, 2048, 64), "bfloat16", False, False, fg.MUTANTS["discarded_split_counted"])]
                    + [("backward", (1, 2, 300, d), "bfloat16", False, False, fg.MUTANTS["last_dq_partial_never_added"])
                       for d in (64, 128)],
}


# --- in the child process ------------------------------------------------------------------

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


def gluon_launches(kind, shape, dtype, causal, deterministic, mutant=0):
    """(kernel name, Launch, its tensors) for each Gluon kernel a forward or backward plan of
    ``shape`` (B, H, N, d) launches, the plan built on the CPU."""
    b, h, n, d = shape
    q, k, v = (torch.empty(b, h, n, d, dtype=getattr(torch, dtype)) for _ in range(3))
    lse = torch.empty(b, h, n)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        plan = (fg._ForwardPlan(q, k, v, causal, None, mutant) if kind == "forward"
                else fg._BackwardPlan(q, k, v, q, lse, q, causal, None, mutant))
    finally:
        torch.use_deterministic_algorithms(was)
    tensors = _tensors(plan, q, k, v, lse)
    names = {id(getattr(fg, name)): name for name in GLUON_KERNELS}
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


def _why(exc: BaseException) -> str:
    """A compile error in a line or two: Triton's CompilationError opens with the kernel's source
    around the failing line; its cause says what failed."""
    while exc.__cause__ is not None:  # a partition's error is the cause of its kernel's, and so on
        exc = exc.__cause__
    text = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {' '.join(text[-1].split())[:400]}"


def report(cases, extra_backward_stages=0):
    """Per Gluon kernel of each case's plan: (case, kernel name, what it lacks, or why it did not
    compile).  ``extra_backward_stages``: the five-product backward's table entries with that
    many more ring slots (the check's own mutant)."""
    fg._validate = lambda q, k, v, causal, scale: scale or q.shape[-1] ** -0.5  # no Hopper here
    for d, cfg in list(fg.BACKWARD_FUSED_CONFIGS.items()):
        fg.BACKWARD_FUSED_CONFIGS[d] = fg.GluonConfig(cfg.block_m, cfg.block_n, cfg.stages + extra_backward_stages)
    rows = []
    for case in cases:
        launches = gluon_launches(*case)
        if not launches:
            rows.append((case, None, ["the plan launched no Gluon kernel"]))
        for name, launch, tensors in launches:
            try:
                problems = check_fits_hopper(name, compile_launch(launch, tensors))
            except Exception as exc:  # the finding: the kernel does not compile
                problems = [f"{name}: does not compile: {_why(exc)}"]
            rows.append((case, name, problems))
    return rows


def _child_main():
    request = json.load(sys.stdin)
    print(json.dumps(report([tuple(c) for c in request["cases"]], request.get("extra_backward_stages", 0))))


# --- in the test process -------------------------------------------------------------------

def compile_in_child(cases, extra_backward_stages=0, timeout=900):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", "from properties.test_gluon_kernels_compile import _child_main;"
                          " _child_main()"], input=json.dumps({"cases": cases, "extra_backward_stages":
                                                               extra_backward_stages}),
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    assert run.returncode == 0, f"the compiling process failed (exit {run.returncode}): {run.stderr[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


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
    rows = compile_in_child([("backward", (1, 2, 300, 128), "bfloat16", False, False, 0)], extra_backward_stages=1)
    [(_, name, problems)] = rows
    assert name == "_flash_bwd_dkdv_kernel" and any("shared memory" in p for p in problems), rows


def test_the_fit_check_names_each_thing_a_kernel_lacks():
    """The other two properties can fail too: a compiled kernel (its metadata and assembly, as
    Triton hands them back) without warp specialisation or register hand-out is named for each."""
    from types import SimpleNamespace

    def compiled(shared, ttgir, ptx):
        return SimpleNamespace(metadata=SimpleNamespace(shared=shared), asm={"ttgir": ttgir, "ptx": ptx})

    fits = compiled(HOPPER_SHARED_BYTES, "ttg.warp_specialize", "setmaxnreg.inc.sync.aligned.u32 240;")
    assert check_fits_hopper("k", fits) == []
    lacks = check_fits_hopper("k", compiled(HOPPER_SHARED_BYTES + 16, "scf.for", "mma.sync"))
    assert len(lacks) == 3, lacks
    assert "shared memory" in lacks[0] and "not warp-specialised" in lacks[1] and "setmaxnreg" in lacks[2], lacks
