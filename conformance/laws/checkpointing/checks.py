"""The checks of the checkpointing laws: ``(target_spec, case) -> None``, AssertionError if broken.

Every check builds fresh blocks from the case's seed, runs the stack once without
checkpointing (the suite's own loop, ``probe.plain_forward``) and once through the target's
``get_checkpointed_blocks(blocks, strategy, segment_size)``, with the same RNG seed before
each forward, under ``torch.use_deterministic_algorithms(True)`` in fp32 on the CPU.
"""

from __future__ import annotations

import contextlib

import torch

from conformance.laws.checkpointing import probe, reference
from conformance.laws.checkpointing.strategies import BadRequest, StackCase
from conformance.target import load_target

ENTRY = "get_checkpointed_blocks"
# Bytes besides the prediction an exact implementation may show at its peak: the scalar
# loss and its gradient seed (one element each, at most 8 bytes in fp64) -- the tracker
# sees them as activations --, and one block output (a) that an implementation may hold a
# moment longer than the model counts (the stack's output while the loss is formed, or the
# last recomputed block's output).  Derived for ``probe.Block``, whose every intermediate
# is saved by the op after it, so no other tensor is alive only for a moment.
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
    """Loss and every gradient (parameters and input) equal the plain stack's bit for bit."""
    want, got, model, blocks = _run_both(subject, case)
    _same_parameters(model, blocks)
    assert torch.equal(want[0], got[0]), f"loss {got[0].item()!r} != {want[0].item()!r} without checkpointing"
    _equal_grads(want[2], got[2])


def check_input_without_grad(subject: str, case: StackCase) -> None:
    """An input that does not require grad still gives every parameter its gradient, and is
    still checkpointed: the block forwards equal the prediction (a region skipped because
    its input needs no gradient runs once, not twice)."""
    case = StackCase(**{**case.__dict__, "input_requires_grad": False})
    want, got, model, blocks = _run_both(subject, case)
    missing = [n for n, g in got[2].items() if n != "input" and g is None]
    assert not missing, f"{len(missing)} parameters got no gradient when the input does not require grad: {missing[:3]}"
    _equal_grads(want[2], got[2])
    try:
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


def _observe(subject: str, case: StackCase):
    blocks = probe.make_blocks(case.n, case.d, case.h, case.p, case.seed)
    model = build(subject, blocks, case)
    x = _input(case, case.input_requires_grad)
    return probe.observe(model, blocks, x, case.seed)


def check_peak(subject: str, case: StackCase) -> None:
    """The peak of activation bytes equals the suite's prediction, to within SCALAR_BYTES + a.

    An equality, not a bound: a target that checkpoints more than the strategy asks (every
    block for "segments k", say) has a lower peak and the same forwards (2N), and it is not
    the strategy asked for; only the lower side of the law tells."""
    a, b = probe.block_bytes(case.rows, case.d, case.h)
    peak, _, _ = _observe(subject, case)
    allowed = reference.costs(case.n, case.strategy, case.k, a, b)
    slack = SCALAR_BYTES + a
    ok = any(c.peak <= peak <= c.peak + slack for c in allowed)
    want = " or ".join(str(c.peak) for c in allowed)
    assert ok, (f"activation peak {peak} B, predicted {want} B (+ up to {slack} B) for {case.strategy} "
                f"N={case.n} k={case.k} with a={a} B per block output, b={b} B saved per block")


def check_forwards(subject: str, case: StackCase) -> None:
    """Block forwards in one forward + backward (forward pre-hooks) equal the prediction."""
    a, b = probe.block_bytes(case.rows, case.d, case.h)
    _, forwards, _ = _observe(subject, case)
    want = {c.forwards for c in reference.costs(case.n, case.strategy, case.k, a, b)}
    assert forwards in want, f"{forwards} block forwards, predicted {sorted(want)} for {case.strategy} N={case.n} k={case.k}"


# The best single level at perfect squares, where k = sqrt(N) exactly and an off-by-one in
# the integer square root shows: fixed cases (a law draws N = 4, 9 or 16 with sqrt rarely).
SQRT_AT_SQUARES = tuple(StackCase(n, "sqrt", None, rows=2, d=4, h=16, p=0.25, seed=3) for n in (4, 9, 16))


def check_sqrt_at_perfect_squares(subject: str) -> None:
    """The activation peak and the block forwards of "sqrt" at N = 4, 9 and 16."""
    for case in SQRT_AT_SQUARES:
        check_peak(subject, case)
        check_forwards(subject, case)


def check_bad_request(subject: str, req: BadRequest) -> None:
    """A bad strategy name or k outside 1..N is a ValueError/TypeError naming what is wrong,
    at construction or at the first forward."""
    blocks = probe.make_blocks(req.n, 2, 4, 0.0, 0)
    try:
        model = load_target(subject).call(ENTRY, blocks, req.strategy, req.k)
        probe.first(model(torch.randn(1, 2))).sum().backward()
    except (ValueError, TypeError) as exc:
        text = str(exc).lower()
        assert req.words in text or (req.words == "segment_size" and "k" in text.split()), (
            f"the error for {req.strategy!r} k={req.k!r} with N={req.n} does not name {req.words!r}: {exc}")
        return
    raise AssertionError(f"strategy={req.strategy!r} segment_size={req.k!r} with N={req.n} blocks was accepted")
