"""The checks of the checkpointing laws: ``(target_spec, case) -> None``, AssertionError if broken.

Every check builds fresh blocks from the case's seed, runs the stack once without
checkpointing (the suite's own loop, ``probe.plain_forward``) and once through the target's
``get_checkpointed_blocks(blocks, strategy, segment_size)``, with the same RNG seed before
each forward, under ``torch.use_deterministic_algorithms(True)`` in fp32 on the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import re

import torch

from conformance.laws.checkpointing import probe, reference
from conformance.laws.checkpointing.strategies import BadRequest, StackCase
from conformance.target import load_target

ENTRY = "get_checkpointed_blocks"
# Bytes above the bound that a correct implementation may show at its peak (the slack is
# SCALAR_BYTES + a): the scalar loss and its gradient seed (one element each, at most 8
# bytes in fp64) -- the tracker sees them as activations --, and one block output (a) held
# a moment longer than the model counts: the input of a block while it makes its output (a
# plain loop's variable, a recomputation's), or the stack's output while the loss is formed.
# Derived for ``probe.Block``, whose every intermediate is saved by the op after it, so no
# other tensor is alive only for a moment.  Measured (N 1..24, every strategy; the bound
# for nested admits reentrant recomputation): torch's checkpoint with its defaults at most
# a above the bound (checkpoint_sequential's plain last segment), an autograd.Function
# design a + 8 B, impl a + 8 B.
SCALAR_BYTES = 16


def build(subject: str, blocks, case: StackCase):
    return load_target(subject).call(ENTRY, blocks, case.strategy, case.k)


@contextlib.contextmanager
def deterministic():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def _input(case: StackCase, requires_grad: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(case.seed + 1)
    return torch.randn(case.rows, case.d, generator=g).requires_grad_(requires_grad)


def _grads(blocks, x):
    named = {f"blocks.{i}.{n}": p.grad for i, b in enumerate(blocks) for n, p in b.named_parameters()}
    named["input"] = x.grad
    return named


def _run_both(subject: str, case: StackCase, kind=probe.Block):
    """(reference loss, output, grads), (target loss, output, grads), model, blocks."""
    blocks = probe.make_blocks(case.n, case.d, case.h, case.p, case.seed, kind)
    with deterministic():
        x = _input(case, case.input_requires_grad)
        torch.manual_seed(case.seed)
        out = probe.plain_forward(blocks, x)
        loss = probe.first(out).square().sum()
        loss.backward()
        want = (loss.detach(), out, _grads(blocks, x))
        for b in blocks:
            b.zero_grad(set_to_none=True)
        model = build(subject, blocks, case)
        x = _input(case, case.input_requires_grad)
        torch.manual_seed(case.seed)
        out = model(x)
        loss = probe.first(out).square().sum()
        assert loss.requires_grad, (f"the output does not require grad (input requires grad: {x.requires_grad}): "
                                    "no parameter can get a gradient")
        loss.backward()
        got = (loss.detach(), out, _grads(blocks, x))
    return want, got, model, blocks


def _same_parameters(model, blocks) -> None:
    ours = {id(p) for b in blocks for p in b.parameters()}
    theirs = {id(p) for p in model.parameters()}
    assert theirs == ours, (f"the checkpointed module's parameters are not the blocks' own: {len(theirs & ours)} of "
                            f"{len(ours)} shared, {len(theirs - ours)} others (copies?)")


def _equal_grads(want, got) -> None:
    for name, g in want.items():
        h = got.get(name)
        if g is None:
            assert h is None, f"{name}: a gradient where the plain stack has none"
            continue
        assert h is not None, f"{name}: no gradient (the plain stack has one)"
        assert torch.equal(g, h), f"{name}: gradient differs from the plain stack by {(g - h).abs().max().item():.3g}"


def check_gradients(subject: str, case: StackCase) -> None:
    """Loss and every gradient (parameters and input) equal the plain stack's bit for bit.

    Source: torch's ``checkpoint`` contract (the same results as without it; with
    ``preserve_rng_state`` dropout redraws the same masks), held bit for bit where the
    kernels are deterministic; the parameters are the blocks' own (the protocol's)."""
    want, got, model, blocks = _run_both(subject, case)
    _same_parameters(model, blocks)
    assert torch.equal(want[0], got[0]), f"loss {got[0].item()!r} != {want[0].item()!r} without checkpointing"
    _equal_grads(want[2], got[2])


def check_input_without_grad(subject: str, case: StackCase) -> None:
    """An input that does not require grad still gives every parameter its gradient, and is
    still checkpointed: the peak and the forwards stay within the strategy's bounds (a
    region skipped because its input needs no gradient keeps all its activations)."""
    case = StackCase(**{**case.__dict__, "input_requires_grad": False})
    want, got, model, blocks = _run_both(subject, case)
    missing = [n for n, g in got[2].items() if n != "input" and g is None]
    assert not missing, f"{len(missing)} parameters got no gradient when the input does not require grad: {missing[:3]}"
    _equal_grads(want[2], got[2])
    try:
        check_peak(subject, case)
        check_forwards(subject, case)
    except AssertionError as exc:
        raise AssertionError(f"with an input that does not require grad: {exc}") from exc


def check_buffers_and_tuples(subject: str, case: StackCase) -> None:
    """Blocks with a buffer that return (tensor, dict): the buffers are the blocks' own, the
    last block's whole output comes back, and the gradients equal the plain stack's."""
    want, got, model, blocks = _run_both(subject, case, kind=probe.ScaledBlock)
    ours = {id(t) for b in blocks for t in b.buffers()}
    assert {id(t) for t in model.buffers()} == ours, "the checkpointed module's buffers are not the blocks' own"
    assert isinstance(got[1], tuple) and len(got[1]) == 2, f"the last block returns (tensor, dict); got {type(got[1])}"
    assert got[1][1] == want[1][1], f"non-tensor output {got[1][1]!r} != {want[1][1]!r}"
    assert torch.equal(got[1][0], want[1][0]), "output differs from the plain stack"
    _equal_grads(want[2], got[2])


@functools.lru_cache(maxsize=256)
def _observe(subject: str, case: StackCase):
    """(peak, forwards, loss) of one forward + backward; kept per (target, case), so that the
    bound and the exact figure of one case cost one run."""
    blocks = probe.make_blocks(case.n, case.d, case.h, case.p, case.seed)
    model = build(subject, blocks, case)
    x = _input(case, case.input_requires_grad)
    return probe.observe(model, blocks, x, case.seed)


def _what(case: StackCase, a: int, b: int) -> str:
    return f"{case.strategy} N={case.n} k={case.k} with a={a} B per block output, b={b} B saved per block"


def check_peak(subject: str, case: StackCase) -> None:
    """The peak of activation bytes is at most what the strategy asked for may cost
    (``reference.bound``) + SCALAR_BYTES + a.

    No handout or torch contract fixes a peak: what a strategy promises is a bound on
    memory from above.  A target that checkpoints less than asked (or not at all) holds
    more and fails; one that holds less (early stop, checkpointing more than asked) passes
    here, and the extra ``check_exact_peak`` tells it apart from the reference plan."""
    a, b = probe.block_bytes(case.rows, case.d, case.h)
    peak, _, _ = _observe(subject, case)
    most = reference.bound(case.n, case.strategy, case.k, a, b).peak
    slack = SCALAR_BYTES + a
    assert peak <= most + slack, (f"activation peak {peak} B, above the {most} B (+ up to {slack} B) that "
                                  f"{_what(case, a, b)} may hold: more memory than the strategy keeps")


def check_forwards(subject: str, case: StackCase) -> None:
    """Block forwards in one forward + backward (forward pre-hooks) are at most the
    strategy's (``reference.bound``): no region recomputed twice, nothing checkpointed
    beyond what was asked (every block for "segments k" recomputes as much, but a nested
    level more would show).  No handout or torch contract fixes the count: torch's early
    stop and an unchecked last segment run fewer, and pass."""
    a, b = probe.block_bytes(case.rows, case.d, case.h)
    _, forwards, _ = _observe(subject, case)
    most = reference.bound(case.n, case.strategy, case.k, a, b).forwards
    assert forwards <= most, (f"{forwards} block forwards, more than the {most} that {case.strategy} "
                              f"N={case.n} k={case.k} recomputes at most")


def check_exact_peak(subject: str, case: StackCase) -> None:
    """Extra: the peak equals the reference plan's (impl's, ``reference.costs``), to within
    SCALAR_BYTES + a above it.  The figure is this suite's own; a target that holds less
    (torch's early stop) or more (reentrant nesting) is told so, and still conforms."""
    a, b = probe.block_bytes(case.rows, case.d, case.h)
    peak, _, _ = _observe(subject, case)
    allowed = reference.costs(case.n, case.strategy, case.k, a, b)
    slack = SCALAR_BYTES + a
    if any(c.peak <= peak <= c.peak + slack for c in allowed):
        return
    want = " or ".join(str(c.peak) for c in allowed)
    side = "less" if peak < min(c.peak for c in allowed) else "more"
    raise AssertionError(f"activation peak {peak} B: holds {side} than the reference plan's {want} B (+ up to "
                         f"{slack} B) for {_what(case, a, b)}")


def check_exact_forwards(subject: str, case: StackCase) -> None:
    """Extra: the block forwards equal the reference plan's (impl: every region recomputed to
    its end).  The count is this suite's own; torch's early stop does less, and conforms."""
    a, b = probe.block_bytes(case.rows, case.d, case.h)
    _, forwards, _ = _observe(subject, case)
    want = {c.forwards for c in reference.costs(case.n, case.strategy, case.k, a, b)}
    if forwards in want:
        return
    side = "less" if forwards < min(want) else "more"
    raise AssertionError(f"{forwards} block forwards: does {side} recomputation than the reference plan's "
                         f"{sorted(want)} for {case.strategy} N={case.n} k={case.k}")


# The best single level at perfect squares, where k = sqrt(N) exactly and an off-by-one in
# the integer square root shows: fixed cases (a law draws N = 4, 9 or 16 with sqrt rarely).
SQRT_AT_SQUARES = tuple(StackCase(n, "sqrt", None, rows=2, d=4, h=16, p=0.25, seed=3) for n in (4, 9, 16))


def check_sqrt_at_perfect_squares(subject: str) -> None:
    """The activation peak and the block forwards of "sqrt" at N = 4, 9 and 16 are at most
    the strategy's (k = 2, 3, 4 is the only best single level there)."""
    for case in SQRT_AT_SQUARES:
        check_peak(subject, case)
        check_forwards(subject, case)


def check_exact_peak_at_perfect_squares(subject: str) -> None:
    """Extra: the peak of "sqrt" at N = 4, 9 and 16 is the reference plan's (a k one too
    small holds less, and shows only here)."""
    for case in SQRT_AT_SQUARES:
        check_exact_peak(subject, case)


def check_bad_request(subject: str, req: BadRequest) -> None:
    """A bad strategy name or k outside 1..N is a ValueError/TypeError naming what is wrong,
    at construction or at the first forward.  The wording is the target's own (no source
    fixes it): the error must name the quantity -- "strategy" or the name given; "segment"
    (segment_size, segment size, segments) or k."""
    blocks = probe.make_blocks(req.n, 2, 4, 0.0, 0)
    try:
        model = load_target(subject).call(ENTRY, blocks, req.strategy, req.k)
        probe.first(model(torch.randn(1, 2))).sum().backward()
    except (ValueError, TypeError) as exc:
        text = str(exc).lower()
        if req.words == "strategy":
            names = ["strategy"] + ([repr(req.strategy).lower()] if req.strategy else [])
        else:
            names = ["segment"]
        named = any(w in text for w in names) or (req.words == "segment_size" and "k" in re.findall(r"\w+", text))
        assert named, f"the error for {req.strategy!r} k={req.k!r} with N={req.n} does not name {req.words!r}: {exc}"
        return
    raise AssertionError(f"strategy={req.strategy!r} segment_size={req.k!r} with N={req.n} blocks was accepted")
