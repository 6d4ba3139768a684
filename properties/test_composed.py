"""Composed parallelism: every law of ``conformance.laws.composed.laws`` against ``--target``,
then properties of our own mesh arithmetic (pure).

The step laws run the target's ``composed_train_step`` on 2 to 4 gloo ranks (the 3-D law on
8, the CPU harness's limit: ``conformance.harness.MAX_CPU_WORLD_SIZE``; the 4-D mesh
2 x 2 x 2 x 2 needs 16 and is not run here).
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.laws.composed.laws import LAWS_BY_NAME, check_law
from conformance.laws.composed.reference import layout_groups
from conformance.laws.composed.strategies import mesh_cases
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


def _law(name):
    return LAWS_BY_NAME[name]


def test_contract_every_rank_is_in_one_group_per_dimension_and_inner_dimensions_are_neighbouring_ranks(target):
    check_law(_law("mesh_groups_partition_the_ranks_once_per_dimension_with_inner_dims_neighbouring"), target.spec, max_examples=examples(6))


def test_contract_a_composed_step_gives_the_loss_gradients_and_parameters_of_one_process_on_the_whole_batch(target, device):
    check_law(_law("composed_step_matches_one_process_on_the_whole_batch"), target.spec, device, max_examples=examples(6))


def test_reductions_run_over_mesh_groups_only_and_gradients_over_the_data_parallel_group(target, device):
    check_law(_law("reductions_run_over_the_mesh_groups_and_gradients_over_the_data_parallel_group"), target.spec, device, max_examples=examples(4))


def test_the_loss_is_normalised_once_by_the_global_token_count_when_ranks_hold_uneven_tokens(target, device):
    check_law(_law("loss_is_normalised_once_by_the_global_token_count"), target.spec, device, max_examples=examples(4))


def test_context_parallel_chunks_under_pipeline_stages_and_data_parallelism_match_one_process(target, device):
    check_law(_law("context_parallel_chunks_under_pipeline_stages_match_one_process"), target.spec, device, max_examples=examples(4))


def test_a_three_dimensional_pp_dp_tp_step_on_eight_ranks_matches_one_process(target, device):
    check_law(_law("three_dimensional_pp_dp_tp_step_matches_one_process"), target.spec, device, max_examples=examples(1))


# --- our implementation's own properties (pure) -------------------------------------------


@settings(max_examples=examples(50), deadline=None)
@given(case=mesh_cases(max_world=16))
def test_impl_mesh_groups_partition_the_ranks_and_match_the_row_major_layout(case):
    from impl.mesh import mesh_groups

    sizes = dict(case.sizes)
    world = math.prod(sizes.values())
    for d in case.order:
        groups = mesh_groups(sizes, case.order, d)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(world)), f"groups along {d} do not partition the ranks: {groups}"
        assert all(len(g) == sizes[d] for g in groups)
        assert sorted(groups) == sorted(layout_groups(sizes, case.order, d))
    inner = case.order[-1]
    for g in mesh_groups(sizes, case.order, inner):
        assert g == list(range(g[0], g[0] + len(g))), f"inner dimension {inner}: group {g} is not consecutive ranks"


@settings(max_examples=examples(30), deadline=None)
@given(case=mesh_cases(max_world=16), data=st.data())
def test_impl_groups_over_two_dimensions_are_unions_of_groups_over_one(case, data):
    from impl.mesh import mesh_groups

    sizes = dict(case.sizes)
    a, b = data.draw(st.permutations(case.order))[:2]
    for g in mesh_groups(sizes, case.order, (a, b)):
        for r in g:
            for d in (a, b):
                (own,) = [h for h in mesh_groups(sizes, case.order, d) if r in h]
                assert set(own) <= set(g), f"group over ({a}, {b}) {g} lacks part of {d}-group {own}"
