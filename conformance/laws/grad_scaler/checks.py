"""The comparisons behind the gradient-scaler laws (the rank side is ``rank.py``).

Exact where the arithmetic is exact: multiplying by a power of two (and by its inverse)
changes no bit of a normal fp32 number, so the unscaled gradients, the skipped steps and
scaled-vs-unscaled training are judged bit for bit.  The big-batch gradient (a sum in
another order) and the clipping norm (a float64 sum in another order) are judged by the
float64 oracle.

What fixes each quantity (no course handout covers the scaler):
- torch.amp.GradScaler's documented contract: ``scale`` multiplies by the scale factor;
  ``unscale_`` "divides ('unscales') the optimizer's gradient tensors by the scale factor"
  (dividing by S or multiplying by 1/S give the same bits while S is a power of two, so
  the bit-for-bit checks hold for either); a second ``unscale_`` before ``update`` raises
  RuntimeError (the type; its wording is free); ``step`` skips ``optimizer.step()`` when a
  gradient holds an Inf or NaN, so nothing of the optimizer changes; ``update`` multiplies
  the scale by ``backoff_factor`` after a skipped step and by ``growth_factor`` after
  ``growth_interval`` consecutive unskipped ones (``reference.scale_sequence``: the scale
  sequence ``check_growth`` and ``check_each_optimizer`` compare with); with several
  optimizers each decides on its own gradients and ``update`` runs once (torch's AMP
  examples, "Working with Multiple Models, Losses, and Optimizers").
- This suite's protocol (``conformance/target.py``), beyond torch: the non-finite check is
  agreed across the group (every rank skips together); ``step`` returns True if it stepped,
  False if not; ``first_nonfinite_gradient`` names the first parameter in
  ``named_parameters()`` order whose gradient is non-finite on any rank.
- None: how the ranks agree.  No check counts the scaler's collectives, their dtype or
  their op (impl: one float32 MAX per ``unscale_``; a known-good target: one int32 SUM of
  counts), nor reads the scale as anything but ``get_scale()``.
"""

from __future__ import annotations

import torch

from conformance import oracle
from conformance.harness import require_world_size, run_on_ranks
from conformance.laws.grad_scaler import reference
from conformance.laws.grad_scaler.rank import rank_parity, rank_scaled_training, rank_scaler_on_subgroups
from conformance.laws.grad_scaler.strategies import spec_case

CASE_TIMEOUT_S = 60.0


def _run(subject, case, fn=rank_scaled_training):
    require_world_size(case.world_size)
    return run_on_ranks(fn, case.world_size, subject, case, timeout=CASE_TIMEOUT_S)


def _injected_steps(case) -> set[int]:
    return {i[0] for i in case.inject}


def _where(case, rank, step):
    return f"W={case.world_size} {case.wrapper} {case.optimizer} scale=2^{case.scale_exp} rank {rank} step {step}"


def _same(name, a, b):
    if a is None or b is None:
        if a is not b:
            raise AssertionError(f"{name}: one is None, the other is not")
        return
    oracle.assert_bitwise_equal(name, a, b)


def check_unscale(subject, case) -> None:
    """After unscale_ every gradient is the synchronised scaled gradient times 1/S, bit for
    bit (S a power of two); step uses it as it is (no second division) and returns True."""
    for rank, records in enumerate(_run(subject, case)):
        for step, rec in enumerate(records):
            where = _where(case, rank, step)
            inv = torch.tensor(1.0 / rec["scale"], dtype=torch.float32)
            if rec["stepped"] is not True:
                raise AssertionError(f"{where}: step returned {rec['stepped']!r} on a clean step, expected True")
            for name, scaled in rec["scaled_grads"].items():
                if scaled is None:
                    continue
                if case.explicit_unscale:
                    _same(f"{where}: {name} after unscale_ vs scaled * 1/S", rec["unscaled_grads"][name], scaled * inv)
                _same(f"{where}: {name} after step vs scaled * 1/S (unscaled once)", rec["grads_after_step"][name], scaled * inv)


def check_skip(subject, case) -> None:
    """A non-finite gradient on one rank: every rank's step returns False, parameters and
    optimizer state stay bit for bit, the LR scheduler stays put and the scale backs off;
    clean steps return True on every rank and the replicas stay identical."""
    results = _run(subject, case)
    bad = _injected_steps(case)
    for rank, records in enumerate(results):
        for step, rec in enumerate(records):
            where = _where(case, rank, step) + f" (injected {case.inject})"
            if step in bad:
                if rec["stepped"] is not False:
                    raise AssertionError(f"{where}: step returned {rec['stepped']!r}; a non-finite gradient on some rank must skip it here too")
                for name, before in rec["params_before"].items():
                    _same(f"{where}: skipped step changed parameter {name}", rec["params_after"][name], before)
                for key, before in rec["opt_before"].items():
                    _same(f"{where}: skipped step changed optimizer state {key}", rec["opt_after"][key], before)
                if set(rec["opt_after"]) != set(rec["opt_before"]):
                    raise AssertionError(f"{where}: skipped step created optimizer state {sorted(set(rec['opt_after']) - set(rec['opt_before']))}")
                if rec["lr_after"] != rec["lr_before"]:
                    raise AssertionError(f"{where}: the LR scheduler moved ({rec['lr_before']} -> {rec['lr_after']}) on a skipped step")
                backoff = rec["scale"] * case.backoff_factor
                if rec["scale_after"] != backoff:
                    raise AssertionError(f"{where}: scale {rec['scale']} -> {rec['scale_after']} after an overflow, expected backoff to {backoff}")
            elif rec["stepped"] is not True:
                raise AssertionError(f"{where}: step returned {rec['stepped']!r} on a clean step, expected True")
    for rank, records in enumerate(results):
        for name, value in records[-1]["params_after"].items():
            if not name.startswith("flat_shards."):
                _same(f"rank {rank} vs rank 0: {name} at the end", value, results[0][-1]["params_after"][name])


def check_parity(subject, case) -> None:
    """Without overflow, training with a power-of-two scale (growing every growth_interval
    steps) gives the same parameters as training without scaling, bit for bit."""
    for rank, res in enumerate(_run(subject, case, rank_parity)):
        if not all(s is True for s in res["stepped"]):
            raise AssertionError(f"rank {rank}: steps returned {res['stepped']} with no overflow")
        for name, plain in res["plain"].items():
            _same(f"{_where(case, rank, case.steps - 1)}: {name} scaled vs unscaled training", res["scaled"][name], plain)


def check_growth(subject, case) -> None:
    """The scale grows by growth_factor after growth_interval clean steps in a row, is
    multiplied by backoff_factor on an overflow, and an overflow resets the count of clean
    steps; the same on every rank."""
    bad = _injected_steps(case)
    want = reference.scale_sequence(2.0**case.scale_exp, case.growth_interval, [s in bad for s in range(case.steps)],
                                    growth=case.growth_factor, backoff=case.backoff_factor)
    for rank, records in enumerate(_run(subject, case)):
        got = [r["scale_after"] for r in records]
        if got != want:
            raise AssertionError(f"W={case.world_size} rank {rank}: scales {got}, expected {want} "
                                 f"(growth_interval {case.growth_interval}, growth_factor {case.growth_factor}, "
                                 f"backoff_factor {case.backoff_factor}, overflow at steps {sorted(bad)})")


def check_second_unscale(subject, case) -> None:
    """A second unscale_ of the same optimizer before update() raises RuntimeError (and
    after update() unscale_ works again: every step calls it)."""
    for rank, records in enumerate(_run(subject, case)):
        for step, rec in enumerate(records):
            if rec.get("second_unscale") != "RuntimeError":
                raise AssertionError(f"{_where(case, rank, step)}: a second unscale_ before update() {rec.get('second_unscale')}, expected RuntimeError")


def check_first_nonfinite(subject, case) -> None:
    """first_nonfinite_gradient names, on every rank, the first parameter (named_parameters
    order) whose gradient is non-finite on ANY rank; None when all are finite."""
    results = _run(subject, case)
    for step in range(case.steps):
        names = results[0][step]["names"]
        first = None
        for i, name in enumerate(names):
            if any(r[step]["scaled_grads"][name] is not None and not bool(torch.isfinite(r[step]["scaled_grads"][name]).all())
                   for r in results):
                first = name
                break
        answers = [r[step]["first_nonfinite"] for r in results]
        if any(a != first for a in answers):
            raise AssertionError(f"W={case.world_size} step {step} (injected {case.inject}): answers per rank {answers}, expected {first!r} everywhere")


def check_subgroups(subject, case) -> None:
    """Each rank's group decides for itself: the ranks of the group holding the non-finite
    gradient skip (nothing changes, ``step`` says False, the scale backs off) and name that
    parameter as the first non-finite one; the other group steps, keeps its scale and finds
    none.  Source: the protocol's ``group=`` (the flag agreed "across the group"); a target
    that agrees over the world, or takes group ranks for global ones, mixes the groups."""
    require_world_size(case.world_size)
    results = run_on_ranks(rank_scaler_on_subgroups, case.world_size, subject, case, timeout=CASE_TIMEOUT_S)
    init = 2.0**case.scale_exp
    for r, res in enumerate(results):
        hit = r % 2 == case.inject_rank % 2
        where = (f"rank {r} (group of the {'even' if r % 2 == 0 else 'odd'} ranks; the {case.kind} is on rank "
                 f"{case.inject_rank}, W={case.world_size})")
        if hit:
            assert res["stepped"] is False and not res["changed"], (
                f"{where}: the step was not skipped (step returned {res['stepped']!r}, parameters changed: {res['changed']})")
            assert res["scale"] == init * 0.5, f"{where}: scale {res['scale']} after a skipped step, expected {init * 0.5}"
            want = res["names"][case.inject_param]
            assert res["first"] == want, f"{where}: first_nonfinite_gradient gave {res['first']!r}, expected {want!r}"
        else:
            assert res["stepped"] is True and res["changed"], (
                f"{where}: a group with finite gradients did not step (step returned {res['stepped']!r}): the other "
                f"group's non-finite gradient reached it")
            assert res["scale"] == init, f"{where}: scale {res['scale']}, expected {init} (no overflow in this group)"
            assert res["first"] is None, f"{where}: first_nonfinite_gradient gave {res['first']!r} with finite gradients in the group"


def check_clip(subject, case) -> None:
    """Clipping after unscale_ uses the global norm (FSDP: shards summed over ranks,
    replicated parameters once): returned norm and clipped gradients match the law's norm."""
    for rank, records in enumerate(_run(subject, case)):
        for step, rec in enumerate(records):
            clip = rec["clip"]
            where = _where(case, rank, step)
            norm64 = torch.tensor(clip["law_norm"], dtype=torch.float64)
            oracle.assert_close(f"{where}: returned norm", torch.tensor(clip["returned"], dtype=torch.float32), norm64, norm64.float())
            coef = min(1.0, clip["max_norm"] / (clip["law_norm"] + 1e-6))
            for name, before in rec["unscaled_grads"].items():
                if before is None:
                    continue
                ref64 = before.double() * coef
                oracle.assert_close(f"{where}: {name} after clipping (coefficient {coef:.4g})", clip["after"][name], ref64, before * coef)


def check_accumulation(subject, case) -> None:
    """k micro-batches under no_sync then one synced backward, with loss scaling, give the
    big batch's gradient after unscale_; a non-finite value in any micro-batch of any
    rank makes every rank skip the step."""
    results = _run(subject, case)
    bad = _injected_steps(case)
    ref64 = reference.big_batch_grads(case, 0, torch.float64)
    eager = reference.big_batch_grads(case, 0, torch.float32)
    for rank, records in enumerate(results):
        rec = records[0]
        where = _where(case, rank, 0) + f" k={case.micro_batches} (injected {case.inject})"
        if 0 in bad:
            if rec["stepped"] is not False:
                raise AssertionError(f"{where}: step returned {rec['stepped']!r} with a non-finite value in a micro-batch")
            continue
        if rec["stepped"] is not True:
            raise AssertionError(f"{where}: step returned {rec['stepped']!r} on a clean step")
        for name, grad in rec["grads_after_step"].items():
            key = name.removeprefix("module.")
            if ref64[key] is None or grad is None:
                _same(f"{where}: {name} (a parameter without a gradient in the big batch)", grad, ref64[key])
                continue
            oracle.assert_close(f"{where}: {name} vs the big batch", grad, ref64[key], eager[key])


def check_each_optimizer(subject, case) -> None:
    """Two optimizers under one scaler (torch's multi-optimizer contract): each unscale_s
    once (the second optimizer's unscale_ is not a second unscale_), each skips exactly when
    one of ITS gradients is non-finite on some rank, the other steps on the exactly
    unscaled gradients; update() backs off once if either found one, else counts a clean
    step; the same on every rank."""
    results = _run(subject, case)
    n_opts = 2
    overflow = []
    for step in range(case.steps):
        hit = {results[0][step]["owner"][name] for r in results for name in r[step]["injected"] if name != "input"}
        if any("input" in r[step]["injected"] for r in results):
            raise AssertionError("the two-optimizer law injects into gradients only: an input's reach is not known")
        overflow.append(bool(hit))
        for rank, records in enumerate(results):
            rec = records[step]
            where = _where(case, rank, step) + f" (injected {case.inject})"
            want = tuple(k not in hit for k in range(n_opts))
            if tuple(rec["stepped"]) != want:
                raise AssertionError(f"{where}: step returned {tuple(rec['stepped'])} for the two optimizers, expected {want} "
                                     f"(a non-finite gradient skips only the optimizer holding it)")
            inv = torch.tensor(1.0 / rec["scale"], dtype=torch.float32)
            for name, before in rec["params_before"].items():
                k = rec["owner"][name]
                if k in hit:
                    _same(f"{where}: optimizer {k} skipped but changed {name}", rec["params_after"][name], before)
                elif rec["scaled_grads"][name] is not None:
                    _same(f"{where}: {name} (optimizer {k}, clean) after unscale_ vs scaled * 1/S",
                          rec["grads_after_step"][name], rec["scaled_grads"][name] * inv)
            for key, before in rec["opt_before"].items():
                if int(key.split(".")[0]) in hit:
                    _same(f"{where}: skipped optimizer's state {key} changed", rec["opt_after"][key], before)
    want = reference.scale_sequence(2.0**case.scale_exp, case.growth_interval, overflow,
                                    growth=case.growth_factor, backoff=case.backoff_factor)
    for rank, records in enumerate(results):
        got = [r["scale_after"] for r in records]
        if got != want:
            raise AssertionError(f"W={case.world_size} rank {rank}, two optimizers: scales {got}, expected {want} "
                                 f"(overflow in either optimizer at steps {[s for s, o in enumerate(overflow) if o]}, "
                                 f"growth_interval {case.growth_interval})")


# --- fixed spec cases that kept mutants name (``spec:<name>``) ------------------------------


def spec_frozen_and_unused_parameters_are_passed_over(subject) -> None:
    """A frozen layer and a layer no rank calls sit in the optimizer with no gradient:
    unscale_ and step pass over them (exact unscale, an Inf still skips)."""
    case = dict(frozen=True, unused=True, optimizer="sgd")
    check_unscale(subject, spec_case(**case))
    check_skip(subject, spec_case(steps=2, inject=((1, 0, "grad", "inf", 1),), **case))


def spec_two_optimizers_each_skip_on_their_own_gradients(subject) -> None:
    """Optimizer 0 holds body.0's weight and bias and body.1's weight, optimizer 1 the rest:
    step 0 an Inf in optimizer 0's body.0.bias on rank 1, step 2 a NaN in optimizer 1's
    head.weight on rank 0; the other optimizer steps each time and the scale backs off."""
    check_each_optimizer(subject, spec_case(steps=3, two_optimizers=True,
                                            inject=((0, 1, "grad", "inf", 1), (2, 0, "grad", "nan", 4))))


SPEC_CHECKS = {
    "frozen_and_unused_parameters_are_passed_over": spec_frozen_and_unused_parameters_are_passed_over,
    "two_optimizers_each_skip_on_their_own_gradients": spec_two_optimizers_each_skip_on_their_own_gradients,
}
