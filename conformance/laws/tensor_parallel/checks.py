"""Comparisons of what the ranks returned against the dense references (the oracle judges)."""

from __future__ import annotations

import math

import torch
from hypothesis import note as _hypothesis_note
from hypothesis.errors import InvalidArgument

from conformance import oracle

from . import model as build
from . import reference as ref

F32, F64 = torch.float32, torch.float64


def note(text: str) -> None:
    """Hypothesis's note() inside a property; nothing for a fixed spec case."""
    try:
        _hypothesis_note(text)
    except InvalidArgument:
        pass


def _cat_shards(results, key, dim):
    return torch.cat([r[key] for r in results], dim=dim)


def _close(name, actual, ref64, eager, dtype=F32, magnitude=None):
    if actual is None:
        raise AssertionError(f"{name}: missing (None), the dense module has it")
    if eager is not None and dtype == F64:
        eager = None
    oracle.assert_close(name, actual, ref64, eager, dtype, magnitude)


def _grads(label, got: dict, ref64: dict, eager: dict, mags: dict | None = None, dtype=F32):
    missing = sorted(set(ref64) - set(got))
    if missing:
        raise AssertionError(f"{label}: gathered gradients lack {missing} (got {sorted(got)})")
    for name in ref64:
        _close(f"{label} grad of {name}", got[name], ref64[name], eager[name], dtype, (mags or {}).get(name))


def _linear_magnitudes(lin, x, dy):
    w = lin.weight.detach().double().abs()
    xa, dya = x.double().abs(), dy.double().abs()
    mags = {"y": xa @ w.T + (0 if lin.bias is None else lin.bias.detach().double().abs()), "dx": dya @ w,
            "weight": dya.reshape(-1, dya.shape[-1]).T @ xa.reshape(-1, xa.shape[-1])}
    if lin.bias is not None:
        mags["bias"] = dya.reshape(-1, dya.shape[-1]).sum(0)
    return mags


def check_column(case, results):
    lin = build.linear(case)
    x, dy = build.linear_inputs(case)
    y64, dx64, g64 = ref.dense_run(lin, x, dy, F64)
    y32, dx32, g32 = ref.dense_run(lin, x, dy, F32)
    mags = _linear_magnitudes(lin, x, dy)
    note(f"column-parallel {case}")
    for r, res in enumerate(results):
        y = res["y"] if case.flag else _cat_shards(results, "y", -1)
        _close(f"rank {r}: output" + (" (gathered)" if case.flag else " (shards concatenated)"), y, y64, y32, magnitude=mags["y"])
        _close(f"rank {r}: input gradient", res["dx"], dx64, dx32, magnitude=mags["dx"])
        _grads(f"rank {r}:", res["grads"], g64, g32, mags)


def check_row(case, results):
    lin = build.linear(case)
    x, dy = build.linear_inputs(case)
    y64, dx64, g64 = ref.dense_run(lin, x, dy, F64)
    y32, dx32, g32 = ref.dense_run(lin, x, dy, F32)
    mags = _linear_magnitudes(lin, x, dy)
    note(f"row-parallel {case}")
    for r, res in enumerate(results):
        _close(f"rank {r}: output", res["y"], y64, y32, magnitude=mags["y"])
        dx = _cat_shards(results, "dx", -1) if case.flag else res["dx"]
        _close(f"rank {r}: input gradient" + (" (shards concatenated)" if case.flag else ""), dx, dx64, dx32, magnitude=mags["dx"])
        _grads(f"rank {r}:", res["grads"], g64, g32, mags)


def check_embedding(case, results):
    emb = build.embedding(case)
    ids, dy = build.embedding_inputs(case)
    y64, _, g64 = ref.dense_embedding_run(emb, ids, dy, F64)
    y32, _, g32 = ref.dense_embedding_run(emb, ids, dy, F32)
    note(f"vocab-parallel embedding {case}; ids {ids.tolist()}")
    for r, res in enumerate(results):
        _close(f"rank {r}: embedding rows", res["y"], y64, y32)
        _grads(f"rank {r}:", res["grads"], g64, g32)


def check_cross_entropy(case, results):
    logits, targets, dy = build.cross_entropy_inputs(case)
    dtype = getattr(torch, case.dtype)
    loss64, grad64 = ref.cross_entropy(logits, targets, dy, case, F64)
    loss_p, grad_p = ref.cross_entropy(logits, targets, dy, case, dtype)
    note(f"vocab-parallel cross-entropy {case}; targets {targets.tolist()}")
    # magnitude of a token's loss: log-sum-exp and the target logit, each about max|x|
    scale = logits.double().abs().amax(-1)
    mag = scale if case.reduction == "none" else (scale.sum() if case.reduction == "sum" else scale.mean())
    for r, res in enumerate(results):
        loss = res["loss"]
        if not bool(torch.isfinite(loss).all()) and bool(torch.isfinite(loss64).all()):
            raise AssertionError(f"rank {r}: loss is not finite ({loss.flatten()[:4].tolist()}), F.cross_entropy's is")
        _close(f"rank {r}: loss ({case.reduction})", loss, loss64, loss_p, dtype, mag)
    grad = _cat_shards(results, "grad", -1)
    if grad.shape != grad64.shape:
        raise AssertionError(f"logit gradient shards concatenate to {tuple(grad.shape)}, expected {tuple(grad64.shape)}")
    _close("logit gradient (shards concatenated)", grad, grad64, grad_p, dtype, _softmax_grad_magnitude(logits, grad64, targets, dy, case))


def _softmax_grad_magnitude(logits, grad64, targets, dy, case):
    """w (softmax_v - [v == t]) carries the rounding of its exponent's argument
    x_v - max x (|grad| (1 + |x_v - max x|) ulps) and of the term w [v == t] it cancels
    against (w = dy for 'none', 1 for 'sum', 1 / count for 'mean')."""
    x = logits.double()
    spread = (x - x.amax(-1, keepdim=True)).abs()
    counts = (targets != case.ignore_index).double()
    w = {"none": dy.double().abs(), "sum": torch.ones_like(counts), "mean": torch.full_like(counts, 1 / max(1.0, float(counts.sum())))}[case.reduction]
    return grad64.abs() * (1 + spread) + (w * counts).unsqueeze(-1)


def check_cross_entropy_shift(case, results):
    """The shifted logits (x + c, exact in float32) give the loss and gradient of x.

    Source: softmax's invariance to c, and F.cross_entropy (the contract the protocol
    copies), which forms x - max x (exact here) before anything rounds, so its gradient does
    not degrade with |c|: the gradient is judged as for x itself.  The loss may carry |c|
    ulps (max and log-sum-exp live at the magnitude of c).  A gradient formed as
    exp(x - lse) with lse rounded at that magnitude loses |c| ulps in every element and
    fails (seen: 1.7e-5 against a 1.1e-7 bound at c = 4096); subtracting the global max
    first, as Megatron-LM and torch's loss_parallel do, passes."""
    logits, targets, dy = build.cross_entropy_inputs(case)
    unshifted = logits.double() - case.shift
    loss64, grad64 = ref.cross_entropy(unshifted, targets, dy, case, F64)
    _, grad32 = ref.cross_entropy(unshifted, targets, dy, case, F32)
    loss32, _ = ref.cross_entropy(unshifted, targets, dy, case, F32)
    note(f"shift {case.shift}: {case}")
    # the shift enters the rounding of max, log-sum-exp and the target logit: |c| ulps at most
    mag = (unshifted.abs().amax(-1) + abs(case.shift))
    mag = mag if case.reduction == "none" else (mag.sum() if case.reduction == "sum" else mag.mean())
    for r, res in enumerate(results):
        loss = res["loss"]
        if not bool(torch.isfinite(loss).all()) and bool(torch.isfinite(loss64).all()):
            raise AssertionError(f"rank {r}: loss of logits shifted by {case.shift} is not finite ({loss.flatten()[:4].tolist()})")
        _close(f"rank {r}: loss of logits + {case.shift} vs loss of logits", loss, loss64, loss32, F32, mag)
    _close(f"logit gradient of logits + {case.shift} vs of logits", _cat_shards(results, "grad", -1), grad64, grad32, F32,
           _softmax_grad_magnitude(unshifted, grad64, targets, dy, case))


def check_block(case, results):
    """Output, input gradient and parameter gradients against the dense block; gradients
    judged with the per-token magnitudes of their summands."""
    blk = build.block(case)
    x, dy = build.block_inputs(case)
    y64, dx64, g64 = ref.dense_run(blk, x, dy, F64)
    y32, dx32, g32 = ref.dense_run(blk, x, dy, F32)
    mags = ref.per_token_magnitudes(blk, x, dy)
    note(f"tensor-parallel block {case}")
    for r, res in enumerate(results):
        y = _cat_shards(results, "y", 1) if case.sequence_parallel else res["y"]
        dx = _cat_shards(results, "dx", 1) if case.sequence_parallel else res["dx"]
        _close(f"rank {r}: block output", y, y64, y32)
        _close(f"rank {r}: block input gradient", dx, dx64, dx32, magnitude=mags["input"])
        _grads(f"rank {r}: block", res["grads"], g64, g32, mags)


def check_gpt(case, results):
    """Per step, at the parameters the tensor-parallel model held before it: the loss and
    every gradient against the dense model's (one-step law, magnitudes per token); after
    the last step the parameters against the dense model trained from the same start
    (SGD: a parameter's own rounding dominates what the gradients' rounding moves it by)."""
    batches = build.gpt_batches(case)
    note(f"tensor-parallel GPT {case}")
    for r, res in enumerate(results):
        for s, (ids, tgt) in enumerate(batches):
            before = res["before"][s]
            missing = sorted(set(dict(build.gpt(case).named_parameters())) - set(before))
            if missing:
                raise AssertionError(f"rank {r}: gathered parameters lack {missing}")
            loss64, g64 = ref.gpt_step(case, before, ids, tgt, F64)
            loss32, g32 = ref.gpt_step_eager(case, before, ids, tgt, loss64, g64, step=s)
            _close(f"rank {r}: step {s} loss", res["losses"][s], loss64, loss32)
            _grads(f"rank {r}: step {s}", res["grads"][s], g64, g32, ref.gpt_magnitudes(case, before, ids, tgt))
        if r == 0:
            final64 = ref.gpt_training(case, F64)
            final32 = ref.gpt_training_eager(case, final64)
        for name in final64:
            _close(f"rank {r}: parameter {name} after {case.steps} {case.optimizer} step(s)", res["params"][name], final64[name], final32[name])


def _expect(label, seen: dict, expected: dict):
    if seen != expected:
        raise AssertionError(f"{label}: collectives {seen or '{}'}, expected exactly {expected}")


def _at_most(label, seen: dict, most: int):
    if sum(seen.values()) > most:
        raise AssertionError(f"{label}: {sum(seen.values())} collectives {seen}, at most {most} "
                             f"(Megatron-LM: one all-reduce per column-then-row pair)")


# Megatron-LM (Shoeybi et al. 2019, section 3): the MLP (column- then row-parallel) needs one
# all-reduce forward (g, after the row-parallel layer) and one backward (f, the input
# gradient of the column-parallel layer); a block (attention and MLP) two each way.
MEGATRON_COLLECTIVES = {"mlp": 1, "block": 2}


def check_mlp_collectives_at_most(case, results):
    """At most Megatron-LM's collectives each way: one for the column- then row-parallel MLP,
    two for the block (section 3 of the paper, its f and g operators).  A collective more is
    traffic and a launch the user pays for; any kind counts (an implementation may sum its
    partial products by another collective than all-reduce)."""
    for r, res in enumerate(results):
        for part, what in (("mlp", "column- then row-parallel MLP"), ("block", "tensor-parallel block")):
            for way in ("forward", "backward"):
                _at_most(f"rank {r}: {what} {way}", res[part][way], MEGATRON_COLLECTIVES[part])


def check_mlp_collectives(case, results):
    """Exactly Megatron-LM's collectives: one all-reduce each way for the MLP, two for the
    block, and nothing else (the paper's f and g operators; an extra of this suite: the
    contract is the bound of ``check_mlp_collectives_at_most``)."""
    for r, res in enumerate(results):
        _expect(f"rank {r}: column- then row-parallel MLP forward", res["mlp"]["forward"], {"all_reduce": 1})
        _expect(f"rank {r}: column- then row-parallel MLP backward", res["mlp"]["backward"], {"all_reduce": 1})
        _expect(f"rank {r}: tensor-parallel block forward", res["block"]["forward"], {"all_reduce": 2})
        _expect(f"rank {r}: tensor-parallel block backward", res["block"]["backward"], {"all_reduce": 2})


def check_sp_collectives(case, results):
    """No all-reduce of activations: two all-gathers and two reduce-scatters each way; the
    backward may all-reduce the two norm weights' gradients (a few numbers), nothing more.
    Source: Korthikanti et al. 2022 (sequence parallelism in Megatron-LM, section 4.2.2: g
    is an all-gather forward and a reduce-scatter backward, g-bar the reverse); an extra."""
    for r, res in enumerate(results):
        _expect(f"rank {r}: sequence-parallel block forward", res["forward"], {"all_gather": 2, "reduce_scatter": 2})
        bwd = dict(res["backward"])
        if bwd.get("all_reduce", 0) > 2:
            raise AssertionError(f"rank {r}: sequence-parallel block backward: {bwd['all_reduce']} all-reduces, at most 2 (norm weights)")
        bwd.pop("all_reduce", None)
        _expect(f"rank {r}: sequence-parallel block backward (all-reduces of norm weights aside)", bwd, {"all_gather": 2, "reduce_scatter": 2})


CHECKS = {"column": check_column, "row": check_row, "embedding": check_embedding, "cross_entropy": check_cross_entropy,
          "block": check_block, "gpt": check_gpt}


def check_subgroup(case, results):
    """The inner case's check on the members' results, in group-rank order; the other ranks
    returned nothing."""
    note(f"on ranks {list(case.members)} of {case.world_size}")
    outsiders = [r for r, res in enumerate(results) if r not in case.members and res is not None]
    if outsiders:  # our own rank code returns None there: a result would be the suite's bug
        raise RuntimeError(f"ranks {outsiders} outside the group returned results")
    members = [results[r] for r in case.members]
    try:
        CHECKS[case.kind](case.inner, members)
    except AssertionError as exc:
        raise AssertionError(f"on the group of global ranks {list(case.members)} of {case.world_size} "
                             f"(group rank i is global rank members[i]): {exc}") from None
