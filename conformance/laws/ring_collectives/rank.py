"""Functions run on every rank (module level: the harness pickles them by reference), and the
probe that counts a rank's point-to-point messages.

``P2PLog`` (a context manager) replaces ``torch.distributed``'s ``isend``, ``irecv``,
``send``, ``recv`` and ``batch_isend_irecv`` in this process by wrappers that log
``(kind, peer global rank, bytes)`` and call the originals; an implementation that looks
them up on ``torch.distributed`` at call time is counted, every message.  Collectives are
not point-to-point and are not logged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from conformance.laws.p2p_hang import Op, group_name
from conformance.laws.ring_collectives import reference
from conformance.laws.ring_collectives.strategies import RingCase
from conformance.target import load_target

_NAMES = ("isend", "irecv", "send", "recv", "batch_isend_irecv")


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _peer(args, kwargs, group, name: str):
    """The global rank a call sends to or receives from."""
    key = "dst" if name in ("isend", "send") else "src"
    if len(args) > 0 and args[0] is not None:
        return args[0]
    if kwargs.get(key) is not None:
        return kwargs[key]
    group_peer = kwargs.get(f"group_{key}")
    return dist.get_global_rank(group, group_peer) if group_peer is not None and group is not None else group_peer


class P2PLog:
    """Logs every message a rank sends or receives while the block runs.

    ``log``: (kind, peer, bytes) per message.  ``units``: the calls as NCCL would run them
    (``conformance.laws.p2p_hang``): one unit per unbatched call, one per batch.
    The wrappers replace the functions on ``torch.distributed`` and on its
    ``distributed_c10d`` module alike: ``P2POp`` accepts only the functions that module
    holds, so an implementation that builds ``P2POp(dist.isend, ...)`` under the probe must
    find the same wrapper in both.  ``batch_isend_irecv`` logs its ops and calls the ops'
    functions itself; those inner calls are not logged again."""

    def __init__(self):
        self.log = []  # ("send"|"recv", peer, nbytes)
        self.units = []  # tuples of p2p_hang.Op

    def __enter__(self):
        import torch.distributed.distributed_c10d as c10d

        self._modules = (dist, c10d)
        self._saved = [(m, n, getattr(m, n)) for m in self._modules for n in _NAMES if hasattr(m, n)]
        orig = {n: getattr(dist, n) for n in _NAMES}
        depth = [0]

        def wrap(name, kind):
            def call(tensor, *args, **kwargs):
                if depth[0] == 0:
                    group = kwargs.get("group", args[1] if len(args) > 1 else None)
                    peer = _peer(args, kwargs, group, name)
                    self.log.append((kind, peer, _nbytes(tensor)))
                    self.units.append((Op(kind, peer, group_name(group), False),))
                return orig[name](tensor, *args, **kwargs)

            call.__name__ = name
            return call

        def batch(ops):
            unit = []
            for op in ops:
                fname = getattr(op.op, "__name__", "")
                kind = "send" if "send" in fname else "recv"
                self.log.append((kind, op.peer, _nbytes(op.tensor)))
                unit.append(Op(kind, op.peer, group_name(op.group), True))
            self.units.append(tuple(unit))
            depth[0] += 1
            try:
                return orig["batch_isend_irecv"](ops)
            finally:
                depth[0] -= 1

        wrappers = {n: wrap(n, k) for n, k in (("isend", "send"), ("send", "send"), ("irecv", "recv"), ("recv", "recv"))}
        wrappers["batch_isend_irecv"] = batch
        for m in self._modules:
            for n, f in wrappers.items():
                setattr(m, n, f)
        return self

    def __exit__(self, *exc):
        for m, n, f in self._saved:
            setattr(m, n, f)


def run_case(ctx, target_spec: str, case: RingCase, torch_reference: bool = True):
    """On every rank: the target's collective on this rank's input, its messages, and torch's
    own collective on the same input (the eager result in this dtype)."""
    group, members = None, tuple(range(ctx.world_size))
    if case.members:
        group, members = dist.new_group(list(case.members)), case.members
        if ctx.rank not in members:
            dist.barrier()
            return None
    grank = members.index(ctx.rank)
    world = len(members)
    x = reference.rank_input(case, grank).to(ctx.device)
    fn = load_target(target_spec).factory(case.op)
    keep = x.clone()
    with P2PLog() as probe:
        out = fn(x, group)
    assert torch.equal(x, keep), f"{case.op} wrote into its input"
    eager = _torch_collective(case.op, x, group, world, grank) if torch_reference else None
    ring = [members[(grank + 1) % world], members[(grank - 1) % world]]
    if case.members:
        dist.barrier()
    return {"out": out, "eager": eager, "log": probe.log, "units": probe.units, "rank": ctx.rank, "ring": ring,
            "group_rank": grank, "world": world}


def _torch_collective(op: str, x, group, world: int, grank: int):
    if op == "ring_all_gather":
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=0)
    total = x.clone()
    dist.all_reduce(total, group=group)
    if op == "ring_reduce_scatter":
        return total.flatten().tensor_split(world)[grank]
    return total


def run_mismatch(ctx, target_spec: str, case: RingCase):
    """Every rank calls with its own (possibly different) shape; returns the error it raised."""
    x = reference.rank_input(case, ctx.rank).to(ctx.device)
    fn = load_target(target_spec).factory(case.op)
    try:
        out = fn(x, None)
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"returned {tuple(out.shape)}"
