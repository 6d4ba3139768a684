"""Checks of the composed-parallelism laws: run on the ranks, compare with the references."""

from __future__ import annotations

from hypothesis import note

from conformance.harness import run_on_ranks
from conformance.oracle import assert_close

from . import rank, reference as ref

REDUCTIONS = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter")
TIMEOUT = 120


def check_mesh(subject, case):
    """Every rank is in exactly one group per dimension; the groups of a dimension
    partition the ranks; the layout is row-major over the order (inner dims neighbouring):
    the protocol's layout, torch's ``init_device_mesh`` layout."""
    sizes = {d: dict(case.sizes).get(d, 1) for d in case.order}
    results = run_on_ranks(rank.mesh_on_rank, case.world, subject, case.sizes, case.order, timeout=TIMEOUT)
    for d in case.order:
        groups = {}
        for r, res in enumerate(results):
            g = res[d]
            if r not in g["ranks"]:
                raise AssertionError(f"rank {r}: not in its own group along {d}: {g['ranks']}")
            if g["group_ranks"] != sorted(g["ranks"]):
                raise AssertionError(f"rank {r}: group along {d} holds ranks {g['group_ranks']} but mesh.ranks says {g['ranks']}")
            if g["size"] != sizes[d] or len(g["ranks"]) != sizes[d]:
                raise AssertionError(f"rank {r}: group along {d} has {len(g['ranks'])} ranks (size {g['size']}), expected {sizes[d]}")
            groups.setdefault(tuple(sorted(g["ranks"])), []).append(r)
        for members, reporters in groups.items():
            if sorted(reporters) != list(members):
                raise AssertionError(f"along {d}: group {list(members)} is claimed by ranks {sorted(reporters)}: groups do not partition the ranks")
        for members in groups:
            idx = sorted(results[r][d]["rank"] for r in members)
            if idx != list(range(len(members))):
                raise AssertionError(f"along {d}: group {list(members)} has mesh.rank values {idx}, expected 0..{len(members) - 1}")
        expected = sorted(tuple(g) for g in ref.layout_groups(sizes, case.order, d))
        if sorted(groups) != expected:
            raise AssertionError(f"along {d} (order {case.order}, sizes {sizes}): groups {sorted(groups)}, expected the row-major layout {expected}")


def _run(subject, case):
    return run_on_ranks(rank.step_on_rank, case.world, subject, case, timeout=TIMEOUT)


def check_parity(subject, case):
    """Loss, gradients and parameters after the step equal one process on the whole batch
    (the protocol's result, within the float64 oracle): how the step gets there is free."""
    results = _run(subject, case)
    loss64, g64, p64 = ref.dense_step(case, ref.F64)
    loss32, g32, p32 = ref.dense_step(case, ref.F32)
    mags = ref.magnitudes(case)
    for r, res in enumerate(results):
        assert_close(f"rank {r}: loss", res["loss"].reshape(()), loss64.reshape(()), loss32.reshape(()))
        for name in g64:
            if name not in res["grads"] or res["grads"][name] is None:
                raise AssertionError(f"rank {r}: gathered gradients lack {name}")
            assert_close(f"rank {r}: gradient of {name}", res["grads"][name], g64[name], g32[name], magnitude=mags[name])
        for name in p64:
            if name not in res["params"]:
                raise AssertionError(f"rank {r}: gathered parameters lack {name}")
            assert_close(f"rank {r}: parameter {name} after the step", res["params"][name], p64[name], p32[name],
                         magnitude=p64[name].abs() + case.lr * mags[name])


def check_collectives(subject, case):
    """Reductions run over the rank's tensor-parallel group, its replica group (dp, or
    dp x cp when the sequence is split; its dp group alone where the target reduces in
    two stages) or its pipeline group only (never a group mixing other coordinates); with
    replicas (dp x cp > 1) something is reduced over them.  An extra: no source fixes
    which collectives a composed step issues; a reduction over the world divided right
    gives the right numbers (parity, the contract) with more traffic."""
    results = _run(subject, case)
    for r, res in enumerate(results):
        groups = res["groups"]
        allowed = {tuple(sorted(groups[d])): d for d in ("tp", "pp", "dp", "cp", "replicas") if len(groups[d]) > 1}
        replica_groups = {d for d in ("replicas",) if len(groups[d]) > 1}
        over = {}
        for name, ranks, numel in res["collectives"]:
            if name not in REDUCTIONS or len(ranks) == 1:
                continue
            if ranks not in allowed:
                raise AssertionError(f"rank {r}: {name} of {numel} element(s) over ranks {list(ranks)}, which is none of its mesh groups {{{', '.join(f'{d}: {list(g)}' for g, d in allowed.items())}}}")
            over[allowed[ranks]] = over.get(allowed[ranks], 0) + numel
        for d in replica_groups:
            if not over.get(d) and not (d == "replicas" and case.size("cp") == 1 and over.get("dp")):
                raise AssertionError(f"rank {r}: {case.size('dp') * case.size('cp')} replicas (dp x cp) but nothing was reduced over them ({groups[d]})")
    check_parity_from(case, results)


def check_parity_from(case, results):
    loss64, _, _ = ref.dense_step(case, ref.F64)
    loss32, _, _ = ref.dense_step(case, ref.F32)
    for r, res in enumerate(results):
        assert_close(f"rank {r}: loss", res["loss"].reshape(()), loss64.reshape(()), loss32.reshape(()))
