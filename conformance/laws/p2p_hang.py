"""Would these point-to-point calls hang on NCCL?  A model of how NCCL runs them.

Gloo buffers a message of any size, so point-to-point code that is right on CPU ranks can
still hang on GPUs.  NCCL (as torch's ProcessGroupNCCL drives it):

- an unbatched ``isend`` / ``irecv`` / ``send`` / ``recv`` between two ranks runs on a
  communicator and stream of that pair of ranks, inside the process group it was called
  on; a ``batch_isend_irecv`` runs all its operations together, as one unit, on the
  process group's own communicator and stream;
- a stream runs its units in the order they were issued;
- the k-th message from rank a to rank b on a communicator is taken by the k-th receive
  on b from a on that communicator (tags are ignored);
- a send finishes only when its receive runs (true of every message larger than NCCL's
  buffers: the sizes attention blocks and activations have).

``first_hang(units_by_rank)`` plays the issued units forward under those rules and
returns None when every one completes, else a sentence naming the ranks, the waiting
calls and why.  Measured, two H200s, NCCL 2.28.9: a ring step written as an ``isend`` to
the next rank then an ``irecv`` from the previous one hangs at W = 2 (next and previous
are the same rank) with 512 KiB messages, and runs as one ``batch_isend_irecv``.

A unit is a tuple of ``Op``; an unbatched call is a unit of one.
"""

from __future__ import annotations

from dataclasses import dataclass


def group_name(group) -> str:
    """A process group's name, the same on every rank (None: the default group)."""
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    return getattr(group, "group_name", None) or str(dist.get_process_group_ranks(group))


@dataclass(frozen=True)
class Op:
    kind: str  # "send" or "recv"
    peer: int  # global rank
    group: str  # the process group's name (the same on every rank)
    batched: bool  # inside a batch_isend_irecv

    def communicator(self, rank: int) -> tuple:
        if self.batched:
            return ("batch", self.group)
        return ("pair", self.group, min(rank, self.peer), max(rank, self.peer))

    def describe(self, rank: int) -> str:
        how = "in a batch_isend_irecv" if self.batched else "unbatched"
        arrow = f"to rank {self.peer}" if self.kind == "send" else f"from rank {self.peer}"
        return f"rank {rank} {self.kind} {arrow} ({how}, group {self.group})"


def _streams(units_by_rank: dict[int, list[tuple[Op, ...]]]):
    """Per (rank, stream key): the queue of unit indices, in issue order."""
    streams: dict[tuple, list[int]] = {}
    for rank, units in units_by_rank.items():
        for i, unit in enumerate(units):
            if not unit:
                continue
            streams.setdefault((rank, unit[0].communicator(rank)), []).append(i)
    return streams


def _partners(units_by_rank):
    """(rank, unit, op index) -> the matching op's (rank, unit, op index), or None."""
    queues: dict[tuple, list[tuple[int, int, int]]] = {}
    for rank, units in units_by_rank.items():
        for u, unit in enumerate(units):
            for o, op in enumerate(unit):
                sender, receiver = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
                key = (op.kind, sender, receiver, op.communicator(rank))
                queues.setdefault(key, []).append((rank, u, o))
    partner = {}
    for (kind, sender, receiver, comm), ops in queues.items():
        if kind != "send":
            continue
        recvs = queues.get(("recv", sender, receiver, comm), [])
        for i, op in enumerate(ops):
            other = recvs[i] if i < len(recvs) else None
            partner[op] = other
            if other is not None:
                partner[other] = op
    for key, ops in queues.items():
        if key[0] == "recv":
            for op in ops:
                partner.setdefault(op, None)
    return partner


def first_hang(units_by_rank: dict[int, list[tuple[Op, ...]]]) -> str | None:
    partner = _partners(units_by_rank)
    unmatched = [key for key, other in partner.items() if other is None]
    if unmatched:
        rank, u, o = min(unmatched)
        op = units_by_rank[rank][u][o]
        return (f"{op.describe(rank)} has no matching {'receive' if op.kind == 'send' else 'send'} on rank "
                f"{op.peer} in the same process group and batching: it waits forever (on NCCL, a batched and an "
                f"unbatched call never meet, and tags do not pair messages)")
    queues = {key: list(q) for key, q in _streams(units_by_rank).items()}
    matched: set = set()
    while any(queues.values()):
        heads = {(rank, q[0]) for (rank, _), q in queues.items() if q}
        progress = False
        for rank, u in heads:
            for o in range(len(units_by_rank[rank][u])):
                other = partner[(rank, u, o)]
                if (rank, u, o) not in matched and (other[0], other[1]) in heads:
                    matched.update({(rank, u, o), other})
                    progress = True
        for key, q in queues.items():
            rank = key[0]
            if q and all((rank, q[0], o) in matched for o in range(len(units_by_rank[rank][q[0]]))):
                q.pop(0)
                progress = True
        if not progress:
            return _describe_hang(units_by_rank, queues, partner, matched)
    return None


def _describe_hang(units_by_rank, queues, partner, matched) -> str:
    waits = []
    for (rank, _), q in sorted(queues.items()):
        if not q:
            continue
        unit = units_by_rank[rank][q[0]]
        for o, op in enumerate(unit):
            if (rank, q[0], o) in matched:
                continue
            other_rank, other_u, other_o = partner[(rank, q[0], o)]
            blocker = _blocking_unit(units_by_rank, queues, other_rank, other_u)
            waits.append(f"{op.describe(rank)} waits for {units_by_rank[other_rank][other_u][other_o].describe(other_rank)}, "
                         f"queued behind {blocker}")
            break
    return ("these point-to-point calls would hang on NCCL (a send waits for its receive; one pair's unbatched calls "
            "run in issue order on one stream): " + "; ".join(waits[:4]))


def _blocking_unit(units_by_rank, queues, rank, unit_index) -> str:
    for (r, _), q in queues.items():
        if r == rank and unit_index in q:
            head = units_by_rank[rank][q[0]]
            return head[0].describe(rank) if len(head) == 1 else f"a batch of {len(head)} on rank {rank}"
    return "nothing"


# ---------------------------------------------------------------------------------------
# Recording a rank's calls
# ---------------------------------------------------------------------------------------

_NAMES = ("isend", "irecv", "send", "recv", "batch_isend_irecv")


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _peer(args, kwargs, group, name: str):
    """The global rank a call sends to or receives from."""
    import torch.distributed as dist

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
    functions itself, and a blocking ``recv`` may call ``irecv``: calls made inside a logged
    call are not logged again."""

    def __init__(self):
        self.log = []  # ("send"|"recv", peer, nbytes)
        self.units = []  # tuples of p2p_hang.Op

    def __enter__(self):
        import torch.distributed as dist
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
                depth[0] += 1  # a call made inside this one (recv calling irecv) is this one
                try:
                    return orig[name](tensor, *args, **kwargs)
                finally:
                    depth[0] -= 1

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
