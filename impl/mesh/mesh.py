"""This rank's process groups over a mesh of named parallel dimensions.

Contract
    ``get_parallel_mesh(dims, order=("pp", "dp", "cp", "tp"))`` -> ``ParallelMesh``, called
    on every rank of the default group at once (group creation is collective).  ``dims``
    maps dimension names (pp, dp, cp, tp) to sizes whose product is the world size; a
    name left out has size 1.  Rank layout: ``impl.mesh.layout`` (row-major over
    ``order``; the last dimension's groups are consecutive ranks).

    ``mesh.size(d)``, ``mesh.rank(d)`` (this rank's index along d), ``mesh.group(d)`` (a
    ``torch.distributed`` process group: this rank's group along d; ``d`` may also be a
    tuple of names for a group along several dimensions, e.g. ("dp", "cp")),
    ``mesh.ranks(d)`` (the global ranks of that group, sorted), ``mesh.sizes``,
    ``mesh.order``, ``mesh.device_mesh`` (torch's ``DeviceMesh`` or None).

    Groups along one dimension come from torch's ``DeviceMesh`` (``init_device_mesh``)
    when it can be built for the current backend; otherwise, and for groups along several
    dimensions, every rank creates every group of the dimension with
    ``torch.distributed.new_group`` in the same order.  A pp dimension of size > 1 also
    gets two channel groups per pipeline (``impl.pipeline.executor.register_channels``).
    Meshes are cached per (default
    group, sizes, order): asking again returns the same groups and creates none.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .layout import DEFAULT_ORDER, coordinate, mesh_groups, normalise_sizes

_CACHE: dict = {}


class ParallelMesh:
    def __init__(self, sizes: dict, order=DEFAULT_ORDER, use_device_mesh: bool = True):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ParallelMesh needs an initialised default torch.distributed process group")
        self.world_size, self.global_rank = dist.get_world_size(), dist.get_rank()
        self.sizes, self.order = normalise_sizes(sizes, order, self.world_size)
        self.coordinate = coordinate(self.global_rank, self.sizes, self.order)
        self._groups: dict[tuple, object] = {}
        self.device_mesh = self._device_mesh() if use_device_mesh else None
        for d in self.order:
            self._build((d,))
        self._pipeline_channels()

    def _pipeline_channels(self) -> None:
        """Two more groups per pipeline group, for activations and gradients
        (``impl.pipeline.executor``: one NCCL group would deadlock 1F1B), created here by
        every rank for every pipeline in the same order, as ``new_group`` requires."""
        if self.sizes.get("pp", 1) < 2:
            return
        from impl.pipeline.executor import register_channels

        mine = None
        for ranks in mesh_groups(self.sizes, self.order, ("pp",)):
            channels = dist.new_group(ranks), dist.new_group(ranks)
            if self.global_rank in ranks:
                mine = channels
        register_channels(self._groups[("pp",)], *mine)

    def _device_mesh(self):
        try:
            from torch.distributed.device_mesh import init_device_mesh

            backend = dist.get_backend()
            device_type = "cuda" if backend == "nccl" else "cpu"
            shape = tuple(self.sizes[d] for d in self.order)
            mesh = init_device_mesh(device_type, shape, mesh_dim_names=self.order)
        except Exception:  # noqa: BLE001 - any failure: fall back to plain new_group
            return None
        for d in self.order:
            group = mesh.get_group(d)
            if sorted(dist.get_process_group_ranks(group)) != self._own_ranks((d,)):
                return None  # a layout other than ours: do not use it
            self._groups[(d,)] = group
        return mesh

    def _key(self, dims) -> tuple:
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        unknown = [d for d in dims if d not in self.order]
        if unknown or not dims:
            raise ValueError(f"mesh has dimensions {self.order}, asked for {dims}")
        return tuple(d for d in self.order if d in dims)  # canonical: mesh order

    def _own_ranks(self, key) -> list[int]:
        for ranks in mesh_groups(self.sizes, self.order, key):
            if self.global_rank in ranks:
                return ranks
        raise AssertionError("rank in no group")  # unreachable: the groups partition the ranks

    def _build(self, key) -> None:
        if key in self._groups:
            return
        mine = None
        for ranks in mesh_groups(self.sizes, self.order, key):  # every rank creates every group, same order
            g = dist.new_group(ranks)
            if self.global_rank in ranks:
                mine = g
        self._groups[key] = mine

    def group(self, dims):
        key = self._key(dims)
        self._build(key)
        return self._groups[key]

    def size(self, dims) -> int:
        n = 1
        for d in self._key(dims):
            n *= self.sizes[d]
        return n

    def rank(self, dims) -> int:
        """Index of this rank inside its group along ``dims`` (row-major over them)."""
        r = 0
        for d in self._key(dims):
            r = r * self.sizes[d] + self.coordinate[d]
        return r

    def ranks(self, dims) -> list[int]:
        return self._own_ranks(self._key(dims))

    def __repr__(self) -> str:
        shape = " x ".join(f"{d}={self.sizes[d]}" for d in self.order)
        return f"ParallelMesh({shape}; rank {self.global_rank} at {self.coordinate})"


def get_parallel_mesh(dims: dict, order=DEFAULT_ORDER) -> ParallelMesh:
    """The mesh of ``dims`` over the default group (cached; collective on first call)."""
    sizes, order = normalise_sizes(dims, order, dist.get_world_size() if dist.is_initialized() else None)
    key = (id(dist.group.WORLD), tuple(sorted(sizes.items())), order)
    if key not in _CACHE:
        _CACHE[key] = ParallelMesh(sizes, order)
    return _CACHE[key]
