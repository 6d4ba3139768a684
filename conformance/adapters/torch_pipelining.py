"""torch's pipelining schedules as a target: ``ScheduleGPipe`` (AFAB) and ``Schedule1F1B``.

``--target conformance.adapters.torch_pipelining`` checks them with the pipeline laws and
spec cases.  The protocol's names map onto ``torch.distributed.pipelining``:

    get_pipeline_schedule(name, n_stages, n_microbatches)
        the schedule torch declares (``_get_pipeline_order()``, the per-rank action list
        its runtime and visualiser read), F and full-B actions only (idle slots and
        REDUCE_GRAD dropped).  It is computed from (n_stages, n_microbatches) alone, so
        no stage or process group is needed.
    pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches,
                        group=None, normalizer=None)
        ``PipelineStage(stage_module, rank, W, device, group=group)`` and the schedule
        class with ``loss_fn = loss_fn(out, target) / normalizer`` and
        ``scale_grads=False`` (the protocol's loss is summed and normalised once, by the
        global count; torch's default would divide gradients by m again), then
        ``schedule.step(...)``: inputs on stage 0, targets on the last.  Returns the sum
        of the per-micro-batch losses torch reports, on the last stage.

Limits (verdicts, never passes):
    - ``Schedule1F1B`` refuses fewer micro-batches than stages (ValueError in its
      constructor): ``NotOffered``.
    - A ``PipelineStage`` built without example inputs infers the shapes of what it
      sends and receives from the first micro-batch and reuses them; micro-batches of
      unequal size (a batch not divisible by m) then never complete: on gloo both ranks
      wait forever in ``_wait_batch_p2p`` (seen with torch 2.13, 7 rows in 3
      micro-batches, GPipe and 1F1B).  The adapter raises ``NotOffered`` for them (the
      ranks agree through one all-reduce of a flag: only the ends hold the batch).
"""

from __future__ import annotations

_NAMES = {"afab": "ScheduleGPipe", "gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def _schedule_class(name):
    from torch.distributed.pipelining import schedules

    key = name.lower() if isinstance(name, str) else name
    if key not in _NAMES:
        raise ValueError(f"unknown pipeline schedule {name!r}; expected one of {sorted(_NAMES)}")
    return getattr(schedules, _NAMES[key])


def get_pipeline_schedule(name, n_stages, n_microbatches):
    from torch.distributed.pipelining.schedules import _ComputationType

    cls = _schedule_class(name)
    declared = object.__new__(cls)  # _get_pipeline_order reads these two fields only
    declared._num_stages, declared._n_microbatches = n_stages, n_microbatches
    order = declared._get_pipeline_order()
    kinds = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B"}
    return tuple(
        tuple((kinds[a.computation_type], a.microbatch_index, a.stage_index) for a in order[rank] if a is not None and a.computation_type in kinds)
        for rank in range(n_stages)
    )


def pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    from conformance.verdicts import NotOffered

    rank, size = dist.get_rank(group), dist.get_world_size(group)
    first, last = rank == 0, rank == size - 1
    cls = _schedule_class(schedule)
    if cls.__name__ == "Schedule1F1B" and n_microbatches < size:
        raise NotOffered(f"torch's Schedule1F1B refuses {n_microbatches} micro-batches on {size} stages (it needs m >= stages)")
    held = inputs if first else targets
    device = next(stage_module.parameters()).device
    uneven = torch.tensor([int(held is not None and held.shape[0] % n_microbatches != 0)], device=device)
    dist.all_reduce(uneven, op=dist.ReduceOp.MAX, group=group)  # only the ends hold the batch
    if int(uneven):
        raise NotOffered(f"torch's PipelineStage reuses the first micro-batch's shapes: {n_microbatches} unequal micro-batches are not offered")
    if normalizer is None and held is not None:
        normalizer = held.shape[0]
    stage = PipelineStage(stage_module, rank, size, device, group=group)
    runner = cls(stage, n_microbatches, loss_fn=lambda out, tgt: loss_fn(out, tgt) / normalizer, scale_grads=False)
    losses = []
    if first:
        runner.step(inputs, target=targets if last else None, losses=losses if last else None)
    elif last:
        runner.step(target=targets, losses=losses)
    else:
        runner.step()
    return torch.stack([torch.as_tensor(l).detach() for l in losses]).sum() if last else None
