"""The laws every FlashAttention implementation must obey, written against the target protocol.

Each law is a plain function ``law(attn, case, device)`` that raises AssertionError when
the implementation ``attn`` (an autograd.Function class with
``apply(q, k, v, is_causal[, scale])``) breaks it on ``case``.  ``LAWS`` lists them with
the cases each one draws; ``check_law`` runs one under Hypothesis.  The same laws run
against our ``impl``, any ``--target``, and every kept mutant.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import sys
from dataclasses import dataclass, replace

import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from conformance import oracle
from conformance.verdicts import NeedsHardware
from conformance.lawbook import API, CONTRACT, BudgetedLaw, Law, by_name
from conformance.laws.attention.magnitudes import attention_magnitudes, mixed_precision_forward
from conformance.laws.attention.tf32 import tf32_attention
from conformance.laws.attention.strategies import (
    AttentionCase,
    Budget,
    attention_cases,
    boundary_cases,
    budget_for,
    contract_cases,
    contract_corner_cases,
    contract_lengths,
    tiny_float64_cases,
    with_other_grad_output_layout,
)
from impl.attention.reference import attention_reference


# ---------------------------------------------------------------------------------------
# Calling a target's attention and reading back what it saved
# ---------------------------------------------------------------------------------------


def accepts_scale(attn) -> bool:
    """Whether attn.apply takes a softmax scale after is_causal (CS336's signature does not).

    Decided by the parameter's name only: student forwards often take extra optional
    arguments after is_causal (tile sizes ``B_q, B_k``), and a scale passed there would be
    read as a tile size.
    """
    forward = getattr(attn, "forward", None)  # a plain class may offer apply() alone
    if forward is None:
        return False
    try:
        params = list(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) >= 6 and params[5] in ("scale", "softmax_scale", "sm_scale")


def call(attn, q, k, v, case: AttentionCase):
    if case.scale is None:
        return attn.apply(q, k, v, case.is_causal)
    return attn.apply(q, k, v, case.is_causal, case.scale)


def saved_logsumexp(o: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The one tensor of shape q.shape[:-1] the implementation saved for backward.

    The CS336 contract's (B, N, d) inputs must save L as (B, N).  For other numbers of
    leading dims, L saved with those dims merged, (prod(leading), N), is L too: how a
    target lays out what it keeps is its own affair beyond the contract, and a row about
    four-dim inputs should not fail for it."""
    if o.grad_fn is None:
        raise AssertionError("output has no grad_fn: the implementation is not an autograd.Function over q, k, v")
    saved = [t for t in o.grad_fn.saved_tensors if tuple(t.shape) == tuple(q.shape[:-1])]
    if not saved and q.dim() != 3:
        merged = (math.prod(q.shape[:-2]), q.shape[-2])
        saved = [t.reshape(q.shape[:-1]) for t in o.grad_fn.saved_tensors if tuple(t.shape) == merged]
    if len(saved) != 1:
        shapes = [tuple(t.shape) for t in o.grad_fn.saved_tensors]
        raise AssertionError(
            f"expected exactly one saved tensor of shape {tuple(q.shape[:-1])} (the logsumexp L); saved: {shapes}"
        )
    return saved[0]


def _allocations(case: AttentionCase, device):
    """Where the case says so, uninitialised allocations are NaN-filled while the
    implementation runs (``oracle.poisoned_allocations``: a kernel that leaves output rows
    unwritten shows).  torch fills them only under its deterministic-algorithms mode, and
    an implementation may take another path there (ours drop their atomic dQ adds, as
    torch's own kernels do): the other cases run as a user runs them, so both paths are
    judged."""
    return oracle.poisoned_allocations(device) if case.poisoned else contextlib.nullcontext()


def run_forward(attn, case: AttentionCase, device, inputs=None):
    """O and L from the implementation (uninitialised memory poisoned where the case says)."""
    (q, k, v, _), _ = inputs or case.make(device)
    with _allocations(case, device):
        o = call(attn, q, k, v, case)
    return o, saved_logsumexp(o, q)


@dataclass
class References:
    ref64: dict  # float64 reference of every quantity
    eager: dict  # eager reference in the case's dtype (the forward: FlashAttention's mixed arithmetic)
    magnitudes: dict
    tf32: tuple | None = None  # (eager in TF32, magnitudes in TF32 ulps) where TF32 dots are accepted


# Set inside the contract tier: float32 results within the TF32 oracle pass too.
_TF32_ACCEPTED = contextvars.ContextVar("tf32_dots_accepted", default=False)


@contextlib.contextmanager
def tf32_dots_accepted():
    """Float32 results judged against the TF32 yardstick as well (``tf32.py``): the course's
    tests (tolerance 1e-2) accept a float32 kernel whose dots run in TF32, tl.dot's default on
    NVIDIA GPUs.  The extra ``float32_inputs_keep_float32_accuracy`` holds them to float32."""
    token = _TF32_ACCEPTED.set(True)
    try:
        yield
    finally:
        _TF32_ACCEPTED.reset(token)


def references(case: AttentionCase, device, with_grads: bool) -> References:
    (q, k, v, do), (q64, k64, v64, do64) = case.make(device)
    ref = _eager_quantities(q64, k64, v64, do64, case, with_grads)
    eager = _eager_quantities(q.detach(), k.detach(), v.detach(), do, case, with_grads)
    if case.dtype in (torch.float16, torch.bfloat16):  # the forward's yardstick: FlashAttention's own arithmetic
        eager["O"], eager["L"] = mixed_precision_forward(q.detach(), k.detach(), v.detach(), case.is_causal, case.scale)
    mags = attention_magnitudes(q64, k64, v64, do64, case.is_causal, case.softmax_scale, case.dtype)
    tf32 = None
    if case.dtype == torch.float32 and _TF32_ACCEPTED.get():
        tf32 = (_eager_quantities(q.detach(), k.detach(), v.detach(), do, case, with_grads, tf32_attention),
                attention_magnitudes(q64, k64, v64, do64, case.is_causal, case.softmax_scale, oracle.TF32))
    return References(ref, eager, mags, tf32)


def _eager_quantities(q, k, v, do, case, with_grads, attention=attention_reference):
    q, k, v = (t.detach().clone().requires_grad_(with_grads) for t in (q, k, v))
    with torch.enable_grad():
        o, lse = attention(q, k, v, case.is_causal, case.scale)
        out = {"O": o.detach(), "L": lse.detach()}
        if with_grads:
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
            out.update(dQ=dq, dK=dk, dV=dv)
    return out


def _judge(name, actual, refs: References, key: str, case: AttentionCase):
    verdict = oracle.judge(f"{name} {key}", actual, refs.ref64[key], refs.eager[key], case.dtype, refs.magnitudes[key])
    if verdict.ok:
        return
    if refs.tf32 is not None:  # the contract tier: within the TF32 oracle passes too
        eager, mags = refs.tf32
        if oracle.judge(f"{name} {key}", actual, refs.ref64[key], eager[key], oracle.TF32, mags[key]).ok:
            return
    raise AssertionError(verdict.message())


# ---------------------------------------------------------------------------------------
# The laws
# ---------------------------------------------------------------------------------------


def forward_matches_float64_reference(attn, case: AttentionCase, device):
    """O and L agree with the float64 reference within the oracle."""
    o, lse = run_forward(attn, case, device)
    refs = references(case, device, with_grads=False)
    if o.dtype != case.dtype:
        raise AssertionError(f"O has dtype {o.dtype}, expected the input dtype {case.dtype}")
    _judge("forward", o, refs, "O", case)
    _judge("forward", lse, refs, "L", case)


def gradients_match_float64_reference(attn, case: AttentionCase, device):
    """dQ, dK and dV agree with the float64 reference within the oracle."""
    (q, k, v, do), _ = inputs = case.make(device)
    with _allocations(case, device):
        o = call(attn, q, k, v, case)
        o.backward(do)
    refs = references(case, device, with_grads=True)
    for key, t in (("dQ", q), ("dK", k), ("dV", v)):
        if t.grad is None:
            raise AssertionError(f"backward produced no {key}")
        _judge("backward", t.grad, refs, key, case)
    del inputs


def permuting_keys_and_values_together_leaves_output_unchanged(attn, case: AttentionCase, device):
    """Without a causal mask attention is a function of the *set* of (key, value) pairs."""
    case = replace(case, is_causal=False)
    (q, k, v, _), _ = case.make(device)
    perm = torch.randperm(case.n_k, generator=torch.Generator().manual_seed(case.seed))
    note(f"key permutation: {perm.tolist()}")
    with _allocations(case, device):
        o_perm = call(attn, q, k[..., perm.to(k.device), :], v[..., perm.to(v.device), :], case)
    refs = references(case, device, with_grads=False)
    _judge("forward on permuted keys/values", o_perm, refs, "O", case)


def causal_output_ignores_future_keys(attn, case: AttentionCase, device):
    """Under causal masking, O[i] is bit-for-bit unchanged when keys/values after i change."""
    case = replace(case, is_causal=True)
    (q, k, v, _), _ = case.make(device)
    i = (case.seed % max(1, min(case.n_q, case.n_k) - 1)) if min(case.n_q, case.n_k) > 1 else 0
    note(f"rows 0..{i} must not see keys {i + 1}..{case.n_k - 1}")
    g = torch.Generator().manual_seed(case.seed + 1)
    k2, v2 = k.detach().clone(), v.detach().clone()
    future = slice(i + 1, None)
    k2[..., future, :] = (torch.randn(k2[..., future, :].shape, generator=g) * 10).to(k2)
    v2[..., future, :] = (torch.randn(v2[..., future, :].shape, generator=g) * 10).to(v2)
    with _allocations(case, device):
        o1 = call(attn, q, k, v, case)
        o2 = call(attn, q, k2, v2, case)
    oracle.assert_bitwise_equal(f"O[..., :{i + 1}, :] after changing keys {i + 1}..", o2[..., : i + 1, :], o1[..., : i + 1, :])


def batch_elements_are_independent(attn, case: AttentionCase, device):
    """A batch computed at once equals its elements computed one by one (within the oracle)."""
    (q, k, v, _), _ = case.make(device)
    with _allocations(case, device):
        o_all = call(attn, q, k, v, case).detach()
    refs = references(case, device, with_grads=False)
    tol = 2 * oracle.bound(refs.ref64["O"], refs.eager["O"], case.dtype, refs.magnitudes["O"])
    flat_q, flat_k, flat_v = (t.detach().reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    flat_o, flat_tol = o_all.reshape(-1, *o_all.shape[-2:]), tol.reshape(-1, *tol.shape[-2:])
    for b in range(flat_q.shape[0]):
        with _allocations(case, device):
            o_b = call(attn, flat_q[b : b + 1], flat_k[b : b + 1], flat_v[b : b + 1], case).detach()
        oracle.assert_within(f"batch element {b} alone vs in the batch", o_b[0], flat_o[b], flat_tol[b])


def constant_values_give_constant_output(attn, case: AttentionCase, device):
    """If every value row is the same vector c, every output row is c (softmax rows sum to 1)."""
    (q, k, v, _), _ = case.make(device)
    c = v.detach()[..., :1, :]
    v_const = c.expand_as(v).contiguous()
    with _allocations(case, device):
        o = call(attn, q, k, v_const, case)
    ref = c.to(torch.float64).expand(o.shape)
    eager, _ = attention_reference(q.detach(), k.detach(), v_const, case.is_causal, case.scale)
    oracle.assert_close("O with constant V", o, ref, eager, case.dtype)


def logsumexp_is_row_logsumexp_and_at_least_row_max(attn, case: AttentionCase, device):
    """L_i = log sum_j exp(S_ij) within the oracle, hence L_i >= max_j S_ij."""
    o, lse = run_forward(attn, case, device)
    refs = references(case, device, with_grads=False)
    _, (q64, k64, _, _) = case.make(device, requires_grad=False)
    from impl.attention.reference import attention_scores

    row_max = attention_scores(q64, k64, case.is_causal, case.scale).amax(dim=-1)
    slack = oracle.bound(refs.ref64["L"], refs.eager["L"], case.dtype, refs.magnitudes["L"])
    if refs.tf32 is not None:  # the contract tier: L from TF32 scores may sit that far below
        eager, mags = refs.tf32
        slack = torch.maximum(slack, oracle.bound(refs.ref64["L"], eager["L"], oracle.TF32, mags["L"]))
    below = (row_max.cpu() - lse.detach().double().cpu()) - slack
    if bool((below > 0).any()):
        idx = tuple(int(i) for i in torch.nonzero(below > 0)[0])
        raise AssertionError(f"L{idx} = {float(lse.detach()[idx]):.6g} is below the row max score {float(row_max[idx]):.6g}")
    _judge("forward", lse, refs, "L", case)


def forward_is_bitwise_deterministic(attn, case: AttentionCase, device):
    """Two calls on the same inputs give bit-identical O and L."""
    (q, k, v, _), _ = case.make(device)
    with _allocations(case, device):
        o1 = call(attn, q, k, v, case)
        l1 = saved_logsumexp(o1, q).clone()
        o2 = call(attn, q, k, v, case)
        l2 = saved_logsumexp(o2, q)
    oracle.assert_bitwise_equal("O on a repeated call", o2, o1)
    oracle.assert_bitwise_equal("L on a repeated call", l2, l1)


# The dtypes the flavour under check offers (its Budget's), set by check_law while a law runs.
_OFFERED_DTYPES: list = [None]


def _neighbours(case: AttentionCase) -> list[tuple[str, AttentionCase]]:
    """Cases that differ from ``case`` in one respect each (and in their values): what a
    cache keyed on too little, or an output buffer kept for reuse, confuses with it."""
    other_layout = {"contiguous": "strided", "strided": "transposed" if len(case.batch) > 1 else "contiguous",
                    "transposed": "mixed", "mixed": "contiguous"}.get(case.layout, "contiguous")
    seed = (case.seed + 1) % 2**31
    out = [
        ("is_causal flipped", replace(case, is_causal=not case.is_causal, seed=seed)),
        (f"layout {other_layout!r}", replace(case, layout=other_layout, seed=seed)),
        ("one key more" if case.n_k < 2 else "one key fewer", replace(case, n_k=case.n_k + 1 if case.n_k < 2 else case.n_k - 1, seed=seed)),
    ]
    # another dtype the flavour offers: float32 where it does (the Gluon flavour: the other 16-bit one)
    offered = _OFFERED_DTYPES[0] or (torch.float32,)
    other = torch.float32 if torch.float32 in offered else next((t for t in offered if t != case.dtype), case.dtype)
    if case.dtype != other:
        out.append((f"{str(other).removeprefix('torch.')} inputs", replace(case, dtype=other, seed=seed)))
    if case.scale is not None:
        out.append(("another softmax scale", replace(case, scale=case.scale * 2, seed=seed)))
    # q, k, v as in the case; only dO's layout differs (a backward plan keyed without dO's)
    out.append(("dO in another layout", replace(case, layout=with_other_grad_output_layout(case.layout), seed=seed)))
    if case.layout != "misaligned":  # same shapes and strides; an address off 16-byte alignment
        out.append(("inputs one element past a 16-byte boundary", replace(case, layout="misaligned", seed=seed)))
    if case.layout != "rows_padded":  # rows whose stride TMA cannot read: a plan that copies them must
        # launch with the copies' strides, and one that reads them in place with theirs
        out.append(("rows one element longer than the head dim", replace(case, layout="rows_padded", seed=seed)))
    return out


def results_do_not_depend_on_earlier_calls(attn, case: AttentionCase, device):
    """O and dQ, dK, dV of a call depend on its own inputs only.

    The case, then neighbours that differ from it in one respect each (the causal flag, the
    layout, the key length, the dtype, the scale, the inputs' address alignment, a row stride
    of no multiple of 16 bytes) run forward
    and backward in turn; every
    output is judged against its float64 reference after all of them have run.  A cache
    keyed on too little (a mask, a compiled kernel, a launch plan) gives a neighbour the
    case's answer; an output buffer kept and reused hands the case's O to a later call.
    """
    sequence = [("the case", case)] + [(f"a call with {what} after the case", c) for what, c in _neighbours(case)]
    outputs = []
    for what, c in sequence:
        (q, k, v, do), _ = c.make(device)
        with _allocations(c, device):
            o = call(attn, q, k, v, c)
            o.backward(do)
        outputs.append((what, c, {"O": o.detach(), "dQ": q.grad, "dK": k.grad, "dV": v.grad}))
    for what, c, got in outputs:
        note(f"{what}: {c!r}")
        refs = references(c, device, with_grads=True)
        for key, t in got.items():
            if t is None:
                raise AssertionError(f"{what}: backward produced no {key}")
            _judge(what, t, refs, key, c)


# The calls of fresh_values_at_recycled_addresses_give_fresh_results, in order: what each one changes.
RECYCLED_ADDRESS_CALLS = (
    "the case",
    "new values written into the same input tensors, the last call's outputs freed",
    "new values again, in the same tensors",
    "new values in the same tensors, the last call's outputs still held (this call's land elsewhere)",
    "new values in new input tensors, the old ones still held (at other addresses)",
)


def fresh_values_at_recycled_addresses_give_fresh_results(attn, case: AttentionCase, device):
    """A training loop's steady state: every call's O and dQ, dK, dV are its own.

    The same call runs five times (RECYCLED_ADDRESS_CALLS), each on new values: written in
    place into the same input tensors while the last call's outputs are freed, so that the
    allocator hands their memory out again; then once with the last outputs still held, so
    that this call's land elsewhere; then once in new input tensors.  Each call is judged
    against its own float64 reference.  An implementation that remembers by address what
    belongs to values fails: outputs cached by ``data_ptr``, a CUDA graph of the launches
    recorded for one set of addresses and replayed for a call whose outputs or inputs lie
    elsewhere, a buffer kept across calls.  (results_do_not_depend_on_earlier_calls holds
    every output, so no address recurs there.)
    """
    (q, k, v, do), _ = case.make(device)
    held = []
    for i, what in enumerate(RECYCLED_ADDRESS_CALLS):
        c = replace(case, seed=(case.seed + i) % 2**31)
        if i == len(RECYCLED_ADDRESS_CALLS) - 1:
            held.append((q, k, v, do))
            (q, k, v, do), _ = c.make(device)
        elif i > 0:
            q.grad = k.grad = v.grad = None
            (q_i, k_i, v_i, do_i), _ = c.make(device, requires_grad=False)
            with torch.no_grad():
                for t, new in ((q, q_i), (k, k_i), (v, v_i), (do, do_i)):
                    t.copy_(new)
            del q_i, k_i, v_i, do_i
        refs = references(c, device, with_grads=True)  # made at the same point of every call, as a loop's tensors are
        with _allocations(c, device):
            o = call(attn, q, k, v, c)
            o.backward(do)
        note(f"call {i + 1} ({what}): {c!r}")
        for key, t in (("O", o.detach()), ("dQ", q.grad), ("dK", k.grad), ("dV", v.grad)):
            if t is None:
                raise AssertionError(f"call {i + 1} ({what}): backward produced no {key}")
            _judge(f"call {i + 1} ({what})", t, refs, key, c)
        if i == 2:  # the next call runs while these outputs live
            held.append((o, q.grad, k.grad, v.grad))
        del o, refs


def float64_gradcheck(attn, case: AttentionCase, device):
    """Analytic gradients equal finite differences in float64 (torch.autograd.gradcheck)."""
    (q, k, v, _), _ = case.make(device)
    ok = torch.autograd.gradcheck(
        lambda q_, k_, v_: call(attn, q_, k_, v_, case), (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=False
    )
    if not ok:
        raise AssertionError("torch.autograd.gradcheck failed: analytic and numerical Jacobians differ")
    # gradcheck's atol hides float32 arithmetic (a float32 L gives errors ~1e-8): in float64
    # the gradients must match the float64 reference to float64 rounding (relative ~1e-14),
    # not float32's (~1e-7); 1e-10 relative to the largest reference value lies between.
    (q, k, v, do), _ = case.make(device)
    call(attn, q, k, v, case).backward(do)
    refs = references(case, device, with_grads=True)
    for key, t in (("dQ", q), ("dK", k), ("dV", v)):
        ref = refs.ref64[key].to(torch.float64).cpu()
        err = (t.grad.detach().double().cpu() - ref).abs().max().item() if t.grad is not None else float("inf")
        tol = 1e-10 * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
        if not err <= tol:
            raise AssertionError(f"float64 {key}: |err| = {err:.3e} against the float64 reference, more than {tol:.1e} "
                                 f"(float64 rounding is ~1e-14 relative: float32 arithmetic inside?)")


# ---------------------------------------------------------------------------------------
# Which cases each law draws, and running a law under Hypothesis
# ---------------------------------------------------------------------------------------


def _any(budget, custom):
    return attention_cases(budget, allow_custom_scale=custom)


def _short(budget):
    """At most 256 rows and 4 batch elements: a law that runs six calls an example (a cache
    keyed on too little shows at any length; tile boundaries up to 128 are inside)."""
    return replace(budget, max_len=min(budget.max_len, 256), max_batch_elems=min(budget.max_batch_elems, 4))


def _law(check, cases=_any, flavours=()):
    # Random shapes, scales and layouts beyond the handout's fixed ones: the wider API tier.
    return Law(check.__name__, "attention", API, cases, check, flavours=flavours, extra="random shapes, scales and layouts")


LAWS = (
    _law(forward_matches_float64_reference),
    _law(gradients_match_float64_reference),
    _law(permuting_keys_and_values_together_leaves_output_unchanged, lambda b, c: attention_cases(b, causal=False, allow_custom_scale=c)),
    _law(causal_output_ignores_future_keys, lambda b, c: attention_cases(b, causal=True, allow_custom_scale=c)),
    _law(batch_elements_are_independent, lambda b, c: attention_cases(b, allow_custom_scale=c, min_batch_elems=2)),
    _law(constant_values_give_constant_output),
    _law(logsumexp_is_row_logsumexp_and_at_least_row_max),
    _law(forward_is_bitwise_deterministic),
    _law(results_do_not_depend_on_earlier_calls, lambda b, c: attention_cases(_short(b), allow_custom_scale=c)),
    _law(fresh_values_at_recycled_addresses_give_fresh_results,
         lambda b, c: attention_cases(_short(b), allow_custom_scale=c)),
    _law(float64_gradcheck, lambda b, c: tiny_float64_cases(), flavours=("pytorch",)),
)



def bf16_runs_and_keeps_the_contracts_dtypes(attn, case: AttentionCase, device):
    """bf16 inputs: forward and backward run, O and dQ/dK/dV are bf16, L has q.shape[:-1].

    Values are not judged here (the other contract laws do, wherever bf16 arithmetic can
    run); this runs everywhere, the Triton interpreter included, whose bf16 tl.dot values
    are garbage but whose type checks are Triton's own: mixed-type tl.dot, a bf16 store of
    a float32 block, an output left in float32 all fail here on a CPU machine."""
    case = replace(case, dtype=torch.bfloat16)
    (q, k, v, do), _ = case.make(device)
    o = call(attn, q, k, v, case)
    if o.dtype != torch.bfloat16:
        raise AssertionError(f"O has dtype {o.dtype} for bf16 inputs, expected torch.bfloat16")
    saved_logsumexp(o, q)
    o.backward(do)
    for key, t in (("dQ", q), ("dK", k), ("dV", v)):
        if t.grad is None or t.grad.dtype != torch.bfloat16 or t.grad.shape != t.shape:
            got = None if t.grad is None else (t.grad.dtype, tuple(t.grad.shape))
            raise AssertionError(f"{key} for bf16 inputs: got {got}, expected bf16 of shape {tuple(t.shape)}")


LONG_SEQUENCES = "sequences in the thousands"  # a law's need: seconds an example, none under the interpreter


def _accepting_tf32(check):
    def run(attn, case, device):
        with tf32_dots_accepted():
            return check(attn, case, device)

    run.__name__, run.__doc__ = check.__name__, check.__doc__
    return run


# What fixes each contract law (the handout's FlashAttention-2 section and the course's tests):
# the forward, gradient and logsumexp laws compare O, dQ/dK/dV and the saved L with the
# reference over the handout's shape family (strategies.contract_cases: (B, N, d), N a power
# of two from 16, d 16..128, fp32 and bf16), as the course tests do at one shape, judged by
# the float64 oracle; causal_output_ignores_future_keys is the handout's causal mask (part
# (c), the Triton flavour) -- keys after i have weight exactly 0 in any implementation that
# masks them, so O[:i+1] is bit-identical when they change; the long bf16 law runs the
# lengths the handout's benchmark sweeps in bf16; bf16_runs_and_keeps_the_contracts_dtypes
# asks bf16 inputs to run and give O and the gradients in bf16, as the benchmark and the
# attention the kernel replaces (torch's scaled_dot_product_attention) do.  None of them
# pins a tile size, a launch or recomputation count, memory, or which tensors besides L are
# saved.
_CONTRACT_FAMILIES: dict = {}  # a contract law's name -> its (long, causal), which its corner case follows


def _contract(name, check, long=False, causal=None, flavours=()):
    # Only the course's shapes, dtypes and flags (strategies.contract_cases), the family's corner
    # first (strategies.contract_corner_cases); no case from outside the family.
    # Float32 dots in TF32 pass, as the course's tests let them (tf32_dots_accepted).
    _CONTRACT_FAMILIES[name] = (long, causal)
    return Law(name, "attention", CONTRACT, lambda b, c, fl: contract_cases(b, fl, long=long, causal=causal),
               _accepting_tf32(check), flavours=flavours, needs=(LONG_SEQUENCES,) if long else ())


CONTRACT_LAWS = (
    _contract("contract_forward_matches_float64_reference", forward_matches_float64_reference),
    _contract("contract_gradients_match_float64_reference", gradients_match_float64_reference),
    _contract("contract_logsumexp_is_row_logsumexp", logsumexp_is_row_logsumexp_and_at_least_row_max),
    _contract("contract_causal_output_ignores_future_keys", causal_output_ignores_future_keys, causal=True, flavours=("triton", "gluon")),
    _contract("contract_long_sequences_in_bf16_match_float64_reference", forward_matches_float64_reference, long=True),
    _contract("contract_bf16_runs_and_keeps_the_contracts_dtypes", bf16_runs_and_keeps_the_contracts_dtypes),
)
LAWS_BY_NAME = by_name(LAWS + CONTRACT_LAWS)


LONG_EXAMPLES = 3


def fresh_compile_caches() -> None:
    """Each example starts with torch.compile's caches empty.  A target that compiles its
    tiles with ``dynamic=False`` recompiles for every new shape and, with ``fullgraph=True``,
    raises once a code object passes ``torch._dynamo.config.recompile_limit``: in one process
    that runs many examples, any law would then fail on whatever example came ninth (and
    shrink to the smallest case, blaming it).  The laws judge each case on its own; the spec
    case ``many_shapes_in_one_process`` judges the limit."""
    dynamo = sys.modules.get("torch._dynamo")  # nobody compiled: nothing to reset, no import
    if dynamo is not None:
        dynamo.reset()


def check_law(law: Law, attn, device, flavour: str, **settings_overrides) -> None:
    """Run one law under Hypothesis against ``attn``; raises the shrunk counterexample.

    A contract law draws contract cases only, its family's corner first (the longest length,
    causal for a kernel: ``contract_corner_cases``); a wider law tries the boundary cases first
    (causal, one row past a tile multiple) in every profile."""
    budget = budget_for(flavour, torch.device(device))
    if law.tier == CONTRACT:
        long = LONG_SEQUENCES in law.needs
        if not contract_lengths(budget, flavour, long):
            raise NeedsHardware("needs a GPU: sequences in the thousands are too slow for the Triton interpreter")
        strategy = law.cases(budget, False, flavour)
        if long:  # seconds an example (float64 references, the mutants' Python tiles): a few suffice
            settings_overrides["max_examples"] = min(settings_overrides.get("max_examples", LONG_EXAMPLES), LONG_EXAMPLES)
    else:
        strategy = law.cases(budget, accepts_scale(attn))
    if law.tier == CONTRACT:
        long, causal = _CONTRACT_FAMILIES[law.name]
        fixed = contract_corner_cases(budget, flavour, long=long, causal=causal)
    else:
        fixed = boundary_cases(budget, flavour) if law.name != "float64_gradcheck" else []
    law = BudgetedLaw(law, fixed=len(fixed), label=f"{law.name}[{flavour}]")  # the test below keeps its source

    @settings(**settings_overrides)
    @given(case=strategy)
    def run(case):
        note(repr(case))
        fresh_compile_caches()
        law.check(attn, case, device)

    # Tried first, in every profile, in their list's order (cheapest first: a budget that runs out
    # cuts the dearest).  Hypothesis runs the example added last first, hence the reversal.
    for case in reversed(fixed):
        run = example(case=case)(run)

    run.__qualname__ = run.__name__ = f"{law.name}[{flavour}]"
    _OFFERED_DTYPES[0] = budget.dtypes
    try:
        law.run(run)
    finally:
        _OFFERED_DTYPES[0] = None
