"""Functions run on every rank (module level: the harness pickles them by reference), and
the probe that observes what a rank's ring attention communicates and computes.

The probe (``Probe``, a context manager) wraps ``torch.distributed``'s point-to-point
calls (``isend``, ``irecv``, ``send``, ``recv``, ``batch_isend_irecv``) and collectives
in this process, and counts matmul FLOPs with a dispatch mode.  It logs, in order:

    ("p2p", phase, "send"|"recv", peer, nbytes)       one per point-to-point op
    ("collective", phase, name, nbytes)               nbytes: what this rank takes in from
                                                      the others (``received_bytes``)
    ("start", phase, id, nbytes) / ("wait", phase, id)
                                                      an exchange started (a batch of
                                                      point-to-point ops, or a collective
                                                      called with async_op=True; nbytes:
                                                      its bytes sent and received), and
                                                      first waited on
    ("flops", phase, n)                               one per matmul (torch ops only)

``delayed=True`` holds every exchange back until one of its requests is waited on: a
send then reads its buffer at that moment, and a receive buffer (or an asynchronous
gather's output) holds NaN until then.  An implementation may only rely on what the API
promises (data is there after wait()), so its results must not change; reading a block
before waiting on it shows up as NaN.  Exchanges never waited on are started and
completed when the probe exits.  Calls torch makes inside a wrapped call (the deprecated
``all_gather_into_tensor`` calls ``all_gather_single``) are logged once, as the outer call.
Functional collectives (``torch.distributed._functional_collectives``) are not observed.
"""

from __future__ import annotations

import inspect
import itertools

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.laws.context_parallel import reference
from conformance.laws.p2p_hang import Op, group_name
from conformance.target import load_target

P2P_NAMES = ("isend", "irecv", "send", "recv")
COLLECTIVE_NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast", "reduce_scatter_tensor",
                    "all_to_all_single", "all_to_all", "reduce", "gather", "scatter", "reduce_scatter",
                    "all_gather_object", "broadcast_object_list", "barrier")

_aten = torch.ops.aten


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(x) for x in obj)
    return 0


def _group_rank_and_size(group) -> tuple[int, int]:
    group = group if group is not None else dist.group.WORLD
    return dist.get_rank(group), dist.get_world_size(group)


def received_bytes(name: str, call: dict) -> int:
    """Bytes a collective brings this rank from the other ranks of its group (its own
    contribution excluded); ``call`` maps the collective's parameter names to the values
    passed.  A reduction counts the buffer it reduces into; objects and barriers count 0."""
    group = call.get("group")
    if name == "all_gather":
        return _nbytes(call["tensor_list"]) - _nbytes(call["tensor"])
    if name in ("all_gather_into_tensor", "all_gather_single"):
        return _nbytes(call["output_tensor"]) - _nbytes(call["input_tensor"])
    if name == "all_to_all_single":
        out = call["output"]
        grank, size = _group_rank_and_size(group)
        splits = call.get("output_split_sizes")
        own = (_nbytes(out) // max(size, 1) if not splits
               else splits[grank] * (out[0].numel() if out.dim() and out.shape[0] else 0) * out.element_size())
        return _nbytes(out) - own
    if name == "all_to_all":
        grank, _ = _group_rank_and_size(group)
        outs = call["output_tensor_list"]
        return _nbytes(outs) - _nbytes(outs[grank])
    if name in ("broadcast", "scatter"):
        src = call.get("src")
        mine = dist.get_rank() if src is not None else _group_rank_and_size(group)[0]
        src = src if src is not None else (call.get("group_src") or 0)
        return 0 if src == mine else _nbytes(call["tensor"])
    if name in ("all_reduce", "reduce"):
        return _nbytes(call["tensor"])
    if name == "reduce_scatter_tensor":
        return _nbytes(call["input"]) - _nbytes(call["output"])
    if name == "reduce_scatter":
        return _nbytes(call["input_list"]) - _nbytes(call["output"])
    if name == "gather":
        return max(0, _nbytes(call.get("gather_list") or []) - _nbytes(call["tensor"]))
    return 0


def _written_outputs(name: str, call: dict) -> list:
    """The tensors a gathering collective writes that hold none of its input (NaN-filled
    while a delayed exchange has not run)."""
    if name == "all_gather":
        outs = list(call["tensor_list"])
    elif name in ("all_gather_into_tensor", "all_gather_single"):
        outs = [call["output_tensor"]]
    elif name == "all_to_all_single":
        outs = [call["output"]]
    elif name == "all_to_all":
        outs = list(call["output_tensor_list"])
    else:
        return []
    inputs = [t for key in ("tensor", "input_tensor", "input") for t in [call.get(key)] if isinstance(t, torch.Tensor)]
    inputs += [t for t in call.get("input_tensor_list") or [] if isinstance(t, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr() for t in inputs}
    return [t for t in outs if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in storages]


def _matmul_flops(func, args) -> int:
    packet = getattr(func, "overloadpacket", None)
    if packet is _aten.mm:
        (m, k), n = args[0].shape, args[1].shape[-1]
        return 2 * m * k * n
    if packet is _aten.addmm:
        (m, k), n = args[1].shape, args[2].shape[-1]
        return 2 * m * k * n
    if packet is _aten.bmm:
        (b, m, k), n = args[0].shape, args[1].shape[-1]
        return 2 * b * m * k * n
    if packet is _aten.baddbmm:
        (b, m, k), n = args[1].shape, args[2].shape[-1]
        return 2 * b * m * k * n
    return 0


class _FlopLog(TorchDispatchMode):
    def __init__(self, probe):
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flops = _matmul_flops(func, args)
        if flops:
            self.probe.log.append(("flops", self.probe.phase, flops))
        return func(*args, **(kwargs or {}))


class _Batch:
    """One exchange: a batch of point-to-point ops or an asynchronous collective; started
    at once, or (delayed) at its first wait."""

    def __init__(self, probe, ops, start, nbytes=None):
        self.probe, self.ops, self._start = probe, ops, start
        self.id = next(probe.ids)
        self.works = None
        self.waited = False
        nbytes = sum(_nbytes(t) for _, t in ops) if nbytes is None else nbytes
        probe.log.append(("start", probe.phase, self.id, nbytes))
        if probe.delayed:
            for op in ops:
                if op[0] == "recv" and op[1].is_floating_point():
                    op[1].fill_(float("nan"))  # nothing has arrived yet
            probe.pending.append(self)
        else:
            self.works = start()

    def wait(self):
        if not self.waited:
            self.waited = True
            self.probe.log.append(("wait", self.probe.phase, self.id))
        self.complete()
        return True

    def complete(self):
        if self.works is None:
            # Start every earlier held batch first: per-peer message order is program order.
            for earlier in list(self.probe.pending):
                if earlier is self:
                    break
                earlier.complete()
            self.works = self._start()
            if self in self.probe.pending:
                self.probe.pending.remove(self)
        for work in self.works or ():
            if work is not None:
                work.wait()
        self.works = []


class _Request:
    """What the wrapped calls return in place of a ``Work``: wait() completes its batch."""

    def __init__(self, batch):
        self.batch = batch

    def wait(self, timeout=None):
        return self.batch.wait()

    def is_completed(self):
        return self.batch.works == []


class Probe:
    """See the module docstring.  ``phase`` is set by the rank function ("forward", ...)."""

    def __init__(self, *, delayed: bool = False, flops: bool = True):
        self.delayed = delayed
        self.flops = flops
        self.log: list[tuple] = []
        self.phase = ""
        self.ids = itertools.count()
        self.pending: list[_Batch] = []
        self.units = []  # the calls as NCCL runs them (conformance.laws.p2p_hang): one per call or batch
        self._saved = []
        self._mode = None

    # --- recording -----------------------------------------------------------------------

    def _p2p(self, kind, tensor, peer):
        self.log.append(("p2p", self.phase, kind, int(peer), _nbytes(tensor)))

    def _unit(self, ops) -> None:
        """ops: (kind, peer, group) of one unbatched call (one op) or one batch."""
        batched = len(ops) > 1 or self._batching
        self.units.append(tuple(Op(kind, int(peer), group_name(group), batched) for kind, peer, group in ops))

    def __enter__(self):
        originals = {name: getattr(c10d, name) for name in P2P_NAMES + ("batch_isend_irecv", "_check_op")}
        originals.update({name: getattr(c10d, name) for name in COLLECTIVE_NAMES if hasattr(c10d, name)})
        self.originals = originals
        probe = self

        def peer_of(kwargs, args, key):
            if len(args) > 1 and args[1] is not None:
                return args[1]
            for name in (key, "group_" + key):
                if kwargs.get(name) is not None:
                    value = kwargs[name]
                    if name.startswith("group_") and kwargs.get("group") is not None:
                        value = dist.get_global_rank(kwargs["group"], value)
                    return value
            return -1

        def group_of(kwargs, args):  # args after the tensor: (peer, group, tag)
            return kwargs.get("group", args[1] if len(args) > 1 else None)

        def make_async(name, kind, key):
            orig = originals[name]

            def wrapped(tensor, *args, **kwargs):
                if probe._inside_batch:  # called by batch_isend_irecv, which logged it
                    return orig(tensor, *args, **kwargs)
                batch = _Batch(probe, [(kind, tensor)], lambda: [orig(tensor, *args, **kwargs)])
                peer = peer_of(kwargs, (tensor, *args), key)
                probe._p2p(kind, tensor, peer)
                probe._unit([(kind, peer, group_of(kwargs, args))])
                return _Request(batch)

            wrapped.__name__ = name
            return wrapped

        def make_blocking(name, kind, key):
            orig = originals[name]

            def wrapped(tensor, *args, **kwargs):
                peer = peer_of(kwargs, (tensor, *args), key)
                probe._p2p(kind, tensor, peer)
                probe._unit([(kind, peer, group_of(kwargs, args))])
                return orig(tensor, *args, **kwargs)

            wrapped.__name__ = name
            return wrapped

        wrapped = {
            "isend": make_async("isend", "send", "dst"),
            "irecv": make_async("irecv", "recv", "src"),
            "send": make_blocking("send", "send", "dst"),
            "recv": make_blocking("recv", "recv", "src"),
        }
        self._wrapped = wrapped
        self._inside_batch = False
        self._inside_collective = False
        self._batching = False
        unwrap = {wrapped["isend"]: originals["isend"], wrapped["irecv"]: originals["irecv"]}
        rewrap = {originals["isend"]: wrapped["isend"], originals["irecv"]: wrapped["irecv"]}

        def check_op(op):
            if op in unwrap or op in rewrap:  # the wrapped or the original isend / irecv
                return None
            return originals["_check_op"](op)

        def batch_isend_irecv(p2p_op_list):
            for op in p2p_op_list:
                op.op = rewrap.get(op.op, op.op)  # c10d compares op.op with its (wrapped) isend
            kinds = [("send" if op.op is wrapped["isend"] else "recv", op.tensor) for op in p2p_op_list]

            def start():
                probe._inside_batch = True
                try:
                    works = originals["batch_isend_irecv"](p2p_op_list)
                finally:
                    probe._inside_batch = False
                return list(works)

            batch = _Batch(probe, kinds, start)
            for kind, op in zip(kinds, p2p_op_list):  # logged in program order (delayed: the calls come later)
                probe._p2p(kind[0], op.tensor, op.peer)
            probe._batching = True
            try:
                probe._unit([(kind[0], op.peer, op.group) for kind, op in zip(kinds, p2p_op_list)])
            finally:
                probe._batching = False
            return [_Request(batch) for _ in p2p_op_list]

        def make_collective(name):
            orig = originals[name]
            try:
                signature = inspect.signature(orig)
            except (TypeError, ValueError):
                signature = None

            def wrapped_collective(*args, **kwargs):
                if probe._inside_collective:  # torch's own call inside a logged one
                    return orig(*args, **kwargs)
                try:
                    call = signature.bind(*args, **kwargs)
                    call.apply_defaults()
                    call = dict(call.arguments)
                    nbytes = received_bytes(name, call)
                except Exception:  # noqa: BLE001 - a call torch itself will reject
                    call, nbytes = {}, _nbytes(list(args[:2]))
                probe.log.append(("collective", probe.phase, name, nbytes))

                def run():
                    probe._inside_collective = True
                    try:
                        return orig(*args, **kwargs)
                    finally:
                        probe._inside_collective = False

                if not call.get("async_op"):
                    return run()
                outputs = _written_outputs(name, call)
                return _Request(_Batch(probe, [("recv", t) for t in outputs], lambda: [run()], nbytes))

            wrapped_collective.__name__ = name
            return wrapped_collective

        replacements = dict(wrapped, batch_isend_irecv=batch_isend_irecv, _check_op=check_op)
        for name in COLLECTIVE_NAMES:
            if name in originals:
                replacements[name] = make_collective(name)
        for name, fn in replacements.items():
            for module in (c10d, dist):
                if hasattr(module, name):
                    self._saved.append((module, name, getattr(module, name)))
                    setattr(module, name, fn)
        if self.flops:
            self._mode = _FlopLog(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            if self._mode is not None:
                self._mode.__exit__(*exc)
            for batch in list(self.pending):  # never waited on: finish them (the case must complete its sends)
                batch.complete()
        finally:
            for module, name, fn in reversed(self._saved):
                setattr(module, name, fn)
        return False

    # --- reading the log -----------------------------------------------------------------

    def p2p(self, phase):
        return [e for e in self.log if e[0] == "p2p" and e[1] == phase]

    def collectives(self, phase):
        return [e for e in self.log if e[0] == "collective" and e[1] == phase]

    def flops_in(self, phase) -> int:
        return sum(e[2] for e in self.log if e[0] == "flops" and e[1] == phase)


# --- rank functions ---------------------------------------------------------------------------


def _saved_lse(o, q_shape):
    node = o.grad_fn
    saved = [t for t in getattr(node, "saved_tensors", ()) if isinstance(t, torch.Tensor) and t.shape == q_shape[:-1]]
    if len(saved) != 1:
        raise AssertionError(
            f"ring attention must save exactly one logsumexp tensor of shape {tuple(q_shape[:-1])} for backward; "
            f"found {len(saved)}"
        )
    return saved[0]


def ring_function(target_spec: str):
    return load_target(target_spec).call("get_ring_attention_autograd_function")


def _case_group(ctx, case):
    """(group, this rank's place in it, its size): the default group, or the case's subgroup
    (None when this rank is not a member).  Every rank of the pool creates the subgroup."""
    if not case.members:
        return None, ctx.rank, ctx.world_size
    group = dist.new_group(list(case.members))
    if ctx.rank not in case.members:
        return None, None, len(case.members)
    return group, case.members.index(ctx.rank), len(case.members)


def rank_ring(ctx, target_spec: str, case, probe: str = "none", backward: bool = True):
    """Run the target's ring attention on this rank's shards of the case's sequence.

    Returns {"O", "L", "dQ", "dK", "dV"} shards (CPU) and, with a probe, its log; a rank
    outside the case's subgroup returns None.
    probe: "none", "observe" (log communication and FLOPs) or "delayed" (also hold every
    exchange back until it is waited on).
    """
    fn = ring_function(target_spec)
    group, r, W = _case_group(ctx, case)
    if r is None:
        dist.barrier()  # the members' case ends at the same barrier
        return None
    q, k, v, do = case.make()
    shards = [reference.shard(t, W, r, case.layout).to(ctx.device) for t in (q, k, v, do)]
    qs, ks, vs = (t.clone().requires_grad_(backward) for t in shards[:3])
    out = {}
    watcher = Probe(delayed=probe == "delayed", flops=probe != "none") if probe != "none" else None
    if watcher is not None:
        watcher.__enter__()
    try:
        if watcher is not None:
            watcher.phase = "forward"
        with torch.set_grad_enabled(backward):
            o = fn.apply(qs, ks, vs, case.is_causal, group, case.layout)
        out["O"] = o.detach()
        if backward:
            out["L"] = _saved_lse(o, qs.shape).detach().clone()
            if watcher is not None:
                watcher.phase = "backward"
            o.backward(shards[3])
            out.update(dQ=qs.grad, dK=ks.grad, dV=vs.grad)
        if watcher is not None:
            watcher.phase = "after"
    finally:
        if watcher is not None:
            watcher.__exit__(None, None, None)
    if watcher is not None:
        out["log"] = watcher.log
        out["units"] = watcher.units
    if case.members:
        dist.barrier()
    return out


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def rank_mismatched_lengths(ctx, target_spec: str, n: int, d: int):
    """Rank 0 passes a longer shard than the others: every rank must raise, naming it.
    Returns the error this rank raised (any exception type), or None."""
    fn = ring_function(target_spec)
    length = n + (2 if ctx.rank == 0 else 0)
    q, k, v = (torch.randn(1, length, d, device=ctx.device) for _ in range(3))
    try:
        fn.apply(q, k, v, False, None, "contiguous")
    except Exception as exc:  # noqa: BLE001 - any clear error will do; the check reads its words
        return _error(exc)
    return None


def rank_odd_zigzag(ctx, target_spec: str):
    """An odd local length cannot hold two equal zigzag chunks: a clear error on every rank."""
    fn = ring_function(target_spec)
    q, k, v = (torch.randn(1, 3, 8, device=ctx.device) for _ in range(3))
    try:
        fn.apply(q, k, v, True, None, "zigzag")
    except Exception as exc:  # noqa: BLE001 - any clear error will do; the check reads its words
        return _error(exc)
    return None
