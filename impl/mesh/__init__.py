"""A device mesh of named parallel dimensions and the process groups along each.

    layout    ``mesh_groups(sizes, order)``: the pure rank arithmetic (which ranks share a
              group along each dimension)
    mesh      ``ParallelMesh``: this rank's groups, built on torch's ``DeviceMesh`` where
              it works, else on ``torch.distributed.new_group``
"""

from .layout import DEFAULT_ORDER, DIMS, coordinate, mesh_groups, normalise_sizes
from .mesh import ParallelMesh, get_parallel_mesh

__all__ = ["DEFAULT_ORDER", "DIMS", "ParallelMesh", "coordinate", "get_parallel_mesh", "mesh_groups", "normalise_sizes"]
