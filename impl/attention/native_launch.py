"""A kernel launch from C++ (``csrc/native_launch.cpp``), for the host path of short calls.

``triton_launch.Launch``'s direct path hands Triton's generated C launcher the tensors and the
fixed arguments; on an H200 host the launcher itself costs about 3 us, the Python around it
(building the argument tuple, the tensor maps' cache, the varargs call) about 7 more.  Here the
arguments are laid out once per Launch as a template of slots, and a call passes only the
stream and the tensors: C++ reads each tensor's pointer (or encodes its tensor map) and calls
``cuLaunchKernelEx`` as Triton's launcher would.

Contract
    A template mirrors Triton 3.6's launcher (``backends/nvidia/driver.py``, ``make_launcher``):
    every non-constexpr parameter in signature order, a host tensor descriptor lowered to TMA
    expanded to (CUtensorMap, shape as i32, strides as i64), then the global and profile
    scratch pointers (both null: a kernel with global scratch stays on Triton's launcher).
    ``template`` returns None for anything else (tuple arguments, descriptors not lowered to
    TMA, fixed pointer arguments), and the Launch keeps Triton's launcher.
    A pass (``register_pass``, ``run_pass``) is a whole call of a plan: its outputs' and scratch
    allocations and its launches, one call from Python (the Gluon plans take it where call
    graphs are off and the inputs need no view or copy).
    The custom ops' CUDA kernels (``enable_ops``, wired by ``custom_ops.enable_native_ops``) run a
    call's pass straight from the dispatcher once Python has named it for the call's key (each
    tensor's shape, strides, dtype, device and alignment; causal, scale, deterministic mode).
    The Gluon autograd.Function binds its plans' passes to the same keys (``bind``) and runs a
    repeat with one call (``run_bound``: None where nothing is bound), skipping the plan's key
    and look-up in Python.
    Errors raise RuntimeError; their messages are built without iostreams (see ``require``).
    Registrations live as long as the process (a few hundred bytes each, one per Launch and
    plan ever bound).
    On unless ``LLM_SYSTEMS_NATIVE_LAUNCH=0``; the extension is built on first use with
    ``torch.utils.cpp_extension`` (a C++ compiler and Triton's bundled ``cuda.h``); where it
    cannot be built, a warning says why and every Launch keeps Triton's launcher.
"""

from __future__ import annotations

import os
import struct
import warnings

PTR, DESC, WORD = 0, 1, 2
MAX_RANK = 5  # csrc/native_launch.cpp's slot holds a box of this many dims
INTS = {"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"}

_EXTENSION: list = []  # [module or None] once tried
launch = None  # the extension's launch(id, stream, tensors), once built
run_pass = None  # the extension's run_pass(id, stream, inputs) -> outputs, once built
bind = None  # the extension's bind(kind, tensors, is_causal, scale, pass), once built
run_bound = None  # the extension's run_bound(kind, stream, tensors, is_causal, scale) -> outputs or None
bound_pass = None  # the extension's bound_pass(kind, tensors, is_causal, scale) -> pass id or -1


def enabled() -> bool:
    return os.environ.get("LLM_SYSTEMS_NATIVE_LAUNCH", "1") != "0"


def extension():
    """The built extension, or None (switched off, or it could not be built: warned once)."""
    if not enabled():
        return None
    global launch, run_pass, bind, run_bound, bound_pass
    if not _EXTENSION:
        try:
            _EXTENSION.append(_build())
            ext = _EXTENSION[0]
            launch, run_pass, bind, run_bound, bound_pass = (ext.launch, ext.run_pass, ext.bind, ext.run_bound,
                                                             ext.bound_pass)
        except Exception as exc:  # no compiler, no headers: Triton's launcher serves
            warnings.warn(f"native_launch: the C++ launcher could not be built ({type(exc).__name__}: {exc}); "
                          "launches go through Triton's launcher", RuntimeWarning, stacklevel=2)
            _EXTENSION.append(None)
    return _EXTENSION[0]


def built():
    """The extension if it was built in this process, else None (builds nothing)."""
    return _EXTENSION[0] if _EXTENSION else None


def _build():
    import triton
    from torch.utils import cpp_extension

    here = os.path.dirname(os.path.abspath(__file__))
    cuda_include = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    return cpp_extension.load(name="attention_native_launch", sources=[os.path.join(here, "csrc", "native_launch.cpp")],
                              extra_include_paths=[cuda_include], extra_cflags=["-O2"], extra_ldflags=["-ldl"],
                              verbose=False)


def _signed(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def word(ty: str, value) -> int:
    """The 8-byte little-endian word whose low bytes are a ``ty`` parameter's value, as
    Triton's launcher stores it (floats by their bits at their own width)."""
    if ty in INTS:
        return _signed(int(value))
    if ty in ("fp32", "f32"):
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if ty == "fp64":
        return _signed(struct.unpack("<Q", struct.pack("<d", float(value)))[0])
    if ty == "fp16":
        return struct.unpack("<H", struct.pack("<e", float(value)))[0]
    if ty == "bf16":
        return struct.unpack("<I", struct.pack("<f", float(value)))[0] >> 16  # truncated, as a bf16 of a float
    raise TypeError(f"no word for a {ty} parameter")


def _slot(kind: int, tensor: int = 0, value: int = 0, encoding=None) -> list:
    if encoding is None:
        return [kind, tensor, value, 0, 0, 0] + [0] * MAX_RANK
    swizzle, elem_size, elem_type, box = encoding
    return [kind, tensor, value, swizzle, elem_size, elem_type, *box, *[0] * (MAX_RANK - len(box))]


def template(launch) -> tuple | None:
    """``register_launch``'s arguments for a Launch bound to Triton's C launcher (its leading
    tensors by position, its fixed rest as words, constexprs skipped: Triton marks them, ints
    equal to 1 included), or None where the launch is not of the form this mirrors."""
    compiled = launch.compiled
    signature = list(getattr(getattr(compiled, "src", None), "signature", {}).values())
    n_tensors = len(signature) - len(launch.rest) - len(launch.constexprs)
    if launch.c_launch is None or launch.scratch_bytes or n_tensors < 0:
        return None
    encodings = launch.encodings or ()
    slots = []
    for i, ty in enumerate(signature):
        if not isinstance(ty, str):  # a tuple argument
            return None
        if ty == "constexpr":
            continue
        if i < n_tensors:
            if ty.startswith("tensordesc"):
                encoding = encodings[i] if i < len(encodings) else None
                if encoding is None or len(encoding[3]) > MAX_RANK:
                    return None
                slots.append(_slot(DESC, i, encoding=encoding))
            elif ty.startswith("*"):
                slots.append(_slot(PTR, i))
            else:
                return None
        else:
            value = launch.rest[i - n_tensors] if i < n_tensors + len(launch.rest) else None
            if ty.startswith("*") or ty.startswith("tensordesc") or value is None:
                return None
            try:
                slots.append(_slot(WORD, value=word(ty, value)))
            except (TypeError, ValueError):
                return None
    slots += [_slot(WORD), _slot(WORD)]  # the global and profile scratch pointers: null
    function, cooperative, pdl = launch.c_head
    metadata = compiled.metadata
    return (int(function), list(launch.grid), int(metadata.num_warps), int(getattr(metadata, "num_ctas", 1)),
            int(metadata.shared), bool(pdl), bool(cooperative), slots)


def register(launch) -> int | None:
    """The launch's id in the extension, or None (off, not built, or not of this form)."""
    ext = extension()
    if ext is None:
        return None
    spec = template(launch)
    return None if spec is None else ext.register_launch(*spec)


def register_pass(n_inputs: int, steps: tuple, outputs: tuple, scratch: tuple) -> int | None:
    """A call's allocations and launches as one C++ pass: ``run_pass(id, stream, inputs)`` then
    allocates the outputs (returned) and the scratch, and issues each launch with the tensors its
    binding names, indices into inputs ++ outputs ++ scratch.  ``steps``: ((Launch, binding), ...);
    ``outputs``: ((shape, strides, dtype), ...); ``scratch``: ((shape, dtype), ...).  None where
    the launcher is off or a launch has no C++ id."""
    if any(step.native is None for step, _ in steps):  # checked first: a plan on Triton's launcher builds nothing
        return None
    ext = extension()
    if ext is None:
        return None
    return ext.register_pass(n_inputs, [step.native for step, _ in steps], [list(b) for _, b in steps],
                             [list(shape) for shape, _, _ in outputs], [list(strides) for _, strides, _ in outputs],
                             [dtype for _, _, dtype in outputs], [list(shape) for shape, _ in scratch],
                             [dtype for _, dtype in scratch])


def expand(slots: list, tensors) -> list:
    """What the C++ side passes, as Python values (a tensor map as ("map", tensor index)): for
    checking a template against the arguments the direct path hands Triton's launcher."""
    out = []
    for kind, tensor, value, *_ in slots:
        if kind == WORD:
            out.append(value)
        elif kind == PTR:
            out.append(tensors[tensor].data_ptr())
        else:
            t = tensors[tensor]
            out += [("map", tensor), *[int(s) for s in t.shape], *[int(s) for s in t.stride()]]
    return out
