"""Pipeline parallelism of another design than impl's: messages numbered per link, paired sends.

    --target conformance.selftests.targets.known_good.pipeline_sequenced

    get_pipeline_schedule(name, n_stages, n_microbatches)
    pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches,
                        group=None, normalizer=None)

Where impl and torch choose, this one chooses otherwise:

- schedules come from a rule, not from phases: 1F1B runs a forward while fewer than
  min(p - s, m) micro-batches are in flight on stage s and forwards remain, else the
  oldest backward (it gives PipeDream-Flush's order); AFAB runs its backwards last in,
  first out (m - 1 down to 0), as GPipe's figure draws them, where impl and torch run
  0 up to m - 1;
- a message's tag is its place in the sender's sends to that neighbour (0, 1, 2, ...),
  read off the sender's list of actions by both sides, not (kind, micro-batch);
- neighbours are addressed by their rank in the group (``group_peer``), not global rank;
- one header a step and link, not one a message: the first activation a stage sends in a
  step is preceded by (dtype, batch rows, trailing sizes); every later activation's shape
  follows from it (``tensor_split`` rows of micro-batch i), and a gradient has the shape of
  the output it belongs to.  (A stage's output keeps its trailing sizes across
  micro-batches, as a module applied to ``tensor_split`` rows does.)
- sends wait for the stage's next receive and go with it in one ``batch_isend_irecv``
  (posted alone where the next action receives nothing): in 1F1B's steady state the
  activation sent and the gradient received travel together, so NCCL cannot deadlock on
  them, with one process group (impl opens one group per direction);
- the last stage scales each micro-batch's backward by 1 / normalizer through the
  gradient it starts from (``backward(gradient=...)``), not by dividing the loss;
- a stage keeps its micro-batches' (input, output) in a list indexed by micro-batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

F, B = "F", "B"
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
_HEADER = 10  # dtype code, ndim, up to 8 sizes


# --- schedules ----------------------------------------------------------------------------


def _check(n_stages, n_microbatches):
    for what, value in (("n_stages", n_stages), ("n_microbatches", n_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive int, got {value!r}")


def _one_f_one_b(p: int, m: int):
    plan = []
    for s in range(p):
        actions, forwards, oldest, limit = [], 0, 0, min(p - s, m)
        while oldest < m:
            if forwards < m and forwards - oldest < limit:
                actions.append((F, forwards, s))
                forwards += 1
            else:
                actions.append((B, oldest, s))
                oldest += 1
        plan.append(tuple(actions))
    return tuple(plan)


def _afab_last_in_first_out(p: int, m: int):
    return tuple(tuple([(F, i, s) for i in range(m)] + [(B, i, s) for i in reversed(range(m))]) for s in range(p))


def get_pipeline_schedule(name, n_stages, n_microbatches):
    _check(n_stages, n_microbatches)
    key = name.lower() if isinstance(name, str) else name
    if key == "1f1b":
        return _one_f_one_b(n_stages, n_microbatches)
    if key in ("afab", "gpipe"):
        return _afab_last_in_first_out(n_stages, n_microbatches)
    raise ValueError(f"unknown pipeline schedule {name!r}; expected 'afab', 'gpipe' or '1f1b'")


# --- messages -----------------------------------------------------------------------------


def _send_order(actions, kind):
    """Micro-batch -> the place of its message in this rank's sends of that kind (activations
    after forwards, gradients after backwards): the tag both sides use."""
    return {mb: k for k, mb in enumerate(mb for a, mb, _ in actions if a == kind)}


def _rows(batch_rows: int, m: int, mb: int) -> int:
    """Rows of micro-batch mb of torch.tensor_split(batch, m)."""
    return batch_rows // m + (1 if mb < batch_rows % m else 0)


class _Link:
    """This rank's messages in one step: sends held until the next receive, then posted with
    it as one batch (or alone, where no receive comes before the next computation)."""

    def __init__(self, group):
        self.group, self.held, self.posted = group, [], []

    def send(self, t: torch.Tensor, peer: int, tag: int):
        self.held.append(dist.P2POp(dist.isend, t.detach().contiguous(), group=self.group, tag=tag, group_peer=peer))

    def flush(self, recv: dist.P2POp | None = None):
        ops = self.held + ([recv] if recv is not None else [])
        self.held = []
        if not ops:
            return
        works = dist.batch_isend_irecv(ops) or []
        if recv is None:
            self.posted += [(w, ops) for w in works]  # waited on at the end; the tensors live until then
            return
        for work in works:  # the batch completes as one (a gloo work is waited on once)
            work.wait()

    def receive(self, shape, dtype, device, peer: int, tag: int) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype, device=device)
        self.flush(dist.P2POp(dist.irecv, out, group=self.group, tag=tag, group_peer=peer))
        return out

    def finish(self):
        self.flush()
        for work, _ops in self.posted:
            work.wait()


def _header(t: torch.Tensor, batch_rows: int) -> torch.Tensor:
    h = torch.zeros(_HEADER, dtype=torch.int64, device=t.device)
    h[0], h[1], h[2] = _DTYPES.index(t.dtype), t.dim(), batch_rows
    h[3:2 + t.dim()] = torch.tensor(t.shape[1:], dtype=torch.int64)
    return h


# --- the step -----------------------------------------------------------------------------


def pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches, group=None, normalizer=None):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    plan = get_pipeline_schedule(schedule, size, n_microbatches) if isinstance(schedule, str) else schedule
    first, last, m = rank == 0, rank == size - 1, n_microbatches
    held = inputs if first else targets
    if held is not None and held.shape[0] < m:
        raise ValueError(f"cannot cut {held.shape[0]} rows into {m} micro-batches")
    if normalizer is None and held is not None:
        normalizer = held.shape[0]
    xs = torch.tensor_split(inputs, m) if first else None
    ys = torch.tensor_split(targets, m) if last else None
    device = next(stage_module.parameters()).device
    # tags: my sends are numbered by my own list; my receives by my neighbour's
    act_in = _send_order(plan[rank - 1], F) if not first else {}
    act_out = _send_order(plan[rank], F)
    grad_in = _send_order(plan[rank + 1], B) if not last else {}
    grad_out = _send_order(plan[rank], B)
    link, incoming, outgoing = _Link(group), None, None  # incoming: (dtype, batch rows, trailing sizes)
    batch_rows = inputs.shape[0] if first else None
    live = [None] * m  # micro-batch -> (stage input, stage output or loss)
    total = None
    for kind, mb, _ in plan[rank]:
        if (kind == F and first) or (kind == B and last):
            link.flush()  # nothing to receive first: the held sends go out before this computation
        if kind == F:
            if first:
                x = xs[mb]
            else:
                if incoming is None:  # the step's header from the previous stage (never crosses a gradient)
                    h = torch.empty(_HEADER, dtype=torch.int64, device=device)
                    dist.recv(h, group=group, tag=2**20, group_src=rank - 1)
                    incoming = (_DTYPES[int(h[0])], int(h[2]), tuple(int(n) for n in h[3:2 + int(h[1])]))
                    batch_rows = incoming[1]
                dtype, rows, trailing = incoming
                x = link.receive((_rows(rows, m, mb),) + trailing, dtype, device, rank - 1, act_in[mb]).requires_grad_()
            out = stage_module(x)
            if last:
                loss = loss_fn(out, ys[mb])
                total = loss.detach() if total is None else total + loss.detach()
                live[mb] = (x, loss)
            else:
                if outgoing is None:
                    outgoing = _header(out, batch_rows)
                    dist.send(outgoing, group=group, tag=2**20, group_dst=rank + 1)
                link.send(out, rank + 1, act_out[mb])
                live[mb] = (x, out)
        else:
            x, out = live[mb]
            live[mb] = None
            if last:  # d(loss / normalizer) = 1 / normalizer, started from the gradient
                out.backward(gradient=torch.full_like(out, 1.0 / normalizer))
            else:
                out.backward(gradient=link.receive(out.shape, out.dtype, device, rank + 1, grad_in[mb]))
            if not first:
                link.send(x.grad if x.grad is not None else torch.zeros_like(x), rank - 1, grad_out[mb])
    link.finish()
    return total / normalizer if last else None
