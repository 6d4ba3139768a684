"""Launching a Triton kernel again without re-deriving what the first launch knew.

``kernel[grid](*args, **constexprs)`` binds every argument, specialises each one (integers
on == 1 and divisibility by 16, pointers on 16-byte alignment), hashes the result to find the
compiled kernel, reads the current device and stream, and builds launch metadata for
profiling hooks: on an H100 host about 20 to 40 us a launch, which a call at a short
sequence length (a few us of GPU work) pays in full, three times in a backward.

A ``Launch`` holds one launch with everything but the leading tensor arguments fixed: the
grid, the remaining arguments (strides, sizes, scalars, constexprs) and the options.  Its
first call goes through Triton (compiling if needed) and keeps the ``CompiledKernel``; later
calls hand Triton's launcher the tensors and the stored rest directly.

Contract
    The caller keys its Launches on everything that decides the fixed arguments and
    Triton's specialisation of the tensors: shapes, strides, dtypes, device, options, and
    each tensor's ``data_ptr() % 16 == 0``.  A Launch is then valid for any tensors with
    that key; only their addresses change between calls.
    Launch hooks (``triton.knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``, as set by
    Triton's profiler) make every call go through Triton's own path, so the hooks see it.
    Under the interpreter (CPU) every call goes through Triton's path: there is no compiled
    kernel to keep, but the caller's caching is exercised all the same.
    Kernels that make tensor descriptors (``tma=True``) need scratch memory: one buffer per
    (device, stream), kept and grown; on Triton's own path its allocator is set to that
    cache for the duration of each such launch only.
    Kernels that take host tensor descriptors (Gluon's TMA arguments) are called with the
    tensors themselves; ``descriptors`` holds, per leading argument, the function that
    makes its TensorDescriptor for Triton's path (None: a plain tensor).  The direct path
    hands Triton's C launcher the encoded tensor map, shape and strides instead (what its
    Python wrapper would), from ``encoded_descriptor``'s cache.
    Unless ``LLM_SYSTEMS_NATIVE_LAUNCH=0``, a Launch bound to Triton's C launcher is also
    registered with ``native_launch``'s C++ launcher, which then takes its direct calls whole
    (the same parameters, laid out once per Launch).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import triton

from impl.attention import native_launch

try:  # Triton >= 3.4 keeps its runtime settings here
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: no hooks to honour on the fast path
    _knobs = None


# (device, stream) -> scratch buffer, grown as needed.  Kernels on one stream run one after
# another, so a buffer that one launch's descriptors were written to is free when the next
# launch on that stream starts; a launch on another stream gets a buffer of its own.
_SCRATCH: dict = {}


def _tma_scratch(size: int, alignment: int, stream):
    """Global memory where kernels write the tensor descriptors they make (128 B each)."""
    key = (torch.cuda.current_device(), stream)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < size:
        buf = torch.empty(max(size, 1 << 16), dtype=torch.int8, device="cuda")  # torch aligns to 512 B
        _SCRATCH[key] = buf
    return buf


@contextlib.contextmanager
def descriptor_allocator(active: bool):
    """Triton's allocator set to _tma_scratch for one launch, the caller's restored after."""
    from triton.runtime import _allocation

    var = getattr(_allocation, "_allocator", None)
    if not active:
        yield
    elif var is not None and hasattr(var, "set") and hasattr(var, "reset"):
        token = var.set(_tma_scratch)
        try:
            yield
        finally:
            var.reset(token)
    else:  # a Triton without the context variable: set it for good
        triton.set_allocator(_tma_scratch)
        yield


# (address, shape, strides, encoding) -> (CUtensorMap, *shape, *strides).  A tensor map is a
# value computed from exactly these (cuTensorMapEncodeTiled reads nothing else), so an entry
# is right for any tensor that has them, whatever tensor it was made for; bounded.
_ENCODED: dict = {}
MAX_ENCODED = 4096


def encoded_descriptor(fill, t: torch.Tensor, meta: tuple) -> tuple:
    """The launcher arguments of a host TMA descriptor over the whole of ``t`` with Triton's
    encoding ``meta`` = (swizzle, element size, element type, box): what Triton's
    ``make_tensordesc_arg`` makes of a TensorDescriptor, with zero padding."""
    key = (t.data_ptr(), t.shape, t.stride(), meta)
    args = _ENCODED.get(key)
    if args is None:
        swizzle, elem_size, elem_type, box = meta
        shape, strides = list(t.shape), list(t.stride())
        args = (fill(t.data_ptr(), swizzle, elem_size, elem_type, list(box), shape, strides, 0), *shape, *strides)
        if len(_ENCODED) >= MAX_ENCODED:
            del _ENCODED[next(iter(_ENCODED))]
        _ENCODED[key] = args
    return args


DIRECT = True  # False: every launch through Triton's own path (for measuring what the direct one saves)


def _hooks_active() -> bool:
    if _knobs is None:
        return True
    hooks = (_knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook)
    # A HookChain is never None; it is active when it holds calls.  A bare callable is active.
    return any(getattr(h, "calls", h is not None) for h in hooks)


def fast_stream(device_index: int):
    """The current stream of the device, as ``Launch.issue`` takes it, where launches may go
    straight to the C launcher (a CUDA device, DIRECT, no launch hooks, that device current);
    else None.
    What each ``Launch`` call checks, checked once for a pass's several launches."""
    if device_index is None or not DIRECT or _hooks_active() or torch._C._cuda_getDevice() != device_index:
        return None
    return torch._C._cuda_getCurrentRawStream(device_index)


class ConfigDoesNotFit(ValueError):
    """A tile configuration needs more of the GPU (shared memory) than it has, even with
    one pipeline stage: refused with what it needed and what there is, before any output
    is written (a config the default tables hold always fits)."""


class Launch:
    """One kernel launch with everything but the first arguments (the tensors) fixed."""

    __slots__ = ("kernel", "grid", "rest", "constexprs", "options", "tma", "device_index", "compiled", "direct_ok",
                 "c_launch", "c_head", "c_head_meta", "scratch_bytes", "descriptors", "encodings", "fill", "native")

    def __init__(self, kernel, grid: tuple, rest: tuple, constexprs: dict, options: dict | None,
                 device: torch.device, tma: bool = False, descriptors: tuple = ()):
        self.kernel = kernel  # the JITFunction
        self.descriptors = descriptors  # per leading argument: tensor -> TensorDescriptor, or None
        self.encodings = None  # per leading argument: Triton's encoding of its tensor map, or None
        self.fill = None  # Triton's cuTensorMapEncodeTiled wrapper, once bound
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.rest = rest  # the non-constexpr arguments after the tensors
        names = list(getattr(kernel, "arg_names", ()))
        if set(constexprs) <= set(names) and names[len(names) - len(constexprs):] == sorted(constexprs, key=names.index):
            # constexprs in signature order, as the direct path passes them positionally
            constexprs = {name: constexprs[name] for name in names if name in constexprs}
            self.direct_ok = True
        else:  # constexprs interleaved with other parameters (or no names): Triton's path always
            self.direct_ok = False
        self.constexprs = constexprs
        self.options = options  # num_warps, num_stages, enable_fp_fusion; None under the interpreter
        self.tma = tma
        self.device_index = device.index if device.type == "cuda" else None
        self.compiled = None
        self.c_launch = None
        self.native = None  # its id in native_launch's C++ launcher, where that is on and this launch fits it

    @property
    def graph_ready(self) -> bool:
        """A call now goes straight to Triton's C launcher and needs no global scratch, so a
        CUDA graph can record it (impl/attention/call_graphs.py)."""
        return DIRECT and self.c_launch is not None and not self.scratch_bytes

    def __call__(self, *tensors) -> None:
        if self.compiled is None or not DIRECT or _hooks_active():
            self._through_triton(tensors)
        elif torch.cuda.current_device() != self.device_index:
            with torch.cuda.device(self.device_index):
                self._direct(tensors)
        else:
            self._direct(tensors)

    def issue(self, stream, *tensors) -> None:
        """A call from an owner that issues several launches and asked ``fast_stream`` once for
        all of them: with its stream, straight to the C launcher where one is bound; with None
        (or none bound), the checks of ``__call__``."""
        if stream is None or self.c_launch is None:
            self(*tensors)
        else:
            self._c_launch(stream, tensors)

    def _c_launch(self, stream, tensors) -> None:
        if self.native is not None:  # the whole launch in C++ (native_launch)
            native_launch.launch(self.native, stream, tensors)
            return
        # Triton's C launcher itself, the descriptor scratch from our cache
        scratch = _tma_scratch(self.scratch_bytes, 128, stream) if self.scratch_bytes else None
        if self.encodings is not None:
            fill, expanded = self.fill, []
            for t, meta in zip(tensors, self.encodings):
                if meta is None:
                    expanded.append(t)
                else:
                    expanded.extend(encoded_descriptor(fill, t, meta))
            tensors = (*expanded, *tensors[len(self.encodings):])
        g0, g1, g2 = self.grid
        self.c_launch(g0, g1, g2, stream, *self.c_head, scratch, None, *self.c_head_meta,
                      *tensors, *self.rest, *self.constexprs.values())

    def _direct(self, tensors) -> None:
        # What JITFunction.run ends with, minus the binding, the lookup and the hooks' metadata.
        stream = torch._C._cuda_getCurrentRawStream(self.device_index)
        if self.c_launch is not None:
            self._c_launch(stream, tensors)
            return
        g0, g1, g2 = self.grid
        tensors = self._described(tensors)
        compiled = self.compiled
        token = _set_allocator() if self.tma else None
        try:
            compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *tensors, *self.rest, *self.constexprs.values())
        finally:
            if token is not None:
                _reset_allocator(token)

    def _described(self, tensors) -> tuple:
        """The leading arguments as Triton's own path takes them: descriptors made."""
        if not self.descriptors:
            return tensors
        return tuple(t if make is None else make(t) for t, make in zip(tensors, self.descriptors)) + tensors[
            len(self.descriptors):]

    def _through_triton(self, tensors) -> None:
        """Triton's own launch (compiling on first use); on a GPU that lacks the resources
        for the options, retry with num_stages=1."""
        args = (*self._described(tensors), *self.rest)
        if self.options is None:  # the interpreter takes no launch options
            self.kernel[self.grid](*args, **self.constexprs)
            return
        with descriptor_allocator(self.tma):
            try:
                compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
            except triton.runtime.errors.OutOfResources as exc:
                if self.options.get("num_stages", 1) <= 1:
                    raise self._does_not_fit(exc) from exc
                warnings.warn(f"{self.kernel.fn.__name__}: {exc}; retrying with num_stages=1", RuntimeWarning,
                              stacklevel=4)
                self.options = {**self.options, "num_stages": 1}
                try:
                    compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
                except triton.runtime.errors.OutOfResources as exc1:
                    raise self._does_not_fit(exc1) from exc1
        if hasattr(compiled, "result"):  # an asynchronous compilation's future
            compiled = compiled.result()
        if self.direct_ok and self.compiled is None:
            self.compiled = compiled
            self._bind_c_launcher(compiled)

    def _does_not_fit(self, exc) -> ConfigDoesNotFit:
        tiles = {k: v for k, v in self.constexprs.items() if k.isupper() or k.startswith("BLOCK")}
        return ConfigDoesNotFit(
            f"{self.kernel.fn.__name__}: the tile configuration {tiles} with {self.options} does not fit this GPU "
            f"even with num_stages=1 ({exc}); choose smaller blocks for this head dimension and dtype")

    def _bind_c_launcher(self, compiled) -> None:
        """Keep Triton's C launch function where its launcher is the one this was written
        against (Triton 3.4 to 3.6: CudaLauncher); otherwise the direct path calls
        ``compiled.run``, Triton's Python wrapper around it."""
        launcher = compiled.run
        needed = ("launch", "global_scratch_size", "profile_scratch_size", "launch_cooperative_grid", "launch_pdl",
                  "num_ctas")
        if type(launcher).__name__ != "CudaLauncher" or not all(hasattr(launcher, a) for a in needed):
            return
        if launcher.profile_scratch_size:  # instrumented kernels: leave them to Triton
            return
        g0, g1, g2 = self.grid
        self.scratch_bytes = g0 * g1 * g2 * launcher.num_ctas * launcher.global_scratch_size
        self.c_head = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl)
        self.c_head_meta = (compiled.packed_metadata, None, None, None)
        launch = launcher.launch
        if self.descriptors:
            launch = self._bind_descriptor_encodings(launch)
            if launch is None:  # keep Triton's wrapper, handed TensorDescriptors (compiled.run's path)
                return
        self.c_launch = launch
        self.native = native_launch.register(self)

    def _bind_descriptor_encodings(self, wrapper):
        """The C launch function under Triton's tensor-descriptor wrapper, with each
        descriptor argument's encoding kept, or None where the wrapper is not the one this
        was written against (Triton 3.5/3.6 ``wrap_handle_tensordesc``)."""
        cells = dict(zip(getattr(getattr(wrapper, "__code__", None), "co_freevars", ()),
                         (c.cell_contents for c in (getattr(wrapper, "__closure__", None) or ()))))
        raw, indices, metas = cells.get("launcher"), cells.get("tensordesc_indices"), cells.get("tensordesc_meta")
        wanted = [i for i, make in enumerate(self.descriptors) if make is not None]
        if raw is None or indices is None or metas is None or sorted(indices) != wanted or len(metas) != len(wanted):
            return None
        from triton.backends.nvidia import driver

        to_host = getattr(driver, "TMA_DTYPE_DEVICE_TO_HOST", None)
        encodings = [None] * len(self.descriptors)
        for i, meta in zip(wanted, metas):
            if to_host is None or not isinstance(meta, dict) or meta.get("fp4_padded"):
                return None
            encodings[i] = (meta["swizzle"], meta["elem_size"], to_host[meta["elem_type"]],
                            tuple(meta["block_size"]))
        self.fill = triton.runtime.driver.active.utils.fill_tma_descriptor
        self.encodings = tuple(encodings)
        return raw


def _set_allocator():
    from triton.runtime import _allocation

    var = getattr(_allocation, "_allocator", None)
    if var is not None and hasattr(var, "set"):
        return (var, var.set(_tma_scratch))
    triton.set_allocator(_tma_scratch)
    return None


def _reset_allocator(token) -> None:
    var, tok = token
    var.reset(tok)
