"""Deliberately broken pipeline schedules and executors: the suite must reject every one.

Each mutant is a target (``--target conformance.mutants.pipeline:warmup_of_p``) offering
``get_pipeline_schedule`` and ``pipeline_train_step`` with one decision changed from
``impl.pipeline``.  Schedule mutants run their broken schedule through impl's executor;
executor mutants use impl's schedules and a copy of impl's executor loop with one line
changed.  Each names the laws (``conformance.laws.pipeline.laws``) that must reject it;
``conformance/selftests/test_pipeline_mutants.py`` checks that they do.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

from conformance.lawbook import Mutant
from impl.pipeline import Action, afab, one_f_one_b, run_actions
from impl.pipeline.executor import _group_info, _split
from impl.pipeline.stage import ACTIVATION, GRADIENT, recv_tensor, send_tensor

CAPABILITY = "pipeline parallelism"
F, B = "F", "B"


# --- broken schedules ---------------------------------------------------------------------


def _one_f_one_b_with(warmup_of, backward_index=lambda i, m: i, drop_last_backward=False):
    def build(p, m):
        ranks = []
        for s in range(p):
            w = warmup_of(p, s, m)
            acts = [Action(F, i, s) for i in range(w)]
            for i in range(m - w):
                acts += [Action(F, w + i, s), Action(B, backward_index(i, m), s)]
            acts += [Action(B, backward_index(i, m), s) for i in range(m - w, m)]
            if drop_last_backward:
                acts = acts[:-1]
            ranks.append(tuple(acts))
        return tuple(ranks)

    return build


def warmup_of_p(p, m):
    """1F1B whose every stage warms up with p forwards instead of p - s - 1."""
    return _one_f_one_b_with(lambda p, s, m: min(p, m))(p, m)


def warmup_from_the_wrong_end(p, m):
    """1F1B warm-up of s forwards on stage s (p - s - 1 read backwards)."""
    return _one_f_one_b_with(lambda p, s, m: min(s, m))(p, m)


def backward_order_reversed(p, m):
    """1F1B running backwards from the last micro-batch to the first."""
    return _one_f_one_b_with(lambda p, s, m: min(p - s - 1, m), backward_index=lambda i, m: m - 1 - i)(p, m)


def cool_down_one_short(p, m):
    """1F1B whose cool-down stops one backward early (the last micro-batch never runs backward)."""
    return _one_f_one_b_with(lambda p, s, m: min(p - s - 1, m), drop_last_backward=True)(p, m)


def afab_odd_stages_reverse_forwards(p, m):
    """AFAB where odd stages run their forwards in reverse micro-batch order."""
    good = afab(p, m)
    out = []
    for s, acts in enumerate(good):
        if s % 2:
            fwd = [a for a in acts if a.kind == F][::-1]
            acts = tuple(fwd) + tuple(a for a in acts if a.kind == B)
        out.append(acts)
    return tuple(out)


def _schedule_target(bad_1f1b=None, bad_afab=None):
    def get_pipeline_schedule(name, n_stages, n_microbatches):
        key = name.lower()
        if key == "1f1b":
            return (bad_1f1b or one_f_one_b)(n_stages, n_microbatches)
        if key in ("afab", "gpipe"):
            return (bad_afab or afab)(n_stages, n_microbatches)
        raise ValueError(f"unknown pipeline schedule {name!r}")

    def pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
        stage, n_stages, to_global = _group_info(group)
        plan = get_pipeline_schedule(schedule, n_stages, n_microbatches) if isinstance(schedule, str) else schedule
        return run_actions(stage_module, plan[stage], inputs, targets, loss_fn, n_microbatches, stage=stage, n_stages=n_stages,
                           to_global=to_global, group=group, normalizer=normalizer).loss

    return SimpleNamespace(get_pipeline_schedule=get_pipeline_schedule, pipeline_train_step=pipeline_train_step)


warmup_of_p_target = _schedule_target(bad_1f1b=warmup_of_p)
warmup_from_the_wrong_end_target = _schedule_target(bad_1f1b=warmup_from_the_wrong_end)
backward_order_reversed_target = _schedule_target(bad_1f1b=backward_order_reversed)
cool_down_one_short_target = _schedule_target(bad_1f1b=cool_down_one_short)
afab_odd_stages_reverse_forwards_target = _schedule_target(bad_afab=afab_odd_stages_reverse_forwards)


# --- broken executors: impl's loop (impl.pipeline.executor.run_actions) with one change -------
# (and one difference they all share: activations and gradients go over the one ``group``,
# where impl opens a process group for each direction)


def _executor_target(bug: str):
    def pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
        stage, n_stages, to_global = _group_info(group)
        plan = get_pipeline_schedule(schedule, n_stages, n_microbatches)
        first, last = stage == 0, stage == n_stages - 1
        xs = _split(inputs, n_microbatches, "inputs") if first else None
        ys = _split(targets, n_microbatches, "targets") if last else None
        if normalizer is None:
            held = inputs if first else targets
            normalizer = held.shape[0] if held is not None else None
        device = next(stage_module.parameters()).device
        prev_rank = to_global(stage - 1) if not first else None
        next_rank = to_global(stage + 1) if not last else None
        if bug == "grads_zeroed_each_step":  # BUG: forgets what earlier steps accumulated
            for p in stage_module.parameters():
                p.grad = None
        stash, pending, total = {}, [], None
        for kind, mb, _ in plan[stage]:
            if kind == F:
                if first:
                    x = xs[mb]
                else:
                    x = recv_tensor(prev_rank, ACTIVATION, mb, device, group)
                    if bug == "activations_sent_in_float32":  # BUG (with the send below): a float32 buffer in between
                        x = x.to(next(stage_module.parameters()).dtype)
                    x.requires_grad_(x.is_floating_point())
                out = stage_module(x)
                if last:
                    loss = loss_fn(out, ys[mb])
                    total = loss.detach() if total is None else total + loss.detach()
                    if bug == "loss_scaled_twice":  # BUG: divided by the count and again by m
                        out = loss / normalizer / n_microbatches
                    elif bug == "divided_once_at_the_end_under_1f1b" and schedule == "1f1b":
                        out = loss  # NOT A CONTRACT BUG: the gradients are divided once, after the step
                    elif bug == "mean_of_microbatch_means":  # BUG: each micro-batch normalised by its own rows
                        out = loss / ys[mb].shape[0] / n_microbatches
                    else:
                        out = loss / normalizer
                else:
                    sent = out.float() if bug == "activations_sent_in_float32" else out
                    pending += send_tensor(sent, next_rank, ACTIVATION, mb, group)
                if bug == "keeps_last_activations_only":  # BUG: one stash slot, overwritten by each forward
                    stash = {k: (x, out) for k in stash}
                stash[mb] = (x, out)
            else:
                x, out = stash.pop(mb)
                retain = bug == "keeps_last_activations_only"
                if last:
                    out.backward(retain_graph=retain)
                else:
                    out.backward(recv_tensor(next_rank, GRADIENT, mb, device, group), retain_graph=retain)
                if not first:
                    pending += send_tensor(x.grad if x.grad is not None else torch.zeros_like(x), prev_rank, GRADIENT, mb, group)
        for handle, _ in pending:
            handle.wait()
        if bug == "divided_once_at_the_end_under_1f1b" and schedule == "1f1b":
            # (sum of the micro-batch gradients) / count rounds unlike the sum of (each / count)
            for p in stage_module.parameters():
                if p.grad is not None:
                    p.grad.div_(normalizer)
        return total / normalizer if last else None

    def get_pipeline_schedule(name, n_stages, n_microbatches):
        from impl.pipeline import schedule

        return schedule(name, n_stages, n_microbatches)

    return SimpleNamespace(get_pipeline_schedule=get_pipeline_schedule, pipeline_train_step=pipeline_train_step)


one_group_for_both_directions = _executor_target("none")  # every copy above shares this one: no second bug
loss_scaled_twice = _executor_target("loss_scaled_twice")
keeps_last_activations_only = _executor_target("keeps_last_activations_only")
grads_zeroed_each_step = _executor_target("grads_zeroed_each_step")
mean_of_microbatch_means = _executor_target("mean_of_microbatch_means")
activations_sent_in_float32 = _executor_target("activations_sent_in_float32")
divided_once_at_the_end_under_1f1b = _executor_target("divided_once_at_the_end_under_1f1b")


def _peers_by_group_rank_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
    """impl's executor, handed the neighbours' ranks in the group where torch.distributed's
    ``dst``/``src`` take global ranks: right on the world, wrong on any other group."""
    stage, n_stages, _to_global = _group_info(group)
    plan = get_pipeline_schedule(schedule, n_stages, n_microbatches) if isinstance(schedule, str) else schedule
    return run_actions(stage_module, plan[stage], inputs, targets, loss_fn, n_microbatches, stage=stage, n_stages=n_stages,
                       to_global=lambda r: r,  # BUG: a group rank used as a global rank
                       group=group, normalizer=normalizer).loss


def get_pipeline_schedule(name, n_stages, n_microbatches):
    from impl.pipeline import schedule

    return schedule(name, n_stages, n_microbatches)


def _one_group_on_subgroups_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
    """impl's executor over the world (two channel groups); over any other group, the
    executor copy above on that one group (the second group can only be made by every
    rank of the world, so this design gives up on it there)."""
    from impl.pipeline import pipeline_train_step

    if group is None or dist.get_world_size(group) == dist.get_world_size():
        return pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=group,
                                   normalizer=normalizer)
    return one_group_for_both_directions.pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn,
                                                             n_microbatches, group=group, normalizer=normalizer)


one_group_on_a_group_of_other_ranks = SimpleNamespace(get_pipeline_schedule=get_pipeline_schedule,
                                                      pipeline_train_step=_one_group_on_subgroups_step)
peers_addressed_by_group_rank = SimpleNamespace(get_pipeline_schedule=get_pipeline_schedule,
                                                pipeline_train_step=_peers_by_group_rank_step)


# --- the list -----------------------------------------------------------------------------

PARITY = "afab_and_1f1b_gradients_equal_the_dense_model"
_M = "conformance.mutants.pipeline:"

MUTANTS = (
    Mutant("warmup_of_p", CAPABILITY, "1F1B warm-up of p forwards on every stage instead of p - s - 1",
           ("in_flight_microbatches_at_most_p_minus_s_under_1f1b_and_m_under_afab",), _M + "warmup_of_p_target"),
    Mutant("warmup_from_the_wrong_end", CAPABILITY, "1F1B warm-up of s forwards on stage s instead of p - s - 1",
           ("simulated_sends_and_receives_never_deadlock",), _M + "warmup_from_the_wrong_end_target"),
    Mutant("backward_order_reversed", CAPABILITY, "1F1B runs backwards from the last micro-batch to the first",
           ("forward_before_backward_and_stage_order_in_the_simulated_timeline",), _M + "backward_order_reversed_target"),
    Mutant("cool_down_one_short", CAPABILITY, "1F1B cool-down one backward short: the last micro-batch never runs backward",
           ("every_microbatch_gets_one_forward_and_one_backward_per_stage",), _M + "cool_down_one_short_target"),
    Mutant("afab_odd_stages_reverse_forwards", CAPABILITY, "AFAB with odd stages running forwards in reverse micro-batch order",
           ("idle_fraction_is_at_most_p_minus_1_over_m_plus_p_minus_1",), _M + "afab_odd_stages_reverse_forwards_target"),
    Mutant("one_group_for_both_directions", CAPABILITY,
           "activations and gradients sent on one process group: 1F1B's steady state deadlocks on NCCL",
           ("point_to_point_calls_cannot_hang_on_nccl",), _M + "one_group_for_both_directions"),
    Mutant("one_group_on_a_group_of_other_ranks", CAPABILITY,
           "two channel groups over the world, but one group for both directions on a handed group of other ranks: "
           "1F1B's steady state deadlocks there on NCCL",
           ("point_to_point_calls_over_a_group_of_other_ranks_cannot_hang_on_nccl",),
           _M + "one_group_on_a_group_of_other_ranks"),
    Mutant("loss_scaled_twice", CAPABILITY, "each micro-batch loss divided by the global count and again by m",
           (PARITY,), _M + "loss_scaled_twice"),
    Mutant("keeps_last_activations_only", CAPABILITY, "a stage keeps only its last micro-batch's activations for backward",
           (PARITY,), _M + "keeps_last_activations_only"),
    Mutant("grads_zeroed_each_step", CAPABILITY, "the executor zeroes gradients at each step, so accumulation across steps is lost",
           ("gradient_accumulation_across_steps_equals_one_step_on_the_whole_batch",), _M + "grads_zeroed_each_step"),
    Mutant("mean_of_microbatch_means", CAPABILITY, "each micro-batch's loss normalised by its own rows, then averaged over micro-batches",
           (PARITY, "gpt_stages_match_the_dense_gpt_with_ignored_targets"), _M + "mean_of_microbatch_means"),
    Mutant("activations_sent_in_float32", CAPABILITY, "activations cross between stages as float32 whatever the model's "
           "dtype (cast back on arrival)", ("float64_stages_send_float64_and_match_the_dense_model_to_float64_precision",),
           _M + "activations_sent_in_float32"),
    Mutant("peers_addressed_by_group_rank", CAPABILITY, "the neighbours' group ranks passed to send and receive, which take "
           "global ranks (right on the world, wrong on a group of other ranks)",
           ("stages_on_a_group_of_other_ranks_match_the_dense_model",), _M + "peers_addressed_by_group_rank"),
    Mutant("divided_once_at_the_end_under_1f1b", CAPABILITY, "under 1F1B the gradients are summed unscaled and divided by "
           "the count once after the step: right within rounding, not bit-identical to AFAB (an extra, not the contract)",
           ("afab_and_1f1b_gradients_agree_to_the_bit_where_their_backward_orders_agree",),
           _M + "divided_once_at_the_end_under_1f1b"),
)
MUTANTS_BY_NAME = {m.name: m for m in MUTANTS}
