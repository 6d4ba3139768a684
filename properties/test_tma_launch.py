"""The Gluon flavour's direct launch path hands Triton's C launcher exactly what Triton's own
tensor-descriptor wrapper would, and encodes each tensor map once per (address, shape,
strides, encoding).  Checked on the CPU: the C launcher is replaced by a recorder and
cuTensorMapEncodeTiled by a function that returns its arguments.  The C++ launcher
(``native_launch``) passes what the direct path passes; the custom ops' C++ kernels key a
call apart wherever the Gluon plans do and serve only a repeat from the pass Python named
(at the CPU key, with passes of no launches); on a Hopper GPU, with the Python kernels' bits."""

from __future__ import annotations

import contextlib
import os
import sysconfig
import types

import pytest
import torch
import triton

gluon_hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
nvidia_driver = pytest.importorskip("triton.backends.nvidia.driver")

from impl.attention import triton_launch  # noqa: E402
from impl.attention.triton_launch import Launch  # noqa: E402

BOX = [1, 1, 128, 64]
SIGNATURE = {0: "tensordesc<bf16[1, 1, 128, 64]>", 1: "*bf16", 2: "tensordesc<bf16[1, 1, 128, 64]>", 3: "*fp32",
             4: "i32", 5: "constexpr"}
META = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": BOX, "fp4_padded": False}


class CudaLauncher:  # the name the direct path checks for, with the attributes it reads
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False
    num_ctas = 1

    def __init__(self, launch):
        self.launch = launch


def _fake_kernel():
    return types.SimpleNamespace(arg_names=["a_desc", "x_ptr", "b_desc", "y_ptr", "n", "BLOCK"], fn=None)


def _descriptor(t):
    layout = gluon_hopper.NVMMASharedLayout.get_default_for(BOX, triton.experimental.gluon.language.bfloat16)
    return gluon_hopper.TensorDescriptor(t, list(t.shape), list(t.stride()), BOX, layout)


@pytest.fixture
def recorded(monkeypatch):
    """(calls to the C launcher, calls to the encoder); the driver and stream faked."""
    launches, encodes = [], []

    def fill(*args):
        encodes.append(args)
        return ("map", *map(lambda a: tuple(a) if isinstance(a, list) else a, args))

    fake_driver = types.SimpleNamespace(utils=types.SimpleNamespace(fill_tma_descriptor=fill))
    monkeypatch.setattr(triton.runtime.driver, "_active", fake_driver)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    monkeypatch.setattr(triton_launch, "_ENCODED", {})
    return launches, encodes, lambda *args: launches.append(args)


def _bound(raw_launch, wrapper=None):
    wrapper = wrapper or nvidia_driver.wrap_handle_tensordesc(raw_launch, SIGNATURE, [META, META])
    launch = Launch(_fake_kernel(), (2, 1), (5,), {"BLOCK": 64}, {"num_warps": 4}, torch.device("cpu"),
                    descriptors=(_descriptor, None, _descriptor))
    compiled = types.SimpleNamespace(run=CudaLauncher(wrapper), function="fn", packed_metadata="meta")
    launch.device_index = 0
    launch.compiled = compiled
    launch._bind_c_launcher(compiled)
    return launch, wrapper


def _tensors():
    a = torch.randn(2, 3, 200, 64).to(torch.bfloat16)
    b = torch.randn(1, 4, 300, 64).to(torch.bfloat16).transpose(1, 2)[:, :2].transpose(1, 2)
    return a, torch.zeros(8, dtype=torch.bfloat16), b, torch.ones(3)


def test_the_direct_path_passes_what_tritons_descriptor_wrapper_passes(recorded):
    launches, encodes, raw = recorded
    launch, wrapper = _bound(raw)
    assert launch.encodings is not None, "the direct path did not recognise Triton's descriptor wrapper"
    a, x, b, y = _tensors()
    launch._direct((a, x, b, y))
    ours = launches.pop()
    # Triton's path: TensorDescriptors through its own wrapper, with the same head arguments.
    wrapper(2, 1, 1, 7, "fn", False, False, None, None, "meta", None, None, None, _descriptor(a), x, _descriptor(b), y,
            5, 64)
    assert ours == launches.pop()


def test_a_tensor_map_is_encoded_once_per_address_shape_and_strides(recorded):
    launches, encodes, raw = recorded
    launch, _ = _bound(raw)
    a, x, b, y = _tensors()
    for _ in range(3):
        launch._direct((a, x, b, y))
    assert len(encodes) == 2
    launch._direct((a.clone(), x, b, y))  # another address: encoded anew
    assert len(encodes) == 3
    launch._direct((a[:, :2], x, b, y))  # the same address, another shape: encoded anew
    assert len(encodes) == 4 and encodes[3][0] == a.data_ptr() and encodes[3][5] == [2, 2, 200, 64]


def test_an_unrecognised_wrapper_gets_tensor_descriptors(recorded):
    launches, encodes, raw = recorded
    seen = []
    launch, _ = _bound(raw, wrapper=lambda *args: seen.append(args))
    assert launch.c_launch is None and launch.encodings is None
    a, x, b, y = _tensors()
    launch.compiled.run = lambda *args: seen.append(args)
    launch._direct((a, x, b, y))
    assert isinstance(seen[-1][9], gluon_hopper.TensorDescriptor) and seen[-1][10] is x
    assert isinstance(seen[-1][11], gluon_hopper.TensorDescriptor) and seen[-1][12] is y and not encodes


def test_the_cache_is_bounded(recorded, monkeypatch):
    launches, encodes, raw = recorded
    monkeypatch.setattr(triton_launch, "MAX_ENCODED", 3)
    launch, _ = _bound(raw)
    x = torch.zeros(8, dtype=torch.bfloat16)
    for _ in range(5):
        launch._direct((torch.zeros(1, 1, 130, 64, dtype=torch.bfloat16), x,
                        torch.zeros(1, 1, 140, 64, dtype=torch.bfloat16), x))
    assert len(triton_launch._ENCODED) <= 3



def test_issue_with_a_stream_is_the_direct_launch_and_without_one_the_checked_call(recorded, monkeypatch):
    launches, encodes, raw = recorded
    launch, _ = _bound(raw)
    a, x, b, y = _tensors()
    launch._direct((a, x, b, y))
    launch.issue(7, a, x, b, y)  # the stream fast_stream gave: the same arguments to the C launcher
    assert launches[0] == launches[1]
    checked = []
    monkeypatch.setattr(Launch, "__call__", lambda self, *tensors: checked.append(tensors))
    launch.issue(None, a, x, b, y)  # no fast stream (hooks set, another device): __call__'s checks decide
    assert len(launches) == 2 and checked == [(a, x, b, y)]


@pytest.mark.parametrize("why", ["hooks", "other device", "not direct", "not a CUDA launch"])
def test_no_fast_stream_where_a_launch_must_take_the_checked_path(monkeypatch, why):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(triton_launch, "_hooks_active", lambda: False)
    assert triton_launch.fast_stream(0) == 7
    if why == "hooks":
        monkeypatch.setattr(triton_launch, "_hooks_active", lambda: True)
    elif why == "other device":
        monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    elif why == "not direct":
        monkeypatch.setattr(triton_launch, "DIRECT", False)
    else:  # a Launch for the CPU (the interpreter, the host-plan tests' recorders) has no device index
        monkeypatch.delattr(torch._C, "_cuda_getDevice", raising=False)
        assert triton_launch.fast_stream(None) is None
        return
    assert triton_launch.fast_stream(0) is None


# --- the C++ launcher's template (impl/attention/native_launch.py) -----------------------------


def _templated(raw, **overrides):
    from impl.attention import native_launch

    launch, _ = _bound(raw)
    launch.compiled.src = types.SimpleNamespace(signature=dict(SIGNATURE))
    launch.compiled.metadata = types.SimpleNamespace(num_warps=4, num_ctas=1, shared=1024)
    launch.compiled.function = 1234
    launch.c_head = (1234, False, False)
    for name, value in overrides.items():
        setattr(launch, name, value)
    return launch, native_launch


def test_the_native_template_expands_to_what_the_direct_path_hands_tritons_launcher(recorded):
    """Slot for slot, the C++ launcher's parameters are the direct path's: a descriptor as its
    tensor map, shape and strides; a pointer as the tensor's address; the fixed rest; no
    constexpr; then the two null scratch pointers Triton's launcher appends."""
    launches, encodes, raw = recorded
    launch, native_launch = _templated(raw)
    a, x, b, y = _tensors()
    launch._direct((a, x, b, y))
    direct = launches.pop()[13:]  # after (grid, stream, function, flags, scratch, metadata, hooks' None x 3)
    function, grid, num_warps, num_ctas, shared, pdl, cooperative, slots = native_launch.template(launch)
    assert (function, grid, num_warps, num_ctas, shared, pdl, cooperative) == (1234, [2, 1, 1], 4, 1, 1024, False, False)
    expected = []
    for value in direct[:-1]:  # the trailing constexpr BLOCK: Triton's launcher skips it
        if isinstance(value, tuple) and value[0] == "map":  # the fake encoder's record: ("map", address, ...)
            expected.append(("map", 0 if value[1] == a.data_ptr() else 2))
        else:
            expected.append(value.data_ptr() if isinstance(value, torch.Tensor) else value)
    assert native_launch.expand(slots, [a, x, b, y]) == expected + [0, 0]
    descriptor = slots[0]
    swizzle, elem_size, host_elem_type, box = launch.encodings[0]  # the element type as the host enumerates it
    assert descriptor[3:6] == [swizzle, elem_size, host_elem_type] == [META["swizzle"], META["elem_size"],
                                                                       nvidia_driver.TMA_DTYPE_DEVICE_TO_HOST[10]]
    assert descriptor[6:] == BOX + [0]


@pytest.mark.parametrize("why", ["global scratch", "a fixed pointer", "a descriptor not lowered to TMA", "no C launcher"])
def test_the_native_template_declines_what_it_does_not_mirror(recorded, why):
    launches, encodes, raw = recorded
    overrides = {"global scratch": {"scratch_bytes": 128}, "a fixed pointer": {"rest": (None,)},
                 "a descriptor not lowered to TMA": {"encodings": (None, None, None)},
                 "no C launcher": {"c_launch": None}}[why]
    launch, native_launch = _templated(raw, **overrides)
    assert native_launch.template(launch) is None


def test_scalar_words_hold_the_bits_tritons_launcher_packs():
    from impl.attention import native_launch

    assert native_launch.word("i32", -1) == -1 and native_launch.word("u64", 2**64 - 1) == -1
    assert native_launch.word("fp32", 1.0) == 0x3F800000 and native_launch.word("fp16", 1.0) == 0x3C00
    assert native_launch.word("bf16", 1.0) == 0x3F80 and native_launch.word("fp64", 2.0) == 0x4000000000000000
    with pytest.raises(TypeError):
        native_launch.word("*bf16", 0)


def test_the_native_launcher_is_on_unless_switched_off(monkeypatch):
    from impl.attention import native_launch

    monkeypatch.delenv("LLM_SYSTEMS_NATIVE_LAUNCH", raising=False)
    assert native_launch.enabled()
    monkeypatch.setenv("LLM_SYSTEMS_NATIVE_LAUNCH", "0")
    assert not native_launch.enabled() and native_launch.extension() is None


def test_a_pass_with_a_launch_on_tritons_launcher_builds_nothing(monkeypatch):
    """A plan whose launches have no C++ id (no GPU: none was bound to Triton's C launcher) gets
    no pass, and asking for one must not build the extension (a compile of minutes on a CPU host)."""
    from impl.attention import native_launch

    built = []
    monkeypatch.setattr(native_launch, "extension", lambda: built.append(True))
    steps = ((types.SimpleNamespace(native=3), (0,)), (types.SimpleNamespace(native=None), (0, 1)))
    assert native_launch.register_pass(1, steps, (((4,), (1,), torch.float32),), ()) is None
    assert not built


def _built_extension():
    """The C++ launcher, built here (a CPU build: ``describe`` needs no driver); skipped only
    where there is no C++ compiler or no Python headers, so a source that does not compile fails."""
    import shutil

    from impl.attention import native_launch

    if not any(shutil.which(cxx) for cxx in (os.environ.get("CXX", "c++"), "c++", "g++")):
        pytest.skip("needs a C++ compiler to build impl/attention/csrc/native_launch.cpp")
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("needs Python's headers (Python.h) to build impl/attention/csrc/native_launch.cpp")
    return native_launch._build()


def test_the_cpp_launcher_passes_what_the_direct_path_hands_tritons_launcher(recorded):
    """The C++ side itself, through ``describe`` (what ``launch`` would pass): words and
    pointers as the direct path's, and each tensor map encoded from the arguments Triton's
    fill_tma_descriptor hands the driver (dimensions innermost first, byte strides of all but
    the outermost dimension, the box reversed)."""
    launches, encodes, raw = recorded
    launch, native_launch = _templated(raw)
    ext = _built_extension()
    a, x, b, y = _tensors()
    launch._direct((a, x, b, y))
    direct = launches.pop()[13:-1]  # the arguments after the head, less the trailing constexpr
    spec = native_launch.template(launch)
    described = ext.describe(ext.register_launch(*spec), [a, x, b, y])
    expected = []
    for value in direct:
        if isinstance(value, tuple) and value[0] == "map":  # the fake encoder's record of Triton's arguments
            _, address, swizzle, elem_size, elem_type, box, shape, strides, padding = value
            assert padding == 0
            rank = len(shape)
            expected.append((elem_type, rank, address, list(shape)[::-1],
                             [elem_size * s for s in strides[:-1]][::-1], list(box)[::-1], swizzle))
        else:
            expected.append(value.data_ptr() if isinstance(value, torch.Tensor) else value)
    assert described == expected + [0, 0]


def test_a_cpp_pass_allocates_its_outputs_and_scratch_and_hands_each_launch_its_bindings(recorded):
    """``describe_pass``: what ``run_pass`` does, without a driver.  Outputs come back with the
    registered sizes, strides and dtypes; each launch gets the tensors its binding names
    (inputs ++ outputs ++ scratch), one scratch buffer shared by the launches that name it."""
    launches, encodes, raw = recorded
    launch, native_launch = _templated(raw)
    ext = _built_extension()
    a, _, b, _ = _tensors()
    launch_id = ext.register_launch(*native_launch.template(launch))
    # two launches of one kernel: (a, out, b, scratch) and (b, scratch, a, out)
    pass_id = ext.register_pass(2, [launch_id, launch_id], [[0, 2, 1, 3], [1, 3, 0, 2]], [[4, 2]], [[1, 4]],
                                [torch.bfloat16], [[3]], [torch.float32])
    outputs, described = ext.describe_pass(pass_id, [a, b])
    (out,) = outputs
    assert (out.shape, out.stride(), out.dtype) == ((4, 2), (1, 4), torch.bfloat16)
    first, second = described
    pointer_at = (9, 19)  # after a descriptor's map, 4 sizes and 4 strides; then after the second's
    scratch = first[pointer_at[1]]
    assert scratch == second[pointer_at[0]] and scratch not in (a.data_ptr(), b.data_ptr(), out.data_ptr())
    assert first[pointer_at[0]] == second[pointer_at[1]] == out.data_ptr()
    expect_first = ext.describe(launch_id, [a, out, b, out])  # out stands in for the scratch's slot
    expect_second = ext.describe(launch_id, [b, out, a, out])
    for got, expected, at in ((first, expect_first, pointer_at[1]), (second, expect_second, pointer_at[0])):
        assert got[:at] + got[at + 1:] == expected[:at] + expected[at + 1:]
    with pytest.raises(RuntimeError, match="a pass of 2 inputs was given 1"):
        ext.describe_pass(pass_id, [a])
    with pytest.raises(RuntimeError, match="a binding names tensor 5 of 4"):
        ext.register_pass(2, [launch_id], [[0, 5]], [[4, 2]], [[1, 4]], [torch.bfloat16], [[3]], [torch.float32])


# --------------------------------------------------------------------------- the custom ops' C++ kernels

def _op_inputs(layout="contiguous", dtype=torch.bfloat16, offset=0, shape=(2, 3, 64, 32)):
    """q, k, v, O, L, dO of a backward call on the CPU (the key reads only their metadata)."""
    B, H, N, d = shape
    def one():
        if layout == "heads_split":  # (B, N, H, d) storage seen as (B, H, N, d), as a model splits heads
            return torch.zeros(B, N, H, d + offset, dtype=dtype)[..., offset:].transpose(1, 2)
        return torch.zeros(B, H, N, d + offset, dtype=dtype)[..., offset:]
    q, k, v, o, do = (one() for _ in range(5))
    return q, k, v, o, torch.zeros(B, H, N), do


# one change each to a backward call: (name, changed tensors, is_causal, scale, deterministic)
_BASE = dict(tensors=_op_inputs(), is_causal=True, scale=0.125, deterministic=False)
_CHANGES = {
    "another shape": dict(tensors=_op_inputs(shape=(2, 3, 80, 32))),
    "other strides, one tensor": dict(tensors=_op_inputs()[:2] + _op_inputs("heads_split")[2:3] + _op_inputs()[3:]),
    "another dtype": dict(tensors=_op_inputs(dtype=torch.float16)),
    "an address off 16 bytes": dict(tensors=_op_inputs(offset=1)),
    "not causal": dict(is_causal=False),
    "another scale": dict(scale=0.1),
    "deterministic mode": dict(deterministic=True),
}


def _keys(ext, call):
    """(the C++ op's key, the Gluon plan's key) of a backward call."""
    fg = pytest.importorskip("impl.attention.flash_gluon")
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(call["deterministic"])
    try:
        python = fg._backward_key(call["tensors"], call["is_causal"], call["scale"])
    finally:
        torch.use_deterministic_algorithms(previous)
    return ext.op_key(1, list(call["tensors"]), call["is_causal"], call["scale"], call["deterministic"]), python


@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_the_cpp_ops_key_a_call_apart_wherever_the_gluon_plans_do(change):
    """A C++ op runs the pass bound to its call's key, so that key must tell calls apart wherever
    the plans' keys do (a coarser one would run another signature's pass): each change that gives
    the plan another key gives the C++ op another key too; the same call at other (aligned)
    addresses keeps both."""
    ext = _built_extension()
    base_cpp, base_py = _keys(ext, _BASE)
    again_cpp, again_py = _keys(ext, dict(_BASE, tensors=_op_inputs()))
    assert again_py == base_py and again_cpp == base_cpp, "the same signature at other addresses changed a key"
    cpp, py = _keys(ext, dict(_BASE, **_CHANGES[change]))
    assert py != base_py, f"{change}: the plan's key did not change (this table is stale)"
    assert cpp != base_cpp, f"{change}: the plan's key changed and the C++ op's did not"


def test_the_cpp_op_kernels_decline_their_passes_while_the_call_graphs_are_on(monkeypatch):
    """The stream check the C++ op kernels call before a bound pass (``custom_ops._stream_for_pass``)
    reads ``call_graphs.ENABLED`` on every call, as the plans do: graphs switched on after a key
    was bound send its calls to Python (its plan, its graphs), and off again, back to the pass."""
    from impl.attention import call_graphs, custom_ops, triton_launch

    monkeypatch.setattr(triton_launch, "fast_stream", lambda index: 7 + index)
    monkeypatch.setattr(call_graphs, "ENABLED", False)
    assert custom_ops._stream_for_pass(0) == 7
    monkeypatch.setattr(call_graphs, "ENABLED", True)
    assert custom_ops._stream_for_pass(0) is None
    monkeypatch.setattr(call_graphs, "ENABLED", False)
    assert custom_ops._stream_for_pass(1) == 8


@pytest.fixture
def native_ops_restored():
    """The ops' C++ registrations as the import left them (``custom_ops.NATIVE_OPS``), after a test
    that registers them at another key or removes them: ``attention`` routes by that flag."""
    from impl.attention import custom_ops

    was = custom_ops.NATIVE_OPS
    yield
    custom_ops.disable_native_ops()
    if was:
        custom_ops.enable_native_ops()


@pytest.mark.usefixtures("native_ops_restored")
def test_the_cpp_op_kernels_serve_a_repeat_from_the_pass_python_named_and_send_the_rest_to_python():
    """The ops' C++ dispatch, at the CPU key with Python kernels that record their calls and passes
    of no launches (no driver needed).  A signature's first call goes to Python, which names a
    pass; its repeats get that pass's outputs (the registered strides) without Python.  Python
    serves, and nothing is bound, where the flavour is not Gluon, Python names no pass, dO's dtype
    is not q's, or the stream check declines; a bound signature in the other deterministic mode
    is another key; Python's errors reach the caller as they were raised."""
    from impl.attention import custom_ops

    ext = _built_extension()
    B, H, N, d = 2, 3, 8, 4
    dense = [[H * N * d, N * d, d, 1]]
    bwd_pass = ext.register_pass(6, [], [], [[B, H, N, d]] * 3, dense * 3, [torch.float32] * 3, [], [])
    fwd_pass = ext.register_pass(3, [], [], [[B, H, N, d], [B, H, N]], dense + [[H * N, N, 1]],
                                 [torch.float32] * 2, [], [])
    python_calls, named, stream = [], {"fwd": fwd_pass, "bwd": bwd_pass}, {"now": 7}

    def forward(q, k, v, is_causal, scale, flavour):
        python_calls.append("fwd")
        return torch.ones_like(q), torch.ones(q.shape[:-1]), named["fwd"]

    def backward(q, k, v, o, lse, grad_o, is_causal, scale, flavour):
        python_calls.append("bwd")
        if flavour == "raise":
            raise ValueError("attention: the Python kernel's own message")
        return torch.ones_like(q), torch.ones_like(k), torch.ones_like(v), named["bwd"]

    def backward_op(q, grad_o=None, flavour="gluon", scale=0.5):
        grad_o = q if grad_o is None else grad_o
        return custom_ops.flash_backward(q, q, q, q, q[..., 0], grad_o, True, scale, flavour)

    def served(call):
        """Where ``call`` was served: "python" or "pass" (and the outputs)."""
        before, counts = len(python_calls), ext.op_counts()
        out = call()
        from_cpp = ext.op_counts()[0] - counts[0]
        assert from_cpp + (len(python_calls) - before) == 1, "a call served twice, or not at all"
        return ("pass" if from_cpp else "python"), out

    ext.enable_ops(forward, backward, lambda device: stream["now"], on_cpu=True)
    try:
        q = torch.zeros(B, H, N, d)
        assert served(lambda: backward_op(q))[0] == "python"
        where, (dq, dk, dv) = served(lambda: backward_op(torch.zeros(B, H, N, d)))  # other addresses, same key
        assert where == "pass" and dq.stride() == tuple(dense[0]) and dq.shape == q.shape
        assert served(lambda: custom_ops.flash_forward(q, q, q, True, 0.5, "gluon"))[0] == "python"
        assert served(lambda: custom_ops.flash_forward(q, q, q, True, 0.5, "gluon"))[0] == "pass"
        assert served(lambda: backward_op(q, scale=0.25))[0] == "python"  # another key: bound by this call
        assert served(lambda: backward_op(q, scale=0.25))[0] == "pass"
        for flavour in ("triton", "triton"):  # a pass named, but not for Gluon
            assert served(lambda: backward_op(q, flavour=flavour))[0] == "python"
        named["bwd"] = -1
        other = torch.zeros(B, H, N + 1, d)
        assert [served(lambda: backward_op(other))[0] for _ in range(2)] == ["python"] * 2  # no pass named
        named["bwd"] = bwd_pass
        wide = torch.zeros(B, H, N, d, dtype=torch.float64)
        assert [served(lambda: backward_op(q, grad_o=wide))[0] for _ in range(2)] == ["python"] * 2
        stream["now"] = None
        assert served(lambda: backward_op(q))[0] == "python"  # bound, but the stream check declines
        stream["now"] = 7
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            assert served(lambda: backward_op(q))[0] == "python"
        finally:
            torch.use_deterministic_algorithms(previous)
        with pytest.raises(ValueError, match="the Python kernel's own message"):
            backward_op(q, flavour="raise")
    finally:
        ext.disable_ops()


def _reference_kernels(calls: list):
    """The ops' kernels as Python (at the CPU key): the PyTorch flavour's forward and backward
    (``flash_pytorch``), naming no pass, each call recorded; flavours named "raise ..." raise."""
    from impl.attention import flash_pytorch

    def forward(q, k, v, is_causal, scale, flavour):
        calls.append("fwd")
        if flavour == "raise in forward":
            raise ValueError("attention: the Python forward kernel's own message")
        o, lse = flash_pytorch.flash_forward(q, k, v, is_causal, scale)
        return o, lse, -1

    def backward(q, k, v, o, lse, grad_o, is_causal, scale, flavour):
        calls.append("bwd")
        if flavour == "raise":
            raise ValueError("attention: the Python kernel's own message")
        return (*flash_pytorch.flash_backward(q, k, v, o, lse, grad_o, is_causal, scale), -1)

    return forward, backward


def _check_flash_attention_node(calls: list) -> None:
    """What ``flash_attention``'s node must do (at the CPU key, over ``_reference_kernels``):
    raises AssertionError naming the first thing it does not."""
    from impl.attention import custom_ops
    from impl.attention.reference import attention_reference

    g = torch.Generator().manual_seed(0)
    for causal, n_q, n_k in [(True, 9, 9), (False, 5, 11)]:
        q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64).requires_grad_() for n in (n_q, n_k, n_k))
        grad_o = torch.randn(2, 3, n_q, 4, generator=g, dtype=torch.float64)
        del calls[:]
        o = custom_ops.flash_attention(q, k, v, causal, 0.375, "gluon")
        assert "FlashAttentionNode" in o.grad_fn.name(), f"the node is {o.grad_fn.name()}, not the C++ one"
        o.backward(grad_o)
        assert calls == ["fwd", "bwd"], f"kernels called: {calls}, not one forward and one backward"
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        want_o = attention_reference(*leaves, causal, 0.375)[0]
        want = torch.autograd.grad(want_o, leaves, grad_o)
        torch.testing.assert_close(o, want_o.detach(), rtol=0, atol=1e-12)
        for name, t, b in zip(("dQ", "dK", "dV"), (q, k, v), want):
            torch.testing.assert_close(t.grad, b, rtol=0, atol=1e-12, msg=f"causal={causal}: {name}")
        try:
            o.backward(grad_o)
        except RuntimeError as exc:  # the saved tensors were released by the first backward
            assert "second time" in str(exc) or "freed" in str(exc), str(exc)
        else:
            raise AssertionError("a second backward ran: the saved tensors were kept")

    x = torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    grad_x = torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64)
    custom_ops.flash_attention(x, x, x, True, 0.5, "gluon").backward(grad_x)
    leaf = x.detach().requires_grad_()
    attention_reference(leaf, leaf, leaf, True, 0.5)[0].backward(grad_x)
    torch.testing.assert_close(x.grad, leaf.grad, rtol=0, atol=1e-12, msg="one tensor as q, k and v")

    plain = x.detach()
    assert custom_ops.flash_attention(plain, plain, plain, True, 0.5, "gluon").grad_fn is None
    with torch.inference_mode():
        inferred = custom_ops.flash_attention(plain, plain, plain, True, 0.5, "gluon")
    torch.testing.assert_close(inferred, attention_reference(plain, plain, plain, True, 0.5)[0], rtol=0, atol=1e-12)

    o = custom_ops.flash_attention(x, x, x, False, 0.5, "gluon")
    try:
        torch.autograd.grad(o, x, torch.ones_like(o), create_graph=True)
    except RuntimeError as exc:
        assert "double backward" in str(exc), str(exc)
    else:
        raise AssertionError("a double backward (create_graph=True) went through: its second derivative is zero")
    for flavour, message in (("raise in forward", "the Python forward kernel's own message"),
                             ("raise", "the Python kernel's own message")):
        try:
            custom_ops.flash_attention(x, x, x, False, 0.5, flavour).sum().backward()
        except ValueError as exc:
            assert message in str(exc), str(exc)
        else:
            raise AssertionError(f"the kernel's error ({flavour}) did not reach the caller")


@pytest.mark.usefixtures("native_ops_restored")
def test_flash_attention_runs_forward_and_backward_through_its_cpp_node_with_the_kernels_gradients():
    """``flash_attention``, the eager model path's op: its autograd node is C++ (its name says so),
    the forward calls the forward kernel once and the backward the backward kernel once, and the
    gradients are those the kernels give (here the PyTorch flavour's, at the CPU key, float64,
    against the reference's autograd)
    for each input, one tensor passed as q, k and v included.  The saved tensors are freed after a
    backward; below autograd (inference mode) it gives O alone; a double backward is refused by
    name, and a kernel's error is raised as it was."""
    ext = _built_extension()
    calls = []
    ext.enable_ops(*_reference_kernels(calls), lambda device: None, on_cpu=True)
    try:
        _check_flash_attention_node(calls)
    finally:
        ext.disable_ops()
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("llm_systems::flash_attention", "Autograd"), \
        "disable_ops left flash_attention's node registered"


@pytest.mark.usefixtures("native_ops_restored")
@pytest.mark.parametrize("mutant, caught", [(1, "causal=True: dK"), (2, "double backward")])
def test_the_nodes_kept_mutants_are_rejected(mutant, caught):
    """The node's kept mutants (``set_node_mutant``: 1 dK and dV swapped, 2 a double backward let
    through) each fail the node's check, by the named check."""
    ext = _built_extension()
    calls = []
    ext.enable_ops(*_reference_kernels(calls), lambda device: None, on_cpu=True)
    ext.set_node_mutant(mutant)
    try:
        with pytest.raises(AssertionError, match=caught):
            _check_flash_attention_node(calls)
    finally:
        ext.set_node_mutant(0)
        ext.disable_ops()
    with pytest.raises(RuntimeError, match="no node mutant"):
        ext.set_node_mutant(3)


@pytest.mark.usefixtures("native_ops_restored")
def test_attention_takes_the_cpp_node_for_gluon_only_while_the_native_ops_are_on(monkeypatch):
    """``attention`` in eager mode: the Gluon flavour through ``flash_attention`` (the C++ node) while
    ``NATIVE_OPS`` says the C++ kernels are registered, with the default scale 1/sqrt(d) filled
    in; the flavour's autograd.Function otherwise, and always for the Triton flavour."""
    from impl.attention import custom_ops

    ext = _built_extension()
    calls, seen = [], []
    forward, backward = _reference_kernels(calls)
    ext.enable_ops(lambda *a: (seen.append(a[3:]), forward(*a))[1], backward, lambda device: None, on_cpu=True)
    try:
        q = torch.randn(1, 2, 5, 16, dtype=torch.float64, requires_grad=True)
        monkeypatch.setattr(custom_ops, "NATIVE_OPS", True)
        assert "FlashAttentionNode" in custom_ops.attention(q, q, q, True, "gluon").grad_fn.name()
        assert seen == [(True, 0.25, "gluon")]
        sentinel = object()
        monkeypatch.setattr(custom_ops, "_kernels", lambda flavour: types.SimpleNamespace(
            FlashAttentionTriton=types.SimpleNamespace(apply=lambda *a: sentinel),
            FlashAttentionGluon=types.SimpleNamespace(apply=lambda *a: sentinel)))
        assert custom_ops.attention(q, q, q, True, "triton") is sentinel
        monkeypatch.setattr(custom_ops, "NATIVE_OPS", False)
        assert custom_ops.attention(q, q, q, True, "gluon") is sentinel
    finally:
        ext.disable_ops()


@pytest.mark.usefixtures("native_ops_restored")
def test_a_bound_key_runs_its_pass_for_any_call_with_that_key_and_no_other():
    """``bind`` / ``run_bound``, the Gluon Function's C++ look-up (a pass of no launches: no driver
    needed).  A key bound by one call finds its pass for the same signature at other aligned
    addresses, and runs it (outputs as registered); every change that gives the plan another key
    (each of _CHANGES, the deterministic mode read at the call), the other kind, or scale 0 (the
    sentinel for None) finds none, and run_bound returns None.  Binding a pass never registered
    is an error."""
    ext = _built_extension()
    B, H, N, d = 2, 3, 64, 32
    dense = [[H * N * d, N * d, d, 1]]
    pass_id = ext.register_pass(6, [], [], [[B, H, N, d]] * 3, dense * 3, [torch.float32] * 3, [], [])

    def look(call, kind=1, scale=None):
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(call["deterministic"])
        try:
            scale = call["scale"] if scale is None else scale
            return ext.bound_pass(kind, list(call["tensors"]), call["is_causal"], scale), ext.run_bound(
                kind, 7, list(call["tensors"]), call["is_causal"], scale)
        finally:
            torch.use_deterministic_algorithms(previous)

    ext.clear_bound()
    ext.bind(1, list(_BASE["tensors"]), _BASE["is_causal"], _BASE["scale"], pass_id)
    hits, misses = ext.bound_counts()
    found, outputs = look(dict(_BASE, tensors=_op_inputs()))
    assert found == pass_id and [(o.shape, o.stride()) for o in outputs] == [((B, H, N, d), tuple(dense[0]))] * 3
    assert ext.bound_counts() == (hits + 1, misses)
    for change in sorted(_CHANGES):
        assert look(dict(_BASE, **_CHANGES[change])) == (-1, None), f"{change}: found the pass bound to another key"
    assert look(_BASE, kind=0) == (-1, None) and look(_BASE, scale=0.0) == (-1, None)
    assert ext.bound_counts() == (hits + 1, misses + len(_CHANGES) + 2)
    with pytest.raises(RuntimeError, match="no pass registered"):
        ext.bind(1, list(_BASE["tensors"]), True, 0.125, pass_id + 1000)
    ext.bind(1, list(_BASE["tensors"]), _BASE["is_causal"], _BASE["scale"], pass_id)
    ext.disable_ops()
    assert look(_BASE) == (-1, None), "disable_ops left a key bound"
    ext.bind(1, list(_BASE["tensors"]), _BASE["is_causal"], _BASE["scale"], pass_id)
    ext.clear_bound()
    assert look(_BASE) == (-1, None), "clear_bound left a key bound"


# --------------------------------------------------------------------------- on a Hopper GPU


@contextlib.contextmanager
def _cpp_ops_on(monkeypatch, fg, deterministic: bool):
    """The custom ops' C++ kernels on (the launcher on, call graphs off), the deterministic mode
    set and no plan cached, for one GPU test: yields the extension.  After it the mode is restored
    and the plans dropped; ``native_ops_restored`` restores the ops' registration."""
    from impl.attention import call_graphs, custom_ops

    ext = _built_extension()
    monkeypatch.setenv("LLM_SYSTEMS_NATIVE_LAUNCH", "1")
    monkeypatch.setattr(call_graphs, "ENABLED", False)
    fg._PLANS.clear()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        assert custom_ops.enable_native_ops() and custom_ops.NATIVE_OPS
        yield ext
    finally:
        custom_ops.disable_native_ops()
        torch.use_deterministic_algorithms(previous)
        fg._PLANS.clear()


def _assert_the_plans_gradients(want, got, deterministic: bool, where: str) -> None:
    """dQ, dK, dV as the plans gave them: the same bits, but dQ in the non-deterministic mode,
    whose float32 sums may be reordered (within two bf16 ulps)."""
    for name, a, b in zip(("dQ", "dK", "dV"), want, got):
        if name == "dQ" and not deterministic:
            torch.testing.assert_close(b.float(), a.float(), rtol=2 * 2.0**-8, atol=1e-6, msg=where)
        else:
            assert torch.equal(a, b), f"{where}: {name} differs"


@pytest.mark.usefixtures("native_ops_restored")
@pytest.mark.parametrize("deterministic", [True, False])
def test_the_cpp_ops_serve_a_repeated_signature_from_its_pass_as_the_python_kernels_do(monkeypatch, gluon_on_hopper,
                                                                                            deterministic):
    """With the C++ launcher on and call graphs off, the custom ops' C++ kernels: a call's first
    run goes to Python and binds its plan's pass; repeats run the pass from C++ with the Python
    kernels' results (the same bits; dQ in the non-deterministic mode within the reordering of
    its float32 sums); a call of another layout is not served by that pass; bad input raises
    the Python kernel's error."""
    from impl.attention import custom_ops

    fg = gluon_on_hopper
    with _cpp_ops_on(monkeypatch, fg, deterministic) as ext:
        g = torch.Generator(device="cuda").manual_seed(0)
        for B, H, N, d, causal, layout in [(2, 3, 128, 64, True, "bhnd"), (1, 4, 300, 128, False, "bhnd"),
                                           (2, 3, 128, 64, True, "bnhd"), (2, 2, 1000, 64, True, "bnhd")]:
            def draw():
                if layout == "bnhd":
                    return torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                return torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g)
            q, k, v, do = draw(), draw(), draw(), draw()
            scale = d ** -0.5
            want_o, want_lse = fg.flash_forward(q, k, v, causal, scale)
            want = fg.flash_backward(q, k, v, want_o, want_lse, do, causal, scale)
            before = ext.op_counts()
            for call in range(3):
                o, lse = custom_ops.flash_forward(q, k, v, causal, scale, "gluon")
                got = custom_ops.flash_backward(q, k, v, o, lse, do, causal, scale, "gluon")
                where = f"B{B} H{H} N{N} d{d} causal={causal} {layout}, call {call + 1}"
                assert torch.equal(o, want_o) and torch.equal(lse, want_lse), f"{where}: forward differs"
                for name, a, b in zip(("dQ", "dK", "dV"), want, got):
                    assert a.stride() == b.stride(), f"{where}: {name} strides {b.stride()}, not {a.stride()}"
                _assert_the_plans_gradients(want, got, deterministic, where)
            from_cpp, from_python, _ = (after - first for after, first in zip(ext.op_counts(), before))
            # the Python path above bound nothing: the first op calls go to Python, the repeats to C++
            assert (from_cpp, from_python) == (4, 2), f"{B, H, N, d, causal, layout}: {from_cpp} calls from C++, " \
                                                      f"{from_python} through Python"
        # bad input through the C++ kernel: the Python kernel's own error, not a crash
        bad = torch.zeros(1, 2, 64, 48, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError) as direct:
            fg.flash_forward(bad, bad, bad, True, 0.125)
        with pytest.raises(ValueError) as through_op:
            custom_ops.flash_forward(bad, bad, bad, True, 0.125, "gluon")
        assert str(direct.value) in str(through_op.value)


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_gluon_functions_repeats_run_their_bound_pass_with_the_plans_results(monkeypatch, gluon_on_hopper,
                                                                                 deterministic):
    """With the C++ launcher on and call graphs off, the Gluon autograd.Function: a signature's
    first forward and backward go through the plans and bind their passes; the repeats run them
    by ``run_bound`` (its hit count rises by two a call) with the plans' results (the same bits;
    dQ in the non-deterministic mode within the reordering of its float32 sums)."""
    from impl.attention import call_graphs, native_launch

    fg = gluon_on_hopper
    monkeypatch.setenv("LLM_SYSTEMS_NATIVE_LAUNCH", "1")
    monkeypatch.setattr(call_graphs, "ENABLED", False)
    ext = native_launch.extension()
    assert ext is not None and native_launch.run_bound is not None, "the C++ launcher was not built"
    fg._PLANS.clear()
    ext.clear_bound()  # keys other tests' calls bound (the table lives as long as the process)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        g = torch.Generator(device="cuda").manual_seed(1)
        for B, H, N, d, causal, layout in [(1, 1, 512, 64, True, "bhnd"), (1, 4, 300, 128, False, "bhnd"),
                                           (2, 2, 1000, 64, True, "bnhd")]:
            def draw():
                if layout == "bnhd":
                    return torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                return torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g)
            q, k, v, do = draw(), draw(), draw(), draw()
            want_o, want_lse = fg.flash_forward(q, k, v, causal)
            want = fg.flash_backward(q, k, v, want_o, want_lse, do, causal)
            for call in range(3):
                before = ext.bound_counts()[0]
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                o = fg.FlashAttentionGluon.apply(*leaves, causal)
                o.backward(do)
                where = f"B{B} H{H} N{N} d{d} causal={causal} {layout}, call {call + 1}"
                hits = ext.bound_counts()[0] - before
                assert hits == (0 if call == 0 else 2), f"{where}: {hits} of the forward and backward run_bound"
                assert torch.equal(o, want_o), f"{where}: O differs"
                _assert_the_plans_gradients(want, [leaf.grad for leaf in leaves], deterministic, where)
    finally:
        torch.use_deterministic_algorithms(previous)
        fg._PLANS.clear()


@pytest.mark.usefixtures("native_ops_restored")
@pytest.mark.parametrize("deterministic", [True, False])
def test_the_eager_model_paths_cpp_node_gives_the_plans_results_and_runs_repeats_without_python(
        monkeypatch, gluon_on_hopper, deterministic):
    """``custom_ops.attention`` for the Gluon flavour with the C++ kernels on: its output's node is the
    C++ one, its first forward and backward go to Python and bind their passes, each repeat runs
    both passes from C++ (the ops' C++ count rises by two a call, Python's by none), and O and the
    gradients are the plans' (the same bits; dQ in the non-deterministic mode within the reordering
    of its float32 sums), a dO of another layout included."""
    from impl.attention import custom_ops

    fg = gluon_on_hopper
    with _cpp_ops_on(monkeypatch, fg, deterministic) as ext:
        g = torch.Generator(device="cuda").manual_seed(2)
        for B, H, N, d, causal, do_layout in [(4, 12, 256, 64, True, "bhnd"), (1, 4, 300, 128, False, "bhnd"),
                                              (2, 2, 1000, 64, True, "bnhd")]:
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            do = torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2) \
                if do_layout == "bnhd" else torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g)
            want_o, want_lse = fg.flash_forward(q, k, v, causal)
            want = fg.flash_backward(q, k, v, want_o, want_lse, do, causal)
            for call in range(3):
                before = ext.op_counts()
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                o = custom_ops.attention(*leaves, causal, "gluon")
                o.backward(do)
                where = f"B{B} H{H} N{N} d{d} causal={causal} dO {do_layout}, call {call + 1}"
                assert "FlashAttentionNode" in o.grad_fn.name(), f"{where}: the node is {o.grad_fn.name()}"
                from_cpp, from_python, _ = (after - first for after, first in zip(ext.op_counts(), before))
                assert (from_cpp, from_python) == ((0, 2) if call == 0 else (2, 0)), \
                    f"{where}: {from_cpp} passes from C++, {from_python} calls through Python"
                assert torch.equal(o, want_o), f"{where}: O differs"
                _assert_the_plans_gradients(want, [leaf.grad for leaf in leaves], deterministic, where)
