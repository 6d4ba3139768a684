"""Fixed spec cases for attention, in our own words.

Two tiers, each by flavour (``CS336[flavour]``, ``API[flavour]``):

- ``CS336``: the contract of CS336 assignment 2's FlashAttention adapters, which every
  student implementation must meet: ``apply(q, k, v, is_causal=False)`` on (B, N, d)
  inputs returns O; exactly one tensor of shape ``q.shape[:-1]`` (the logsumexp L) is saved
  for backward; ``is_causal`` is optional and defaults to False; forward and backward
  match the reference at B=4, N=128, d=64 without masking, and for the Triton flavour
  with causal masking too.
- ``API``: the wider contract this project's ``impl`` offers: (B, H, N, d) inputs,
  N_q != N_k, head dims 16..128 and odd ones up to 256, non-contiguous inputs, an
  explicit softmax scale, and clear errors for bad input; and causal masking in the
  PyTorch flavour.

Causal masking and the PyTorch flavour: the handouts (spring 2025 and 2026, section
FlashAttention-2, part (a)) give the PyTorch flavour the interface
``forward(ctx, Q, K, V, is_causal=False)`` but say "You can ignore the is_causal flag for
this task"; only part (c) asks for the causal flag, of the Triton kernel.  So for the
PyTorch flavour the CS336 tier checks only that the flag is accepted and off by default
(``is_causal_is_optional_and_off_by_default``), and the checks that need it honoured
(``is_causal_defaults_to_false``: the default differs from the causal result;
``cs336_causal_forward_backward``; ``causal_masking_in_every_extra_shape``) are API tier,
and its other extras hold masking off, so that a flavour ignoring the flag fails the
masking rows alone.

Float32 precision: the course's tests compare a float32 kernel with tolerances of 1e-2, so
a Triton kernel whose dots run in TF32 (tl.dot's default for float32 on NVIDIA GPUs) meets
the contract; the CS336 tier, the contract laws and every extra but one accept results within
the TF32 oracle (``laws.tf32_dots_accepted``): the extra ``float32_inputs_keep_float32_accuracy``
holds float32 inputs to float32 arithmetic and names TF32 where that is the difference.

What fixes each CS336-tier check (the 2025 and 2026 handouts, section FlashAttention-2, and
the course's ``tests/test_attention.py`` through ``tests/adapters.py``):

- ``saves_one_logsumexp_of_query_shape``: the course tests ``test_flash_forward_pass_*``
  ("Expected one tensor of shape (batch_size, n_queries) in saved tensors"); which other
  tensors are saved (O, or nothing but Q, K, V and L) is free.
- ``is_causal_is_optional_and_off_by_default`` / ``is_causal_defaults_to_false``: the
  handout's interface ``forward(ctx, Q, K, V, is_causal=False)``; the default call is judged
  within the oracle, not bit for bit against an explicit False (determinism is an extra).
- ``cs336_noncausal_forward_backward``, ``cs336_causal_forward_backward``: the course tests'
  shape (B = 4, N = 128, d = 64) and their comparison with the reference (O, L, dQ, dK, dV;
  causal for the Triton flavour), judged by the float64 oracle, TF32 dots accepted.
- ``*_at_every_handout_size``: the handout's promise to test "dimensions that are powers of
  2 and at least 16" (its benchmark's head dims run to 128): a tile larger than N, or one
  that reads past the last row, shows at the small ones.  No tile size is asked of a target.
- ``sixteen_bit_*``: the handout benchmarks and compares the kernels in bfloat16.
No CS336-tier check counts launches, memory, recomputations or saved bytes, nor reads an
error's wording (the error checks are extras and accept any message that names the problem).

Each check is ``check(attn, device)`` and raises AssertionError on a violation.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap

import torch

from conformance import isolation, oracle
from conformance.verdicts import NeedsHardware, Verdict, classify
from conformance.laws.attention.hopper import GLUON_DTYPES, GLUON_HEAD_DIMS
from conformance.laws.attention.strategies import AttentionCase, Budget, fit_to_budget
from conformance.laws.attention.laws import (
    _judge,
    accepts_scale,
    call,
    forward_matches_float64_reference,
    fresh_compile_caches,
    gradients_match_float64_reference,
    references,
    saved_logsumexp,
    tf32_dots_accepted,
)


# The domain of the flavour whose checks run now (a Budget), or None: any head dim and dtype.
# The Gluon flavour offers d 64 and 128 in 16-bit only: its tier runs the same checks with
# each case moved into that domain (strategies.fit_to_budget), the same shapes otherwise.
_DOMAIN: list = [None]


def _case(batch=(4,), n_q=128, n_k=128, d=64, dtype=torch.float32, causal=False, scale=None, layout="contiguous", seed=0):
    case = AttentionCase(batch, n_q, n_k, d, dtype, causal, scale, 1.0, layout, seed)
    return case if _DOMAIN[0] is None else fit_to_budget(case, _DOMAIN[0])


def _dtype(default=torch.float32) -> torch.dtype:
    """``default`` where the running flavour offers it, else its widest 16-bit dtype."""
    domain = _DOMAIN[0]
    return default if domain is None or default in domain.dtypes else domain.dtypes[-1]


GLUON_DOMAIN = Budget(max_len=1 << 16, max_batch_elems=64, head_dims=GLUON_HEAD_DIMS, dtypes=GLUON_DTYPES)


def _within(domain, check):
    """``check`` with its cases moved into ``domain``."""
    def run(attn, device):
        _DOMAIN[0] = domain
        try:
            check(attn, device)
        finally:
            _DOMAIN[0] = None

    run.__name__ = run.__qualname__ = check.__name__
    run.__doc__ = check.__doc__
    return run


# --- CS336 tier ----------------------------------------------------------------------


def saves_one_logsumexp_of_query_shape(attn, device):
    """Exactly one saved tensor has shape q.shape[:-1], and it is L (>= the row max score)."""
    (q, k, v, _), _ = _case().make(device)
    o = attn.apply(q, k, v, False)
    lse = saved_logsumexp(o, q)
    if not torch.isfinite(lse).all():
        raise AssertionError("the saved logsumexp has non-finite entries")


def _default_is_not_causal(attn, device):
    """apply(q, k, v) without the flag: O within the oracle of the not-causal reference.
    Not bit for bit against apply(q, k, v, False): that would also ask a deterministic
    forward, which no handout does (the extra ``forward_is_bitwise_deterministic`` asks it)."""
    case = _case(n_q=64, n_k=64, causal=False)
    (q, k, v, _), _ = case.make(device)
    with oracle.poisoned_allocations(device):
        default = attn.apply(q, k, v)
    with tf32_dots_accepted():
        _judge("apply(q, k, v) without is_causal, against the not-causal reference:", default, references(case, device, False), "O", case)
    return q, k, v, default


def is_causal_is_optional_and_off_by_default(attn, device):
    """apply(q, k, v) is accepted and gives the not-causal result (the handout's interface
    ``forward(ctx, Q, K, V, is_causal=False)``)."""
    _default_is_not_causal(attn, device)


def is_causal_defaults_to_false(attn, device):
    """As above, and apply(q, k, v, True) differs from it (so the flag is honoured)."""
    q, k, v, default = _default_is_not_causal(attn, device)
    causal = attn.apply(q, k, v, True)
    if torch.equal(default.detach(), causal.detach()):  # then True gives what the default gives
        raise AssertionError("is_causal is ignored: apply(q, k, v, True) equals apply(q, k, v) bit for bit")


def cs336_noncausal_forward_backward(attn, device):
    """B=4, N=128, d=64, not causal: O, L and the gradients match the reference (float32
    dots in TF32 accepted, as the course's tests accept them: laws.tf32_dots_accepted)."""
    with tf32_dots_accepted():
        forward_matches_float64_reference(attn, _case(causal=False, seed=1), device)
        gradients_match_float64_reference(attn, _case(causal=False, seed=2), device)


def cs336_causal_forward_backward(attn, device):
    """B=4, N=128, d=64, causal: O, L and the gradients match the reference (TF32 dots accepted)."""
    with tf32_dots_accepted():
        forward_matches_float64_reference(attn, _case(causal=True, seed=3), device)
        gradients_match_float64_reference(attn, _case(causal=True, seed=4), device)


# The handout promises tests "with dimensions that are powers of 2 and at least 16": every
# such N up to 256 and d up to 128 at least once (a tile larger than N, or one that reads
# past the last row, shows at the small ones).
HANDOUT_SIZES = ((16, 16), (16, 128), (32, 64), (64, 32), (128, 128), (256, 16), (256, 64))


def _named_at(where: str, exc: Exception) -> None:
    """Raise ``exc`` as a failure that names ``where`` (a size, a shape), unless it is a
    verdict (not offered, needs a GPU, not run here), which passes through unchanged."""
    if classify(exc) is not None:
        raise exc
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [""]
    # the first line, and the last where there are more: einops and torch.compile put the
    # cause ("can't divide axis of length 16 in chunks of 32") at the end
    said = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    kind = "" if isinstance(exc, AssertionError) else f"{type(exc).__name__}: "
    raise AssertionError(f"{where}: {kind}{said}") from exc


def _at_handout_sizes(attn, device, part, causal_values):
    for n, d in HANDOUT_SIZES:
        for causal in causal_values:
            where = f"N={n}, d={d}, {'causal' if causal else 'not causal'}"
            isolation.note_step(where)  # named if the process dies here
            case = _case(batch=(2,), n_q=n, n_k=n, d=d, causal=causal, seed=n * 1000 + d + causal)
            try:
                with tf32_dots_accepted():
                    part(attn, case, device)
            except Exception as exc:  # noqa: BLE001 - a shape error at one size is a failure at that size
                _named_at(where, exc)


# Three checks, so that each lands in its own row of the report (forward, backward, causal)
# and a target whose backward is not offered still has its forward judged at every size.
def outputs_at_every_handout_size(attn, device):
    """B=2, N and d powers of 2 from 16 (N to 256, d to 128), not causal: O and L."""
    _at_handout_sizes(attn, device, forward_matches_float64_reference, (False,))


def gradients_at_every_handout_size(attn, device):
    """The same sizes, not causal: dQ, dK, dV."""
    _at_handout_sizes(attn, device, gradients_match_float64_reference, (False,))


def causal_at_every_handout_size(attn, device):
    """The same sizes, causal (the Triton flavour's contract): O, L, then the gradients."""
    _at_handout_sizes(attn, device, forward_matches_float64_reference, (True,))
    _at_handout_sizes(attn, device, gradients_match_float64_reference, (True,))


# 16-bit inputs at the contract's shape: the properties' contract laws draw bf16 and fp16
# too (the handout benchmarks and ranks the kernels in bf16).  Under the Triton interpreter
# bf16 dots are broken (the interpreter's, not the target's), so there it is float16.
def _sixteen_bit(device) -> torch.dtype:
    interpreted = torch.device(device).type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return torch.float16 if interpreted else torch.bfloat16


def _sixteen_bit_case(attn, device, part, seed, dtype=None):
    dtype = dtype or _sixteen_bit(device)
    case = _case(dtype=dtype, seed=seed)
    try:
        part(attn, case, device)
    except Exception as exc:  # noqa: BLE001 - name the dtype: a float32-only kernel crashes here
        if part is gradients_match_float64_reference and not isinstance(exc, AssertionError):
            _backward_offered(attn, device)
        _named_at(f"B=4, N=128, d=64, {str(dtype).removeprefix('torch.')}, not causal", exc)


def _backward_offered(attn, device) -> None:
    """The gradient check runs the forward first: where the 16-bit forward crashes, a target
    that offers no backward at all reads "not offered" in its backward row (the crash is
    its forward row's failure), as it does in float32."""
    try:
        gradients_match_float64_reference(attn, _case(batch=(1,), n_q=16, n_k=16, d=16, seed=5), device)
    except Exception as exc:  # noqa: BLE001 - only a verdict matters here
        verdict = classify(exc)
        if verdict is not None:
            raise verdict from exc


def sixteen_bit_outputs_at_the_contract_shape(attn, device, dtype=None):
    """B=4, N=128, d=64, bf16 (fp16 under the Triton interpreter), not causal: O and L."""
    _sixteen_bit_case(attn, device, forward_matches_float64_reference, 21, dtype)


def sixteen_bit_gradients_at_the_contract_shape(attn, device, dtype=None):
    """The same inputs: dQ, dK, dV."""
    _sixteen_bit_case(attn, device, gradients_match_float64_reference, 22, dtype)


def _in_bfloat16(check):
    """``check`` in bf16 wherever it runs (the PyTorch flavour needs no interpreter)."""
    def bf16(attn, device):
        check(attn, device, dtype=torch.bfloat16)

    bf16.__name__ = bf16.__qualname__ = check.__name__
    bf16.__doc__ = check.__doc__
    return bf16


# The PyTorch flavour may ignore is_causal (see the module docstring).
CS336 = {
    "pytorch": (saves_one_logsumexp_of_query_shape, is_causal_is_optional_and_off_by_default, cs336_noncausal_forward_backward,
                outputs_at_every_handout_size, gradients_at_every_handout_size,
                _in_bfloat16(sixteen_bit_outputs_at_the_contract_shape), _in_bfloat16(sixteen_bit_gradients_at_the_contract_shape)),
    "triton": (saves_one_logsumexp_of_query_shape, is_causal_defaults_to_false, cs336_noncausal_forward_backward,
               cs336_causal_forward_backward, outputs_at_every_handout_size, gradients_at_every_handout_size,
               causal_at_every_handout_size, sixteen_bit_outputs_at_the_contract_shape,
               sixteen_bit_gradients_at_the_contract_shape),
}


# --- API tier -------------------------------------------------------------------------


def _shape_of(case) -> str:
    mask = "causal" if case.is_causal else "not causal"
    layout = "" if case.layout == "contiguous" else f", {case.layout}"
    return (f"batch {tuple(case.batch)}, N_q={case.n_q}, N_k={case.n_k}, d={case.d}, "
            f"{str(case.dtype).removeprefix('torch.')}, {mask}{layout}")


def _named_crash(part, attn, case, device):
    """``part`` on ``case``; an error that is not a judged mismatch (a crash: a shape error,
    a dtype error) is named with the case's shape, which the crash itself does not say."""
    try:
        part(attn, case, device)
    except AssertionError:
        raise  # the oracle's messages name the case already
    except Exception as exc:  # noqa: BLE001
        _named_at(f"{_shape_of(case)} ({'forward' if part is forward_matches_float64_reference else 'backward'})", exc)


# Precision is not what an extra changes: float32 results within the TF32 oracle pass here
# as in the contract (tl.dot's default on NVIDIA GPUs), so a TF32 kernel's extras report
# their own subjects.  ``float32_inputs_keep_float32_accuracy`` alone holds float32 inputs to
# float32 arithmetic (``tf32=False``).

def _forward(attn, case, device, tf32=True):
    with tf32_dots_accepted() if tf32 else contextlib.nullcontext():
        _named_crash(forward_matches_float64_reference, attn, case, device)


def _gradients(attn, case, device, tf32=True):
    with tf32_dots_accepted() if tf32 else contextlib.nullcontext():
        _named_crash(gradients_match_float64_reference, attn, case, device)



# Each extra below changes one thing from the contract's inputs (3-D, contiguous, N_q = N_k
# a power of 2, d a power of 2, the default scale), so its row names what a target lacks: a target
# whose tiles need N to be a multiple of 16 fails "odd sequence lengths" alone, not also
# "four dim inputs" and "head dims".  Causal masking is contract for the Triton flavour only,
# so ``masks`` is (False, True) there and (False,) for the PyTorch flavour (``_unmasked``),
# whose masking has rows of its own: a PyTorch flavour that ignores is_causal, as the
# handout allows, fails those and nothing else.

BOTH_MASKS = (False, True)


def four_dim_inputs(attn, device, masks=BOTH_MASKS):
    for causal in masks:
        case = _case(batch=(2, 3), n_q=64, n_k=64, d=32, causal=causal, seed=5)
        _forward(attn, case, device)
        _gradients(attn, case, device)


def unequal_query_and_key_lengths(attn, device, masks=BOTH_MASKS):
    """N_q != N_k (powers of 2), causal top-left aligned: query i sees keys 0..i on absolute indices."""
    for n_q, n_k in ((64, 128), (128, 64), (64, 256), (256, 64)):  # multiples of any tile up to 64
        for causal in masks:
            case = _case(batch=(2,), n_q=n_q, n_k=n_k, d=32, causal=causal, seed=n_q * 1000 + n_k)
            _forward(attn, case, device)
            _gradients(attn, case, device)


def odd_sequence_lengths(attn, device, masks=BOTH_MASKS):
    """Lengths that no tile divides, equal and unequal, down to one query or one key."""
    for n_q, n_k in ((17, 17), (100, 100), (1, 1), (17, 100), (100, 17), (1, 65), (65, 1)):
        for causal in masks:
            case = _case(batch=(2,), n_q=n_q, n_k=n_k, d=32, causal=causal, seed=n_q * 1000 + n_k + 7)
            _forward(attn, case, device)
            _gradients(attn, case, device)


def standard_head_dims(attn, device, masks=BOTH_MASKS):
    for d in (16, 32, 64, 128):
        _forward(attn, _case(batch=(1,), n_q=64, n_k=64, d=d, causal=masks[-1], seed=d), device)


def odd_head_dims(attn, device, masks=BOTH_MASKS):
    for d in (24, 80, 96, 200, 256):  # 256: the documented maximum
        case = _case(batch=(1,), n_q=64, n_k=64, d=d, causal=bool(d % 3) and masks[-1], seed=d)
        _forward(attn, case, device)
        _gradients(attn, case, device)


def noncontiguous_inputs(attn, device, masks=BOTH_MASKS):
    """3-D inputs stored (N, B, d) and seen as (B, N, d), and rows padded to twice d."""
    for layout in ("transposed", "strided"):
        case = _case(batch=(2,), n_q=64, n_k=64, d=32, causal=masks[-1], layout=layout, seed=7)
        _forward(attn, case, device)
        _gradients(attn, case, device)


def explicit_softmax_scale(attn, device):
    if not accepts_scale(attn):
        raise AssertionError("apply(q, k, v, is_causal, scale) is not accepted")
    case = _case(batch=(2,), n_q=64, n_k=64, d=32, causal=False, scale=0.3, seed=8)
    _forward(attn, case, device)
    _gradients(attn, case, device)


def float32_inputs_keep_float32_accuracy(attn, device, masks=BOTH_MASKS):
    """The contract's shapes in float32, judged against float32 arithmetic alone: the
    contract cases also accept dots in TF32 (10-bit mantissa), tl.dot's default for float32
    on NVIDIA GPUs; this row names a kernel that uses them."""
    for causal in masks:
        case = _case(causal=causal, seed=11 + causal)
        try:
            _forward(attn, case, device, tf32=False)
            _gradients(attn, case, device, tf32=False)
        except AssertionError as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            try:
                _forward(attn, case, device)
                _gradients(attn, case, device)
            except AssertionError:
                raise exc from None
            raise AssertionError(
                f"{first}; within the TF32 oracle: the dots round float32 inputs to TF32 (10-bit mantissa, "
                f"tl.dot's default input_precision for float32 on NVIDIA GPUs); input_precision='ieee' keeps "
                f"float32 accuracy") from exc


def _names_the_problem(msg: str, words, values) -> bool:
    """A message names the problem if it names the quantity (one of ``words``) or quotes the
    offending values (every one of ``values`` as a number): "k and v must have the same
    shape" and "got lengths 8 and 9" both do; "invalid input" does not."""
    msg = msg.lower()
    if any(word in msg for word in words):
        return True
    return bool(values) and all(re.search(rf"(?<![\d.]){v}(?![\d.])", msg) for v in values)


def _expect_error(what, exc_types, words, fn, values=()):
    try:
        fn()
    except exc_types as exc:
        if not _names_the_problem(str(exc), words, values):
            quoted = f" nor quotes {list(values)}" if values else ""
            raise AssertionError(f"{what}: raised {type(exc).__name__}({exc!s}) but the message names none of {list(words)}{quoted}")
        return
    except Exception as exc:  # noqa: BLE001 - a crash deep in a kernel is the failure we report
        raise AssertionError(f"{what}: expected {exc_types}, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"{what}: no error raised")


SHAPE_WORDS = ("shape", "size")


def bad_input_errors(attn, device):
    """Bad input raises ValueError/TypeError naming the problem, before any kernel runs."""
    t = lambda *shape, dtype=_dtype(): torch.randn(*shape, dtype=dtype, device=device)  # noqa: E731
    cases = [
        ("mismatched head dims", lambda: attn.apply(t(2, 8, 16), t(2, 8, 32), t(2, 8, 32)), ("head dim", "dim") + SHAPE_WORDS, (16, 32)),
        ("mismatched batch dims", lambda: attn.apply(t(2, 8, 16), t(3, 8, 16), t(3, 8, 16)), ("batch",) + SHAPE_WORDS, (2, 3)),
        ("K/V length mismatch", lambda: attn.apply(t(2, 8, 16), t(2, 8, 16), t(2, 9, 16)), ("length", "k/v", "seq") + SHAPE_WORDS, (8, 9)),
        ("unsupported dtype int32", lambda: attn.apply(*(torch.ones(2, 8, 16, dtype=torch.int32, device=device),) * 3), ("dtype", "int32", "float"), ()),
        ("unsupported head dim 512", lambda: attn.apply(t(1, 4, 512), t(1, 4, 512), t(1, 4, 512)), ("head dim", "head size"), (512,)),
        ("mixed dtypes", lambda: attn.apply(t(2, 8, 16), t(2, 8, 16, dtype=torch.float16), t(2, 8, 16)), ("dtype", "float16", "half"), ()),
        ("mismatched value head dim", lambda: attn.apply(t(2, 8, 16), t(2, 8, 16), t(2, 8, 32)), ("head dim", "dim") + SHAPE_WORDS, (16, 32)),
    ]
    if accepts_scale(attn):
        for bad in (0.0, -0.5, float("nan"), float("inf")):
            cases.append((f"softmax scale {bad}", lambda bad=bad: attn.apply(t(2, 8, 16), t(2, 8, 16), t(2, 8, 16), False, bad),
                          ("scale",), ()))
    for what, fn, words, values in cases:
        _expect_error(what, (ValueError, TypeError), words, fn, values)


def different_devices_error(attn, device):
    if not torch.cuda.is_available():
        raise NeedsHardware("needs a GPU: tensors on two devices")
    q = torch.randn(2, 8, 16, device="cuda", dtype=_dtype())
    k = torch.randn(2, 8, 16, dtype=_dtype())
    _expect_error("tensors on different devices", (ValueError, TypeError), ("device", "cuda", "cpu"), lambda: attn.apply(q, k, k.clone()))


def cpu_tensor_to_triton_without_interpreter(target_spec: str):
    """A CPU tensor handed to the Triton path without TRITON_INTERPRET is a clear ValueError."""
    code = textwrap.dedent(
        f"""
        import torch
        from conformance.target import load_target
        fn = load_target({target_spec!r}).attention("triton")
        q = torch.randn(1, 16, 16)
        try:
            fn.apply(q, q, q, False)
        except ValueError as exc:
            print("VALUEERROR", exc)
        except Exception as exc:
            print("OTHER", type(exc).__name__, exc)
        else:
            print("NOERROR")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    last = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
    if not last.startswith("VALUEERROR") or "interpret" not in last.lower() and "cuda" not in last.lower():
        raise AssertionError(f"CPU tensor to the Triton path without the interpreter: {last}")


def other_numbers_of_leading_dims(attn, device, masks=BOTH_MASKS):
    """(N, d) and (B, H, G, N, d) inputs: the contract allows any number of leading dims."""
    for batch in ((), (2, 2, 2)):
        case = _case(batch=batch, n_q=64, n_k=64, d=32, causal=masks[-1], seed=9)
        _forward(attn, case, device)
        _gradients(attn, case, device)


# Twelve shapes of the contract's kind (N a power of two from 16, d 16..64, no masking):
# more than torch.compile's default recompile limit (8 a code object).
MANY_SHAPES = tuple((n, d) for d in (16, 32, 64) for n in (16, 32, 64, 128))


def many_shapes_in_one_process(attn, device):
    """Twelve shapes one after another in one process, each forward and backward matching
    the reference: a training run (evaluation at other lengths) or the handout's benchmark
    sweep meets many shapes.  A per-shape cache with a limit fails here, as torch.compile
    with ``dynamic=False`` and ``fullgraph=True`` does past its recompile limit."""
    fresh_compile_caches()  # the verdict does not depend on what ran before in this process
    for i, (n, d) in enumerate(MANY_SHAPES):
        case = _case(batch=(2,), n_q=n, n_k=n, d=d, causal=False, seed=100 + i)
        try:
            _forward(attn, case, device)
            _gradients(attn, case, device)
        except Exception as exc:  # noqa: BLE001 - which shape, and after how many, is the verdict
            if classify(exc) is not None:  # not offered (an unwritten backward), needs a GPU: as is
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            hint = ""
            if "recompile" in f"{type(exc).__name__} {exc}".lower():
                hint = (" (torch.compile recompiles for every new shape when dynamic=False and stops at "
                        "torch._dynamo.config.recompile_limit; let it compile dynamic shapes)")
            raise AssertionError(f"shape {i + 1} of {len(MANY_SHAPES)} in one process (N={n}, d={d}), after "
                                 f"{i} others passed: {type(exc).__name__}: {first}{hint}") from exc


# The extras that draw causal masking (their ``masks`` parameter).
_MASKED_EXTRAS = (four_dim_inputs, other_numbers_of_leading_dims, unequal_query_and_key_lengths, odd_sequence_lengths,
                  standard_head_dims, odd_head_dims, noncontiguous_inputs)


def _unmasked(check):
    """``check`` with causal masking held off, under its own name (the report's row)."""
    def unmasked(attn, device):
        check(attn, device, masks=(False,))

    unmasked.__name__ = unmasked.__qualname__ = check.__name__
    unmasked.__doc__ = f"{check.__doc__ or check.__name__} Not causal (PyTorch flavour)."
    return unmasked


def causal_masking_in_every_extra_shape(attn, device):
    """The PyTorch flavour's masking over the extras' shapes: four and other numbers of dims,
    N_q != N_k, odd lengths, head dims, non-contiguous inputs (the Triton flavour's extras
    draw these causal already).  Only the shapes the target handles without masking: one
    it fails without masking is its own row's failure, not this one's."""
    checked = 0
    for check in _MASKED_EXTRAS:
        try:
            check(attn, device, masks=(False,))
        except Exception:  # noqa: BLE001 - the shape itself fails; its own row reports it
            continue
        try:
            check(attn, device, masks=(True,))
        except Exception as exc:  # noqa: BLE001 - which shape is the verdict
            _named_at(f"causal, as in {check.__name__.replace('_', ' ')}", exc)
        checked += 1
    if not checked:
        raise Verdict("not run here: every extra shape fails without masking (their own rows say why), "
                      "so masking over them was not checked")


_API_BOTH = (four_dim_inputs, many_shapes_in_one_process, other_numbers_of_leading_dims, unequal_query_and_key_lengths,
             odd_sequence_lengths, standard_head_dims, odd_head_dims, noncontiguous_inputs,
             explicit_softmax_scale, bad_input_errors, different_devices_error, float32_inputs_keep_float32_accuracy)
API = {
    "pytorch": (is_causal_defaults_to_false, cs336_causal_forward_backward, causal_masking_in_every_extra_shape)
               + tuple(_unmasked(c) if c in _MASKED_EXTRAS + (float32_inputs_keep_float32_accuracy,) else c
                       for c in _API_BOTH),
    "triton": _API_BOTH,
}


def inputs_beyond_the_domain_are_refused_by_name_or_right(attn, device):
    """Inputs beyond the Gluon flavour's domain (d 64 and 128, 16-bit): a head dim of 96 and
    float32 inputs get either an error naming the head dim or the dtype, raised before any
    kernel runs, or the right answer (a wider implementation is not wrong)."""
    for what, case, words, values in (
            ("head dim 96", _case(batch=(1,), n_q=64, n_k=64, d=96, dtype=torch.bfloat16, seed=96), ("head dim", "head size"), (96,)),
            ("float32 inputs", _case(batch=(1,), n_q=64, n_k=64, d=64, dtype=torch.float32, seed=32), ("dtype", "float32"), ())):
        (q, k, v, _), _ = case.make(device)
        try:
            attn.apply(q, k, v, False)
        except (ValueError, TypeError) as exc:
            if not _names_the_problem(str(exc), words, values):
                raise AssertionError(f"{what}: raised {type(exc).__name__}({exc!s}) but the message names none of {list(words)}")
            continue
        except Exception as exc:  # noqa: BLE001 - a crash deep in a kernel is the failure we report
            raise AssertionError(f"{what}: expected a ValueError/TypeError naming it or the right answer, "
                                 f"got {type(exc).__name__}: {exc}") from exc
        _forward(attn, case, device)  # accepted: then it must be right


# The Gluon flavour: the Triton flavour's tiers over its own domain; the head-dim and float32
# rows are replaced by the row that says those inputs are refused by name.
CS336["gluon"] = tuple(_within(GLUON_DOMAIN, c) for c in CS336["triton"])
API["gluon"] = tuple(_within(GLUON_DOMAIN, c) for c in _API_BOTH
                     if c not in (standard_head_dims, odd_head_dims, float32_inputs_keep_float32_accuracy)) + (
    inputs_beyond_the_domain_are_refused_by_name_or_right,)

# By name, each check as the Triton flavour runs it (masks included): what a kept mutant's
# rejection runs, whichever flavour it breaks.
SPEC_CHECKS = {f.__name__: f for tier in (CS336, API) for checks in (tier["pytorch"], tier["triton"]) for f in checks}
