"""Composed parallelism: fixed spec cases against ``--target`` (the main job).

Contract first (the protocol's, ``conformance/target.py``; no course handout): a 2 x 2
mesh's groups in the protocol's row-major layout (torch's ``init_device_mesh`` layout); DP x
TP, FSDP x TP, DP x PP and TP x CP steps on 4 ranks against one process on the whole batch.
No spec case counts collectives.  Then wider cases: ignored targets with
uneven token counts across data-parallel ranks, CP under pipeline stages, and the 3-D
mesh PP x DP x TP on 8 ranks.
"""

import pytest

from conformance.laws.composed import checks
from conformance.laws.composed.strategies import ComposedCase, MeshCase

pytestmark = pytest.mark.distributed


def _case(sizes, dp_kind="ddp", n_layers=2, **kw):
    base = dict(data_parallel=dp_kind, n_layers=n_layers, n_heads=2, head_dim=4, d_ff=8, vocab_size=11,
                batch=4, seq=4, n_microbatches=2, ignore_fraction=0.0, seed=7)
    base.update(kw)
    return ComposedCase(sizes=tuple(sizes), **base)


def test_contract_a_dp_2_by_tp_2_mesh_has_the_documented_groups(target):
    checks.check_mesh(target.spec, MeshCase((("dp", 2), ("tp", 2)), ("pp", "dp", "cp", "tp")))


@pytest.mark.parametrize("sizes, dp_kind", [
    pytest.param((("dp", 2), ("tp", 2)), "ddp", id="dp2_tp2"),
    pytest.param((("dp", 2), ("tp", 2)), "fsdp", id="fsdp2_tp2"),
    pytest.param((("pp", 2), ("dp", 2)), "ddp", id="pp2_dp2"),
    pytest.param((("cp", 2), ("tp", 2)), "ddp", id="cp2_tp2"),
])
def test_contract_composed_step_on_four_ranks_matches_one_process(target, sizes, dp_kind):
    checks.check_parity(target.spec, _case(sizes, dp_kind))


def test_ignored_targets_uneven_across_data_parallel_ranks_normalise_by_the_global_count(target):
    checks.check_parity(target.spec, _case((("dp", 2), ("tp", 2)), ignore_fraction=0.6))


def test_context_parallel_chunks_under_two_pipeline_stages_match_one_process(target):
    checks.check_parity(target.spec, _case((("pp", 2), ("cp", 2))))


def test_three_dimensional_pp_dp_tp_mesh_on_eight_ranks_matches_one_process(target):
    checks.check_parity(target.spec, _case((("pp", 2), ("dp", 2), ("tp", 2)), n_layers=2))
