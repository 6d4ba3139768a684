"""The pipeline executor: runs one rank's list of actions for one training step.

Contract
    ``pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn,
    n_microbatches, group=None, normalizer=None)``, called on every rank of ``group``
    (default: the world) at once.  Rank r of the group holds stage r of ``W = group size``
    stages in ``stage_module`` (an ``nn.Module`` taking one tensor, returning one
    tensor); ``schedule`` is a name (``"afab"``/``"gpipe"``, ``"1f1b"``) or schedule
    data (``impl.pipeline.schedule``: one tuple of ``Action``s per rank).

    - Inputs: ``inputs`` (the whole batch, dim 0 is the batch) is read on stage 0 only,
      ``targets`` on the last stage only; other ranks may pass None.  Both are cut into
      ``n_microbatches`` consecutive micro-batches along dim 0 with
      ``torch.tensor_split`` (sizes differ by at most one; 1 <= m <= batch size).
    - Loss: ``loss_fn(output, target)`` returns the micro-batch's loss *summed* over what
      it counts (``reduction="sum"``).  The step's loss is the sum over micro-batches
      divided once by ``normalizer``, the global count (default: the batch size, read
      from ``inputs`` or ``targets``, whichever this rank holds).  Backward runs on each
      ``loss_m / normalizer``, so the gradients equal those of one step on the whole
      batch.  Gradient accumulation: gradients add into ``param.grad`` and are never
      zeroed here; to accumulate k steps, pass the count over all k as ``normalizer``.
    - Returns the step's loss (a detached 0-d tensor) on the last stage, None elsewhere.

    Communication: stage s sends each micro-batch's output to stage s + 1 and receives
    the gradient of that output back; both are point-to-point, non-blocking sends and
    blocking receives tagged by (activation or gradient, micro-batch), each preceded by
    a small int64 header with the dtype and shape.  Every send is waited on before
    return.  NCCL ignores tags and serialises the sends and receives of one pair of
    ranks on one stream, where a send may wait for its receive: 1F1B's steady state
    (stage s sends an activation, then waits for a gradient that stage s + 1 sends
    before it receives that activation) would deadlock.  So activations and gradients
    travel on two different process groups (see ``_channels``): for a pipeline over the
    world, two groups of its ranks created once, on first use; for a mesh's pipelines,
    the two ``impl.mesh`` registers; for a pipeline over any other subgroup, the subgroup
    itself (activations) and the world group (gradients), since making new groups is
    collective over ranks that are not in the pipeline.  Each channel carries one
    direction per pair of neighbours in the order both sides issue it (micro-batch order).  A stage keeps, per micro-batch in flight, its input and its output (the
    autograd graph between them) until that micro-batch's backward; at most
    ``max_in_flight`` of them at once (recorded on the returned ``StepStats`` of
    ``run_actions``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .schedule import BACKWARD, FORWARD, schedule as make_schedule
from .stage import ACTIVATION, GRADIENT, recv_tensor, send_tensor


@dataclass
class StepStats:
    loss: torch.Tensor | None
    max_in_flight: int
    peak_stash_bytes: int


def _group_info(group):
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 0, 1, lambda r: r
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return rank, size, to_global


_CHANNELS: dict = {}


def _channel_key(group) -> tuple:
    world = dist.group.WORLD if group is None else group
    return getattr(world, "group_name", None), tuple(dist.get_process_group_ranks(world))  # not id(): ids are reused


def register_channels(group, activations, gradients) -> None:
    """Use ``activations`` and ``gradients`` (process groups over ``group``'s ranks) as the
    two channels of a pipeline over ``group``.  Optional: without them a pipeline over a
    subgroup uses the subgroup and the world group.  Groups made for it must be made by
    every rank of the world in the same order (``new_group`` is collective over the
    world), which only a caller that sees every pipeline can arrange (``impl.mesh`` does,
    for its pp dimension)."""
    _CHANNELS[_channel_key(group)] = (activations, gradients)


def _channels(group):
    """(activation group, gradient group): two different process groups that both hold the
    pipeline's ranks, so the two directions never share an NCCL communicator's stream.

    Registered ones first (``register_channels``).  A pipeline over the whole world makes
    two groups of its ranks, once, on every rank.  A pipeline over a subgroup cannot make
    groups here (``new_group`` is collective over the whole world, whose other ranks are
    not calling us), but two groups holding its ranks already exist: the subgroup and the
    world.  Point-to-point calls on the world group between two ranks involve only those
    two (NCCL sets up a pair's communicator from the two of them, or uses the world's own).
    The same choice is made on every backend, so CPU ranks check the calls GPUs make.  A
    subgroup on another backend than the world's: on gloo its one group (gloo buffers
    messages, so the two directions cannot deadlock); on NCCL a clear error."""
    if not (dist.is_available() and dist.is_initialized()):
        return group, group
    key = _channel_key(group)
    if key in _CHANNELS:
        return _CHANNELS[key]
    whole_world = group is None or dist.get_world_size(group) == dist.get_world_size()
    if not whole_world:
        backend, world_backend = dist.get_backend(group), dist.get_backend(dist.group.WORLD)
        if backend == world_backend:
            return group, dist.group.WORLD
        if "nccl" not in backend:  # a subgroup on another backend than the world's: gloo buffers, one group will do
            return group, group
        raise RuntimeError(
            f"a pipeline over the subgroup {list(key[1])} on {backend} needs a second group holding its ranks on the same "
            f"backend, and the world group is on {world_backend}: build its groups with impl.mesh.get_parallel_mesh, or "
            "create two groups of its ranks on every rank and pass them to impl.pipeline.executor.register_channels")
    _CHANNELS[key] = (dist.new_group(list(key[1])), dist.new_group(list(key[1])))
    return _CHANNELS[key]


def _split(batch: torch.Tensor, n: int, what: str):
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"{what} must be a tensor (the whole batch), got {type(batch).__name__}")
    if batch.dim() == 0 or batch.shape[0] < n:
        raise ValueError(f"cannot cut {what} of shape {tuple(batch.shape)} into {n} micro-batches along dim 0")
    return torch.tensor_split(batch, n, dim=0)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def run_actions(stage_module, actions, inputs, targets, loss_fn, n_microbatches, *, stage, n_stages, to_global=lambda r: r, group=None, normalizer=None) -> StepStats:
    """Run one rank's actions (see the module docstring); returns the loss and stash stats."""
    if n_microbatches < 1:
        raise ValueError(f"n_microbatches must be at least 1, got {n_microbatches}")
    first, last = stage == 0, stage == n_stages - 1
    xs = _split(inputs, n_microbatches, "inputs") if first else None
    ys = _split(targets, n_microbatches, "targets") if last else None
    if normalizer is None:
        held = inputs if first else targets
        if held is None:
            normalizer = None  # a middle stage never divides
        else:
            normalizer = held.shape[0]
    if (last and normalizer is not None) and float(normalizer) <= 0:
        raise ValueError(f"normalizer must be positive, got {normalizer}")
    device = next((p.device for p in stage_module.parameters()), None)
    if device is None:
        device = (inputs if first else targets).device if (first or last) else torch.device("cpu")
    prev_rank = to_global(stage - 1) if not first else None
    next_rank = to_global(stage + 1) if not last else None
    act_group, grad_group = _channels(group)

    stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    pending = []
    total = None
    max_in_flight = peak_bytes = 0
    done = set()
    for action in actions:
        kind, mb, at = action
        if at != stage:
            raise ValueError(f"rank of stage {stage} was given {action!r}, an action of stage {at}")
        if not 0 <= mb < n_microbatches:
            raise ValueError(f"{action!r}: micro-batch {mb} outside 0..{n_microbatches - 1}")
        if (kind, mb) in done:
            raise ValueError(f"{action!r} appears twice in stage {stage}'s schedule")
        done.add((kind, mb))
        if kind == FORWARD:
            if first:
                x = xs[mb]
            else:
                x = recv_tensor(prev_rank, ACTIVATION, mb, device, act_group)
                x.requires_grad_(x.is_floating_point())
            out = stage_module(x)
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"stage {stage} returned {type(out).__name__}; a stage returns one tensor")
            if last:
                loss = loss_fn(out, ys[mb])
                total = loss.detach() if total is None else total + loss.detach()
                stash[mb] = (x, loss / normalizer)
            else:
                pending += send_tensor(out, next_rank, ACTIVATION, mb, act_group)
                stash[mb] = (x, out)
            max_in_flight = max(max_in_flight, len(stash))
            peak_bytes = max(peak_bytes, sum(_tensor_bytes(o) for _, o in stash.values()))
        elif kind == BACKWARD:
            if mb not in stash:
                raise ValueError(f"{action!r}: backward of micro-batch {mb} before its forward on stage {stage}")
            x, out = stash.pop(mb)
            if last:
                out.backward()
            else:
                grad = recv_tensor(next_rank, GRADIENT, mb, device, grad_group)
                out.backward(grad)
            if not first:
                grad_in = x.grad if x.grad is not None else torch.zeros_like(x)
                pending += send_tensor(grad_in, prev_rank, GRADIENT, mb, grad_group)
        else:
            raise ValueError(f"unknown action kind {kind!r} in {action!r}; expected 'F' or 'B'")
    for handle, _buffer in pending:
        handle.wait()
    missing = sorted(stash)
    if missing:
        raise ValueError(f"stage {stage}: micro-batches {missing} ran forward but never backward")
    loss = total / normalizer if (last and total is not None) else None
    return StepStats(loss, max_in_flight, peak_bytes)


def pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
    stage, n_stages, to_global = _group_info(group)
    plan = make_schedule(schedule, n_stages, n_microbatches) if isinstance(schedule, str) else schedule
    if len(plan) != n_stages:
        raise ValueError(f"the schedule has {len(plan)} ranks' actions; the group has {n_stages} ranks")
    stats = run_actions(
        stage_module, plan[stage], inputs, targets, loss_fn, n_microbatches,
        stage=stage, n_stages=n_stages, to_global=to_global, group=group, normalizer=normalizer,
    )
    return stats.loss
