"""Low-precision facts (self-checks): fp16 accumulation and autocast dtypes in impl's GPT.

1. CS336's demonstration: add 0.01 a thousand times (a) in fp32, (b) in fp16, (c) fp16
   values into an fp32 accumulator.  The expected results are derived here, not typed in:
   every addition is emulated exactly with ``fractions.Fraction`` and rounded to nearest,
   ties to even, into the format (fp16: 11-bit significand, minimum normal exponent -14;
   fp32: 24 and -126), and cross-checked against numpy's float16/float32 scalars.  The
   same holds as a property for any addend and count.
2. CPU autocast (bf16 and fp16) on impl's GPT, observed op by op with a
   TorchDispatchMode: the matrix products (mm, bmm, SDPA) run in the low precision;
   embedding, the residual stream and impl's RMSNorm statistics stay fp32; the loss
   (log_softmax and nll_loss: cross_entropy is on CPU autocast's fp32 list) is fp32.  On
   CPU, softmax and layer_norm are on no list and follow their input (low precision
   here); CUDA's autocast runs them in fp32 instead, which is not asserted on this CPU.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.profiles import examples

FORMATS = {torch.float16: (11, -14), torch.float32: (24, -126)}  # significand bits, min normal exponent


def round_to(x: Fraction, dtype) -> Fraction:
    """x rounded to nearest, ties to even, in ``dtype`` (no overflow in these sums)."""
    if x == 0:
        return Fraction(0)
    p, emin = FORMATS[dtype]
    sign, a = (1 if x > 0 else -1), abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2 a) is e or e - 1
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, emin) - p + 1)
    q, r = divmod(a, ulp)
    n = int(q) + (1 if r > ulp / 2 or (r == ulp / 2 and int(q) % 2 == 1) else 0)
    return sign * n * ulp


def emulate(value: float, count: int, addend_dtype, acc_dtype) -> Fraction:
    addend = round_to(Fraction(value), addend_dtype)
    s = Fraction(0)
    for _ in range(count):
        s = round_to(s + addend, acc_dtype)
    return s


def torch_sum(value: float, count: int, addend_dtype, acc_dtype) -> float:
    s = torch.tensor(0, dtype=acc_dtype)
    x = torch.tensor(value, dtype=addend_dtype)
    for _ in range(count):
        s += x.type(acc_dtype)
    return float(s)


def numpy_sum(value: float, count: int, addend_dtype, acc_dtype) -> float:
    np_dt = {torch.float16: np.float16, torch.float32: np.float32}
    s, x = np_dt[acc_dtype](0), np_dt[acc_dtype](np_dt[addend_dtype](value))
    for _ in range(count):
        s = np_dt[acc_dtype](s + x)
    return float(s)


MODES = {"fp32": (torch.float32, torch.float32), "fp16": (torch.float16, torch.float16),
         "fp16 into fp32": (torch.float16, torch.float32)}


@pytest.mark.parametrize("mode", list(MODES))
def test_cs336_thousand_additions_of_0_01_equal_the_exact_round_to_nearest_even_emulation(mode):
    addend, acc = MODES[mode]
    want = emulate(0.01, 1000, addend, acc)
    assert torch_sum(0.01, 1000, addend, acc) == float(want)
    assert numpy_sum(0.01, 1000, addend, acc) == float(want)


def test_fp16_accumulation_is_the_worst_and_fp32_accumulation_of_fp16_values_keeps_their_rounding():
    exact = {m: emulate(0.01, 1000, *MODES[m]) for m in MODES}
    errors = {m: abs(v - 10) for m, v in exact.items()}
    assert errors["fp16"] > errors["fp16 into fp32"] > errors["fp32"]
    # fp32 accumulation of the fp16 addend is close to 1000 * fp16(0.01): the addend's own rounding dominates
    assert abs(exact["fp16 into fp32"] - 1000 * round_to(Fraction(0.01), torch.float16)) < errors["fp16 into fp32"]


@settings(max_examples=examples(25), deadline=None)
@given(value=st.floats(1e-4, 4.0, allow_nan=False), count=st.integers(1, 300), mode=st.sampled_from(list(MODES)))
def test_torch_running_sums_equal_the_exact_emulation_for_any_addend_and_count(value, count, mode):
    addend, acc = MODES[mode]
    assert torch_sum(value, count, addend, acc) == float(emulate(value, count, addend, acc))


# --- autocast dtypes per op class in impl's GPT ---------------------------------------------


class _Dtypes(TorchDispatchMode):
    """aten op name -> the dtypes of its floating outputs."""

    def __init__(self):
        super().__init__()
        self.ops: dict[str, set] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        dtypes = {o.dtype for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()}
        self.ops.setdefault(func.overloadpacket.__name__, set()).update(dtypes)
        return out


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_cpu_autocast_runs_matmuls_low_and_keeps_embedding_residual_norm_statistics_and_loss_in_fp32(low, attention):
    from impl.models.gpt import make_gpt, random_batch

    torch.manual_seed(0)
    model = make_gpt("tiny", attention=attention)
    idx, targets = random_batch(model.cfg, 2, 8)
    with torch.autocast("cpu", dtype=low), _Dtypes() as seen:
        logits = model(idx)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    ops = seen.ops
    matmuls = [op for op in ops if op in ("mm", "addmm", "bmm", "matmul", "linear") or op.startswith("_scaled_dot_product")]
    assert matmuls, f"no matrix product observed: {sorted(ops)}"
    for op in matmuls:
        assert low in ops[op], f"{op} outputs {ops[op]}, expected {low} under autocast"
    assert ops["mm"] == {low}, f"linear layers (mm) output {ops['mm']}"
    assert ops["embedding"] == {torch.float32}
    assert ops["add"] == {torch.float32}, "the residual stream (embedding + block outputs) stays fp32"
    for op in ("pow", "mean", "rsqrt"):  # impl's RMSNorm statistics are upcast on purpose
        assert ops[op] == {torch.float32}, f"RMSNorm's {op} outputs {ops[op]}"
    for op in ("_log_softmax", "nll_loss_forward"):  # cross_entropy: on CPU autocast's fp32 list
        assert ops[op] == {torch.float32}, f"{op} outputs {ops[op]}"
    assert logits.dtype == low and loss.dtype == torch.float32
    if attention == "eager":  # the materialised softmax is on no CPU list: it follows its low-precision input
        assert ops["_softmax"] == {low}


def test_cpu_autocast_softmax_and_layer_norm_follow_their_input_while_cross_entropy_is_fp32():
    x = torch.randn(3, 5).to(torch.bfloat16)
    w = torch.randn(5, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = x.float() @ w  # a matmul: low precision
        assert h.dtype == torch.bfloat16
        assert torch.softmax(h, -1).dtype == torch.bfloat16
        assert F.layer_norm(h, (5,)).dtype == torch.bfloat16
        assert F.cross_entropy(h, torch.tensor([0, 1, 2])).dtype == torch.float32
        assert torch.softmax(x.float(), -1).dtype == torch.float32  # an fp32 input stays fp32
