"""Deliberately broken compositions on a mesh: the suite must reject every one.

Each mutant is a target (``--target conformance.mutants.composed:tp_gradients_also_reduced``)
offering ``get_parallel_mesh`` and ``composed_train_step`` with one decision of
``impl.composed.Composer`` / ``impl.mesh`` changed.  Each names the laws
(``conformance.laws.composed.laws``) that must reject it.  The model has no tied weights,
so the tied-weight-across-stages bug has no mutant here.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

from conformance.lawbook import Mutant
from impl.composed import Composer
from impl.mesh import ParallelMesh, get_parallel_mesh

CAPABILITY = "composed parallelism"
LAW_MESH = "mesh_groups_partition_the_ranks_once_per_dimension_with_inner_dims_neighbouring"
LAW_PARITY = "composed_step_matches_one_process_on_the_whole_batch"
LAW_COLLECTIVES = "reductions_run_over_the_mesh_groups_and_gradients_over_the_data_parallel_group"
LAW_TOKENS = "loss_is_normalised_once_by_the_global_token_count"
LAW_CP_PP = "context_parallel_chunks_under_pipeline_stages_match_one_process"
LAW_3D = "three_dimensional_pp_dp_tp_step_matches_one_process"


class _TpAlsoReduced(Composer):
    def synchronise(self, module, fsdp, mesh):
        super().synchronise(module, fsdp, mesh)
        if mesh.size("tp") > 1:
            for p in module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=mesh.group("tp"))  # BUG: the TP group is not a replica group


class _LossOverTpTwice(Composer):
    def loss_scale(self, mesh, count):
        return mesh.size("dp") / count / mesh.size("tp")  # BUG: divided by the TP size (again)


class _AverageOverWorld(Composer):
    def reduce_gradients(self, params, mesh):
        if mesh.size("dp") == 1:
            return
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=mesh.group(self.replica_dims(mesh)))
                p.grad.div_(dist.get_world_size())  # BUG: the dp sum divided by the world size


class _ReducedOverWorld(Composer):
    def reduce_gradients(self, params, mesh):
        if mesh.size(self.replica_dims(mesh)) == 1:
            return
        # BUG: one all-reduce over every rank (replicas and shards alike) in place of the dp group
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(dist.get_world_size())


class _PositionsNotOffset(Composer):
    def positions(self, mesh, seq_len, device):
        return torch.arange(seq_len // mesh.size("cp"), device=device)  # BUG: every chunk starts at position 0


class _LocalTokenCount(Composer):
    def token_count(self, targets, local_targets, ignore_index, mesh):
        # BUG: each rank normalises by its own tokens (a mean per rank, then averaged)
        return int((local_targets != ignore_index).sum()) * mesh.size("dp")


_REVERSED: dict = {}


def _reversed_mesh(dims, order=("pp", "dp", "cp", "tp")):
    key = (id(dist.group.WORLD), tuple(sorted(dims.items())), tuple(order))
    if key not in _REVERSED:  # BUG: the outermost dimension gets the neighbouring ranks
        _REVERSED[key] = ParallelMesh(dims, tuple(reversed(tuple(order))), use_device_mesh=False)
    return _REVERSED[key]


def _target(composer=Composer, mesh=get_parallel_mesh):
    def step(model, mesh_, inputs, targets, **kwargs):
        return composer().step(model, mesh_, inputs, targets, **kwargs)

    return SimpleNamespace(get_parallel_mesh=mesh, composed_train_step=step)


tp_gradients_also_reduced = _target(_TpAlsoReduced)
loss_divided_by_tp_twice = _target(_LossOverTpTwice)
dp_average_over_world_size = _target(_AverageOverWorld)
gradients_reduced_over_the_world = _target(_ReducedOverWorld)
loss_normalised_per_rank = _target(_LocalTokenCount)
mesh_order_reversed = _target(mesh=_reversed_mesh)
cp_positions_not_offset = _target(_PositionsNotOffset)


def _m(name, bug, caught_by):
    return Mutant(name, CAPABILITY, bug, caught_by, f"conformance.mutants.composed:{name}")


MUTANTS = (
    _m("tp_gradients_also_reduced", "gradients all-reduced over the tensor-parallel group after the data-parallel reduction", (LAW_PARITY,)),
    _m("loss_divided_by_tp_twice", "the local loss divided by the tensor-parallel size on top of the global token count", (LAW_PARITY,)),
    _m("dp_average_over_world_size", "the data-parallel gradient sum divided by the world size, not the dp size", (LAW_PARITY, LAW_3D)),
    _m("gradients_reduced_over_the_world", "gradients averaged over every rank in place of the data-parallel group "
       "(the extra: reductions over the mesh's groups)", (LAW_COLLECTIVES,)),
    _m("loss_normalised_per_rank", "each data-parallel rank divides by its own token count (mean of means)", (LAW_TOKENS,)),
    _m("cp_positions_not_offset", "under context parallelism every rank embeds its chunk at positions 0..N/cp-1", (LAW_CP_PP,)),
    _m("mesh_order_reversed", "the mesh lays out the outermost dimension on neighbouring ranks", (LAW_MESH,)),
)
