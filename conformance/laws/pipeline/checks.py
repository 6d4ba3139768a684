"""The comparisons behind the pipeline laws.

Schedule checks are pure: they read the target's schedule data
(``get_pipeline_schedule(name, n_stages, n_microbatches)``: per rank, the ordered actions)
and play it out with ``simulate``.  An action may be any object with ``kind``,
``microbatch`` and ``stage`` attributes, or a (kind, micro-batch, stage) triple; kind is
"F" or "B".

Parity checks run the target's ``pipeline_train_step`` on ranks and judge every stage's
gradients against the dense float64 model on the whole batch with the oracle (eager: the
worse of the dense float32 model and the plain float32 micro-batch loop; magnitude: the
per-sample gradient terms summed).  Each check names the source of what it compares with
(the papers' schedules, torch's pipelining contract) or says that none does.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import torch

from conformance import oracle
from conformance.harness import resolve_device, run_on_ranks
from conformance.laws.p2p_hang import first_hang
from conformance.laws.pipeline import reference
from conformance.laws.pipeline.rank import rank_pipeline_grads, rank_pipeline_units
from conformance.laws.pipeline.simulate import in_flight_peak, simulate
from conformance.target import load_target
from conformance.verdicts import NeedsHardware, NotApplicable

CASE_TIMEOUT_S = 60.0


# --- schedule data --------------------------------------------------------------------


def normalise_action(a) -> tuple[str, int, int]:
    if all(hasattr(a, k) for k in ("kind", "microbatch", "stage")):
        kind, mb, stage = a.kind, a.microbatch, a.stage
    elif isinstance(a, (tuple, list)) and len(a) == 3:
        kind, mb, stage = a
    else:
        raise AssertionError(f"schedule action {a!r} is neither an Action nor a (kind, micro-batch, stage) triple")
    kind = getattr(kind, "value", kind)
    if kind not in ("F", "B"):
        raise AssertionError(f"schedule action {a!r}: kind {kind!r} is not 'F' or 'B'")
    return str(kind), int(mb), int(stage)


def target_plan(subject: str, name: str, n_stages: int, n_microbatches: int):
    plan = load_target(subject).call("get_pipeline_schedule", name, n_stages, n_microbatches)
    plan = [list(map(normalise_action, actions)) for actions in plan]
    if len(plan) != n_stages:
        raise AssertionError(f"{name}: schedule for {n_stages} stages has {len(plan)} ranks' lists")
    return plan


def _show(actions) -> str:
    return " ".join(f"{k}{i}" for k, i, _ in actions)


def check_counts(subject, case) -> None:
    """Each (micro-batch, stage) gets exactly one forward and one backward, on its stage's rank.

    Source: the schedules themselves (GPipe, Huang et al. 2019; 1F1B / PipeDream-Flush,
    Narayanan et al. 2021, section 2.2; torch's ScheduleGPipe and Schedule1F1B): a training
    step passes every micro-batch forward and backward through every stage once.  Not a
    cost: a missing backward loses a gradient, a repeated one doubles it."""
    plan = target_plan(subject, case.name, case.n_stages, case.n_microbatches)
    for r, actions in enumerate(plan):
        want = Counter([("F", i, r) for i in range(case.n_microbatches)] + [("B", i, r) for i in range(case.n_microbatches)])
        got = Counter(actions)
        if got != want:
            missing, extra = sorted((want - got).elements()), sorted((got - want).elements())
            raise AssertionError(
                f"{case.name} p={case.n_stages} m={case.n_microbatches}: rank {r} runs [{_show(actions)}]; "
                f"missing {missing}, unexpected or repeated {extra}"
            )


def check_dependencies(subject, case) -> None:
    """On each rank F(i) comes before B(i); in the simulated timeline a rank runs one action
    at a time, F(i, s) starts after F(i, s-1) ends and B(i, s) after B(i, s+1) ends.

    Source: data dependencies alone (a stage's forward needs its predecessor's output, a
    backward its forward and its successor's gradient); no count of ours."""
    p, m = case.n_stages, case.n_microbatches
    plan = target_plan(subject, case.name, p, m)
    where = f"{case.name} p={p} m={m}"
    for r, actions in enumerate(plan):
        seen = set()
        for kind, i, s in actions:
            if kind == "F":
                seen.add((i, s))
            elif (i, s) not in seen:
                raise AssertionError(f"{where}: rank {r} runs B{i} of stage {s} before its forward: [{_show(actions)}]")
    timeline = simulate(plan, p, case.forward_cost, case.backward_cost)
    end = {}
    for step in timeline.steps:
        end.setdefault((step.kind, step.microbatch, step.stage), step.end)
    for r in range(len(plan)):
        mine = [st for st in timeline.steps if st.rank == r]
        for a, b in zip(mine, mine[1:]):
            if b.start < a.end:
                raise AssertionError(f"{where}: rank {r} runs {b.kind}{b.microbatch} at t={b.start} while {a.kind}{a.microbatch} runs until t={a.end}")
    for st in timeline.steps:
        before = []
        if st.kind == "F" and st.stage > 0:
            before.append(("F", st.microbatch, st.stage - 1))
        if st.kind == "B":
            before.append(("F", st.microbatch, st.stage))
            if st.stage < p - 1:
                before.append(("B", st.microbatch, st.stage + 1))
        for dep in before:
            if dep not in end or end[dep] > st.start:
                raise AssertionError(f"{where}: {st.kind}{st.microbatch} of stage {st.stage} starts at t={st.start} before {dep[0]}{dep[1]} of stage {dep[2]} has finished")


def check_deadlock_free(subject, case) -> None:
    """Played out with non-blocking sends and blocking receives, every rank finishes.

    Source: a step must end (the simulation's rules, ``simulate``, are the loosest an
    executor can have: any order of receives, unbounded buffers)."""
    plan = target_plan(subject, case.name, case.n_stages, case.n_microbatches)
    timeline = simulate(plan, case.n_stages, case.forward_cost, case.backward_cost)
    if timeline.deadlocked:
        waits = "; ".join(f"rank {r} at {a[0]}{a[1]} waits for {need[0]}{need[1]} from stage {need[2]}" for r, (a, need) in timeline.stuck.items())
        raise AssertionError(f"{case.name} p={case.n_stages} m={case.n_microbatches} deadlocks: {waits}")


def check_bubble(subject, case) -> None:
    """The idle fraction of the simulated timeline is at most (p - 1) / (m + p - 1).

    Source: GPipe (Huang et al. 2019, section 2.3) and Narayanan et al. 2021 (section 2.2:
    1F1B has GPipe's bubble): p - 1 forward and backward slots idle per stage out of
    m + p - 1.  A bound from the side that costs the user (idle ranks); it is also the
    least any schedule of p one-stage ranks can idle, whatever the forward and backward
    times F and B: the last stage cannot start before (p - 1) F, then computes m (F + B),
    and its last backward still has p - 1 stages to cross, so the makespan is at least
    (m + p - 1)(F + B).  So the bound is the paper's figure, and no valid schedule is
    judged by a number of ours."""
    p, m = case.n_stages, case.n_microbatches
    plan = target_plan(subject, case.name, p, m)
    timeline = simulate(plan, p, case.forward_cost, case.backward_cost)
    if timeline.deadlocked:
        raise AssertionError(f"{case.name} p={p} m={m}: deadlocks, no timeline to measure")
    bound = Fraction(p - 1, m + p - 1)
    got = timeline.idle_fraction()
    if got > bound:
        raise AssertionError(
            f"{case.name} p={p} m={m} (F={case.forward_cost}, B={case.backward_cost}): idle fraction {got} = {float(got):.4f}, "
            f"more than (p-1)/(m+p-1) = {bound} (makespan {timeline.makespan})"
        )


def check_in_flight(subject, case) -> None:
    """1F1B holds at most min(p - s, m) micro-batches on stage s; AFAB holds all m.

    Sources: 1F1B's bound is its reason to exist (Narayanan et al. 2021, section 2.2:
    PipeDream-Flush keeps at most p micro-batches in flight, stage s at most p - s), a
    bound from the side that costs the user (activation memory).  AFAB holding all m is
    its definition, not a memory figure: GPipe's fill-drain order (Huang et al. 2019;
    torch's ScheduleGPipe: "fill-drain") runs every forward before any backward, and the
    in-flight count reaches m exactly when it does."""
    p, m = case.n_stages, case.n_microbatches
    plan = target_plan(subject, case.name, p, m)
    for s, actions in enumerate(plan):
        peak = in_flight_peak(actions)
        if case.name == "1f1b" and peak > min(p - s, m):
            raise AssertionError(f"1f1b p={p} m={m}: stage {s} holds {peak} micro-batches in flight, more than min(p - s, m) = {min(p - s, m)}: [{_show(actions)}]")
        if case.name == "afab" and peak != m:
            raise AssertionError(f"afab p={p} m={m}: stage {s} holds at most {peak} micro-batches in flight, not all m = {m}: [{_show(actions)}]")


# --- parity on ranks --------------------------------------------------------------------


def backward_orders(subject, case, names):
    out = {}
    for name in names:
        plan = target_plan(subject, name, case.n_stages, case.n_microbatches)
        out[name] = [[i for k, i, _ in actions if k == "B"] for actions in plan]
    return out


def _where(case) -> str:
    if case.members:
        return f"{case.n_stages} stages on global ranks {list(case.members)} of {case.world_size}"
    return f"W={case.world_size}"


def _stage_results(subject, case, names, device):
    results = run_on_ranks(rank_pipeline_grads, case.world_size, subject, case, names, timeout=CASE_TIMEOUT_S, device=device)
    if case.members:  # stage i on global rank members[i]; the other ranks took no part
        results = [results[r] for r in case.members]
    return results


def check_parity(subject, case, names=("afab", "1f1b"), device=None) -> None:
    """Every stage's gradients under each schedule equal the dense model's on the whole
    batch (oracle), and the returned losses add up to the dense loss.

    Source: the definition of pipeline parallelism (GPipe: "the same gradients as the
    sequential model"; torch's pipelining: a schedule's step is the model's step on the
    batch); the loss normalised once by the global count is the protocol's (its loss_fn is
    summed), which torch's ``scale_grads=False`` with a loss divided by the count also is."""
    results = _stage_results(subject, case, names, device)
    ref64, loss64 = reference.dense(case, torch.float64)
    dtype = getattr(torch, case.dtype)
    eager, loss32 = reference.eager(case, ref64, resolve_device(device), dtype)
    magnitude = reference.per_sample_magnitude(case)
    for name in names:
        seen = {}
        for r, per_rank in enumerate(results):
            for pname, grad in per_rank[name]["grads"].items():
                if grad is None:
                    raise AssertionError(f"{name}: stage {r} parameter {pname} got no gradient")
                seen[pname] = r
                oracle.assert_close(f"{name} {_where(case)} m={case.n_microbatches} {case.dtype}: stage {r} grad {pname}", grad, ref64[pname], eager[pname], dtype, magnitude=magnitude[pname])
        missing = sorted(set(ref64) - set(seen))
        if missing:
            raise AssertionError(f"{name}: no stage holds {missing}")
        losses = results[-1][name]["losses"]
        if any(loss is None for loss in losses):
            raise AssertionError(f"{name}: the last stage returned no loss")
        total = sum(losses)
        oracle.assert_close(f"{name}: loss of the step", total.reshape(()), loss64.reshape(()), loss32.reshape(()), dtype)


def check_schedules_agree_to_the_bit(subject, case, names=("afab", "1f1b"), device=None) -> None:
    """Where two schedules run the backwards of every stage in the same micro-batch order,
    their gradients agree to the bit (the same sums in the same order).

    No source fixes it: an extra (reproducibility across schedules).  An executor may
    round differently under each schedule and still be right (the contract's oracle
    judges each against the dense model).  Where the target's backward orders differ,
    the check does not apply."""
    orders = backward_orders(subject, case, names)
    if orders[names[0]] != orders[names[1]]:
        raise NotApplicable(f"the target's {names[0]} and {names[1]} run backwards in different micro-batch orders "
                            f"(p={case.n_stages}, m={case.n_microbatches}): their gradient sums may round differently")
    results = _stage_results(subject, case, names, device)
    for r, per_rank in enumerate(results):
        for pname, grad in per_rank[names[0]]["grads"].items():
            other = per_rank[names[1]]["grads"].get(pname)
            if grad is None or other is None:
                raise AssertionError(f"{names[0]} vs {names[1]}: stage {r} parameter {pname} got no gradient under one of them")
            oracle.assert_bitwise_equal(f"{names[0]} vs {names[1]}: stage {r} grad {pname}", grad, per_rank[names[1]]["grads"][pname])


def check_no_nccl_hang(subject, case, names=("afab", "1f1b"), device=None) -> None:
    """Played forward under NCCL's rules (``conformance.laws.p2p_hang``), every stage's
    point-to-point calls of one step complete, under each schedule: the calls as recorded
    here, on the ranks at hand (gloo buffers messages that NCCL makes wait for their
    receive; 1F1B's activations and gradients on one communicator deadlock there).  One
    stage exchanges nothing: where only one rank can run, the law is not run, not passed."""
    if case.world_size < 2:
        raise NeedsHardware("needs 2 ranks: a pipeline of one stage sends and receives nothing")
    results = run_on_ranks(rank_pipeline_units, case.world_size, subject, case, names, timeout=CASE_TIMEOUT_S,
                           device=device)
    for name in names:
        why = first_hang({r: per_rank[name] for r, per_rank in enumerate(results)})
        assert why is None, f"{name} {_where(case)} m={case.n_microbatches}: {why}"

