"""Ring collectives of another design than impl's: equal zero-padded chunks, the ring turning
the other way, parity-ordered unbatched sends.

    --target conformance.selftests.targets.known_good.ring_collectives_padded

    ring_all_reduce, ring_all_gather, ring_reduce_scatter, ring_all_reduce_alternate (tensor, group=None)

Where the capability leaves the choice free, this one chooses otherwise:

- every ``tensor_split(W)`` chunk is zero-padded to c = ceil(S / W) elements in a (W, c)
  buffer, so every message of a phase has the same size (what NCCL-style rings do for
  alignment); the alternate ring passes the whole flat buffer zero-padded to W c elements;
- the ring turns the other way: group rank r sends to r - 1 and receives from r + 1;
- a step is an unbatched ``isend`` and ``irecv``, even group ranks sending first and odd ones
  receiving first, so that two neighbours never both start with a send (safe under NCCL's
  in-order pair streams without ``batch_isend_irecv``);
- the ranks agree on dtype and shape by all-gathering a descriptor from every rank; a
  mismatch is a ValueError naming every rank's element count, or its shape where the counts
  agree ("tensor sizes differ across the ranks of the group: [6, 8] elements").

What torch.distributed's collectives fix still holds: the sum over ranks, ``torch.cat`` along
dim 0, the flattened sum's ``tensor_split(W)[r]``; new tensors, the input never written.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

_DESCRIPTOR_DIMS = 8
# dtype -> a code every process agrees on (str hashes differ between processes)
_DTYPE_CODES = {dtype: i for i, dtype in enumerate((
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool))}


class _Ring:
    """This rank's place in the group's ring: its group rank, the group's size, and the
    global ranks of the neighbour it sends to (r - 1) and the one it receives from (r + 1)."""

    def __init__(self, group):
        self.group = group
        self.members = dist.get_process_group_ranks(group or dist.group.WORLD)  # group rank -> global rank
        self.size = len(self.members)
        self.rank = self.members.index(dist.get_rank())
        self.to = self.members[(self.rank - 1) % self.size]
        self.frm = self.members[(self.rank + 1) % self.size]

    def exchange(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """One step: ``send`` to the next rank of this ring, ``recv`` filled from the other side."""
        if self.rank % 2 == 0:
            reqs = [dist.isend(send, self.to, group=self.group), dist.irecv(recv, self.frm, group=self.group)]
        else:
            reqs = [dist.irecv(recv, self.frm, group=self.group), dist.isend(send, self.to, group=self.group)]
        for req in reqs:
            req.wait()


def _check_agreement(tensor: torch.Tensor, ring: _Ring, name: str) -> None:
    """Every rank's (dtype, shape), all-gathered; a ValueError on every rank if they differ."""
    if tensor.dim() > _DESCRIPTOR_DIMS:
        raise ValueError(f"{name}: at most {_DESCRIPTOR_DIMS} dims, got {tensor.dim()}")
    mine = torch.full((2 + _DESCRIPTOR_DIMS,), -1, dtype=torch.int64, device=tensor.device)
    mine[0] = _DTYPE_CODES.get(tensor.dtype, len(_DTYPE_CODES))
    mine[1] = tensor.dim()
    mine[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(ring.size)]
    dist.all_gather(everyone, mine, group=ring.group)
    if len({int(d[0]) for d in everyone}) > 1:
        raise TypeError(f"{name}: tensor dtypes differ across the ranks of the group (this rank: {tensor.dtype})")
    shapes = [tuple(int(v) for v in d[2:2 + int(d[1])]) for d in everyone]
    counts = [math.prod(s) for s in shapes]
    if len(set(counts)) > 1:
        raise ValueError(f"{name}: tensor sizes differ across the ranks of the group: {counts} elements")
    if len(set(shapes)) > 1:
        raise ValueError(f"{name}: tensor shapes differ across the ranks of the group: {shapes}")


def _padded_chunks(flat: torch.Tensor, world: int):
    """flat's ``tensor_split(world)`` chunks as the rows of a zero-filled (world, c) buffer,
    c = ceil(S / world), and each chunk's true length."""
    lengths = [piece.numel() for piece in flat.tensor_split(world)]
    rows = flat.new_zeros((world, max(lengths)))
    start = 0
    for j, n in enumerate(lengths):
        rows[j, :n] = flat[start:start + n]
        start += n
    return rows, lengths


def _unpadded(rows: torch.Tensor, lengths) -> torch.Tensor:
    return torch.cat([rows[j, :n] for j, n in enumerate(lengths)])


def _reduce_scatter_rows(rows: torch.Tensor, ring: _Ring) -> None:
    """In place: row r ends as the sum over ranks.  Step t sends row r + t + 1 (own first) to
    r - 1 and adds what r + 1 sends, row r + t + 2; after W - 1 steps that is row r."""
    w, r = ring.size, ring.rank
    incoming = torch.empty_like(rows[0])
    for t in range(w - 1):
        ring.exchange(rows[(r + t + 1) % w], incoming)
        rows[(r + t + 2) % w].add_(incoming)


def _all_gather_rows(rows: torch.Tensor, ring: _Ring) -> None:
    """In place: row r is known; step t sends row r + t and receives row r + t + 1."""
    w, r = ring.size, ring.rank
    for t in range(w - 1):
        incoming = torch.empty_like(rows[0])
        ring.exchange(rows[(r + t) % w], incoming)
        rows[(r + t + 1) % w].copy_(incoming)


def ring_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    ring = _Ring(group)
    flat = tensor.detach().reshape(-1)
    if ring.size == 1:
        return flat.clone()
    _check_agreement(tensor, ring, "ring_reduce_scatter")
    rows, lengths = _padded_chunks(flat, ring.size)
    _reduce_scatter_rows(rows, ring)
    return rows[ring.rank, :lengths[ring.rank]].clone()


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    ring = _Ring(group)
    flat = tensor.detach().reshape(-1)
    if ring.size == 1:
        return flat.clone().reshape(tensor.shape)
    _check_agreement(tensor, ring, "ring_all_reduce")
    rows, lengths = _padded_chunks(flat, ring.size)
    _reduce_scatter_rows(rows, ring)
    _all_gather_rows(rows, ring)
    return _unpadded(rows, lengths).reshape(tensor.shape)


def ring_all_gather(tensor: torch.Tensor, group=None) -> torch.Tensor:
    if tensor.dim() == 0:
        raise ValueError("ring_all_gather: a 0-dim tensor has no dim 0 to concatenate along")
    ring = _Ring(group)
    if ring.size == 1:
        return tensor.detach().clone()
    _check_agreement(tensor, ring, "ring_all_gather")
    rows = tensor.new_empty((ring.size, tensor.numel()))  # one rank's tensor a row: equal, no padding
    rows[ring.rank] = tensor.detach().reshape(-1)
    _all_gather_rows(rows, ring)
    return rows.reshape((ring.size * tensor.shape[0],) + tuple(tensor.shape[1:]))


def ring_all_reduce_alternate(tensor: torch.Tensor, group=None) -> torch.Tensor:
    ring = _Ring(group)
    flat = tensor.detach().reshape(-1)
    if ring.size == 1:
        return flat.clone().reshape(tensor.shape)
    _check_agreement(tensor, ring, "ring_all_reduce_alternate")
    s = flat.numel()
    padded = flat.new_zeros(ring.size * -(-s // ring.size))  # W ceil(S / W): at most W - 1 zeros
    padded[:s] = flat
    total, passing = padded.clone(), padded
    for _ in range(ring.size - 1):
        incoming = torch.empty_like(passing)
        ring.exchange(passing, incoming)
        total.add_(incoming)
        passing = incoming  # the original tensor of a rank further along, never a partial sum
    return total[:s].reshape(tensor.shape)
