"""Deliberately broken ring collectives: the suite must reject every one.

Each mutant is a target (``--target conformance.mutants.ring_collectives:last_step_skipped``)
offering the four ring entry points: impl's, with one decision changed in a copy of the
piece it breaks.  Each names the laws (``conformance.laws.ring_collectives.laws``) that must
reject it; ``conformance/selftests/test_mutants.py`` checks that they do.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

from conformance.lawbook import Mutant
from impl.collectives import ring
from impl.collectives.ring import _agree, _group_info, _step

CAPABILITY = "ring collectives"


def _unbatched_step(send, recv, nxt, prv, group):
    """An isend to the next rank, then an irecv from the previous: fine on gloo; on NCCL at
    W = 2 both ranks' sends wait for receives queued behind them."""
    reqs = [dist.isend(send.contiguous(), nxt, group=group), dist.irecv(recv, prv, group=group)]
    for req in reqs:
        req.wait()


def _ag_chunks(chunks, world, rank, nxt, prv, group, step=_step):
    for t in range(world - 1):
        into = chunks[(rank - t - 1) % world]
        buf = torch.empty_like(into)
        step(chunks[(rank - t) % world], buf, nxt, prv, group)
        into.copy_(buf)


def _rs_chunks(chunks, world, rank, nxt, prv, group, send_shift=1, steps=None, whole=None, step=_step):
    for t in range(world - 1 if steps is None else steps):
        send = chunks[(rank - t - send_shift) % world]
        into = chunks[(rank - t - 2) % world]
        if whole is not None:  # the whole buffer goes out; only the chunk is used
            buf = torch.empty_like(whole)
            step(whole, buf, nxt, prv, group)
            into.add_(buf.tensor_split(world)[(rank - t - 2) % world])
            continue
        buf = torch.empty_like(into)
        step(send, buf, nxt, prv, group)
        into.add_(buf)


def _ag_direct(chunks, world, rank, group):
    """Every rank sends its own chunk straight to every other rank, in one batch: the right
    gather in the ring's count of messages and bytes, but not a ring (W >= 3 shows it)."""
    ops = []
    for j in range(world):
        if j != rank:
            peer = j if group is None else dist.get_global_rank(group, j)
            ops += [dist.P2POp(dist.isend, chunks[rank], peer, group), dist.P2POp(dist.irecv, chunks[j], peer, group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def _target(rs=None, alternate=None, peers=None, agree=_agree, step=_step, alias_at_one=False, flat_view=False,
            ag=None):
    flatten = (lambda t: t.view(-1)) if flat_view else (lambda t: t.reshape(-1))  # view: contiguous inputs only

    def reduce_scatter(tensor, group=None, _all=False):
        world, rank, nxt, prv = (peers or _group_info)(group)
        flat = flatten(tensor.detach()).clone()
        if world == 1:
            return flat.reshape(tensor.shape) if _all else flat
        agree(tensor, group, "ring")
        chunks = flat.tensor_split(world)
        if rs == "whole":
            _whole(chunks, world, rank, nxt, prv, group, flat)
        else:
            (rs or (lambda *a: _rs_chunks(*a, step=step)))(chunks, world, rank, nxt, prv, group)
        if _all:
            _ag_chunks(chunks, world, rank, nxt, prv, group, step)
            return flat.reshape(tensor.shape)
        return chunks[rank].clone()

    def all_gather(tensor, group=None):
        world, rank, nxt, prv = (peers or _group_info)(group)
        if world == 1:
            return tensor.detach() if alias_at_one else tensor.detach().clone()
        agree(tensor, group, "ring")
        out = torch.empty((world * tensor.numel(),), dtype=tensor.dtype, device=tensor.device)
        chunks = out.tensor_split(world)
        chunks[rank].copy_(flatten(tensor.detach()))
        if ag == "direct":
            _ag_direct(chunks, world, rank, group)
        else:
            _ag_chunks(chunks, world, rank, nxt, prv, group, step)
        return out.reshape((world * tensor.shape[0],) + tuple(tensor.shape[1:]))

    def alt(tensor, group=None):
        if alternate is None and peers is None and agree is _agree and step is _step and not flat_view:
            return ring.ring_all_reduce_alternate(tensor, group)
        world, rank, nxt, prv = (peers or _group_info)(group)
        total = tensor.detach().clone().contiguous()
        if world == 1:
            return total
        agree(tensor, group, "ring")
        passing = total.clone()
        for _ in range(world - 1):
            incoming = torch.empty_like(passing)
            step(passing, incoming, nxt, prv, group)
            total.add_(incoming)
            passing = total.clone() if alternate == "partial" else incoming
        return total

    return SimpleNamespace(
        ring_all_reduce=lambda t, group=None: reduce_scatter(t, group, _all=True),
        ring_all_gather=all_gather,
        ring_reduce_scatter=reduce_scatter,
        ring_all_reduce_alternate=alt,
    )


def _own_twice(chunks, world, rank, nxt, prv, group):
    own = chunks[rank].clone()
    _rs_chunks(chunks, world, rank, nxt, prv, group)
    chunks[rank].add_(own)


def _whole(chunks, world, rank, nxt, prv, group, whole):
    _rs_chunks(chunks, world, rank, nxt, prv, group, whole=whole)


def _group_ranks_as_global(group):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    return world, rank, (rank + 1) % world, (rank - 1) % world


def _numel_only(tensor, group, what):
    """Agrees on the number of elements only: a shape that differs at equal size slips by."""
    n = torch.tensor([tensor.numel(), -tensor.numel()], dtype=torch.int64, device=tensor.device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX, group=group)
    if n[0].item() != -n[1].item():
        raise ValueError(f"{what}: ranks disagree on the shape: this rank has {tuple(tensor.shape)}")


def _names_nothing(tensor, group, what):
    """impl's agreement, with an error that says only that something differs."""
    try:
        _agree(tensor, group, what)
    except ValueError:
        raise ValueError(f"{what}: the ranks' tensors do not agree") from None


def _backend_collectives():
    """torch.distributed's collectives (right values) without the declaration that they are
    not point-to-point rings: what a "ring" that calls dist.all_reduce looks like."""
    from conformance.adapters import torch_collectives as backend

    names = ("ring_all_reduce", "ring_all_gather", "ring_reduce_scatter", "ring_all_reduce_alternate")
    return SimpleNamespace(**{name: getattr(backend, name) for name in names})


chunk_index_off_by_one = _target(rs=lambda c, w, r, n, p, g: _rs_chunks(c, w, r, n, p, g, send_shift=0))
last_step_skipped = _target(rs=lambda c, w, r, n, p, g: _rs_chunks(c, w, r, n, p, g, steps=w - 2))
own_chunk_added_twice = _target(rs=_own_twice)
alternate_forwards_partial_sums = _target(alternate="partial")
sends_whole_buffer_each_step = _target(rs="whole")
group_ranks_used_as_global = _target(peers=_group_ranks_as_global)
agrees_on_size_not_shape = _target(agree=_numel_only)
exchanges_unbatched = _target(step=_unbatched_step)
input_returned_at_world_one = _target(alias_at_one=True)
contiguous_inputs_only = _target(flat_view=True)
all_gather_sent_to_every_rank = _target(ag="direct")
mismatch_error_names_nothing = _target(agree=_names_nothing)
backend_collectives_undeclared = _backend_collectives()

_M = "conformance.mutants.ring_collectives:"
_VALUES = "results_equal_torch_distributed_collectives"
_BOUNDS = "messages_and_bytes_per_rank_stay_within_the_ring_bounds"
_EXACT = "messages_and_bytes_per_rank_equal_the_ring_formulas"
_MISMATCH = "mismatched_shapes_across_ranks_are_a_clear_error_on_every_rank"
MUTANTS = (
    Mutant("chunk_index_off_by_one", CAPABILITY, "reduce-scatter sends chunk r - t instead of r - t - 1",
           (_VALUES,), _M + "chunk_index_off_by_one"),
    # one message fewer is within the contract's bounds (fewer is never a fault): the values
    # and the exact extra reject it
    Mutant("last_step_skipped", CAPABILITY, "reduce-scatter stops one step early", (_VALUES, _EXACT),
           _M + "last_step_skipped"),
    Mutant("own_chunk_added_twice", CAPABILITY, "a rank adds its own chunk into its result twice", (_VALUES,),
           _M + "own_chunk_added_twice"),
    Mutant("alternate_forwards_partial_sums", CAPABILITY,
           "the alternate ring passes its running sum on instead of the original tensors", (_VALUES,),
           _M + "alternate_forwards_partial_sums"),
    Mutant("sends_whole_buffer_each_step", CAPABILITY,
           "reduce-scatter sends the whole buffer every step (right sums, W times the bytes)", (_BOUNDS, _EXACT),
           _M + "sends_whole_buffer_each_step"),
    Mutant("group_ranks_used_as_global", CAPABILITY, "peers are group ranks passed where global ranks are due",
           ("subgroups_use_their_own_ring_of_global_ranks",), _M + "group_ranks_used_as_global"),
    # kept: a (2, 3) and a (3, 2) tensor have no sum, so the result it returns is a silent
    # answer where none is defined (its error where the counts differ names a shape and passes)
    Mutant("agrees_on_size_not_shape", CAPABILITY,
           "ranks compare element counts only: equal-size different shapes go through",
           (_MISMATCH,), _M + "agrees_on_size_not_shape"),
    Mutant("mismatch_error_names_nothing", CAPABILITY,
           "mismatched shapes raise a ValueError that names no shape and no size", (_MISMATCH,),
           _M + "mismatch_error_names_nothing"),
    Mutant("all_gather_sent_to_every_rank", CAPABILITY,
           "all-gather sends a rank's chunk straight to every other rank: right values, the ring's count and "
           "bytes, but messages with ranks that are not ring neighbours", (_BOUNDS, _EXACT),
           _M + "all_gather_sent_to_every_rank"),
    Mutant("backend_collectives_undeclared", CAPABILITY,
           "the backend's all_reduce / all_gather instead of a ring, without declaring RING_COLLECTIVES_NOT_POINT_TO_POINT: "
           "right values, no point-to-point message", (_BOUNDS,), _M + "backend_collectives_undeclared"),
    Mutant("input_returned_at_world_one", CAPABILITY,
           "all-gather at W = 1 returns its input (detached), not a new tensor: a caller's later write changes both",
           (_VALUES,), _M + "input_returned_at_world_one"),
    Mutant("contiguous_inputs_only", CAPABILITY, "inputs flattened with view(-1): a transposed or sliced tensor raises",
           ("non_contiguous_inputs_give_the_same_results",), _M + "contiguous_inputs_only"),
    Mutant("exchanges_unbatched", CAPABILITY,
           "each ring step is an unbatched isend then irecv: right on gloo, hangs on NCCL at W = 2",
           ("point_to_point_calls_cannot_hang_on_nccl",), _M + "exchanges_unbatched"),
)
