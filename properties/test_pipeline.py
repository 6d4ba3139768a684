"""Pipeline parallelism: every law of ``conformance.laws.pipeline.laws`` against ``--target``.

The schedule laws are pure (the target's schedule data played out on simulated ranks);
the parity laws run the target's ``pipeline_train_step`` on 1..4 ranks (gloo on the CPU,
NCCL on GPUs), one of them on a group of some ranks of a world of 3 or 4.  Sources of what
each law compares with: ``conformance/laws/pipeline/checks.py``.  Below them, properties of
our own implementation: the stage partition, and the executor against the plain
micro-batch loop, bit for bit.
"""

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.laws.pipeline import model as models
from conformance.laws.pipeline.laws import LAWS_BY_NAME, check_law
from conformance.laws.pipeline.strategies import PipelineCase
from conformance.profiles import examples

pytestmark = pytest.mark.distributed


def _law(name):
    return LAWS_BY_NAME[name]


def test_every_microbatch_gets_exactly_one_forward_and_one_backward_on_each_stage(target):
    check_law(_law("every_microbatch_gets_one_forward_and_one_backward_per_stage"), target.spec)


def test_forward_runs_before_backward_and_stages_run_in_dependency_order_one_action_at_a_time(target):
    check_law(_law("forward_before_backward_and_stage_order_in_the_simulated_timeline"), target.spec)


def test_schedules_never_deadlock_when_sends_and_receives_are_simulated(target):
    check_law(_law("simulated_sends_and_receives_never_deadlock"), target.spec)


def test_idle_fraction_of_afab_and_1f1b_is_at_most_p_minus_1_over_m_plus_p_minus_1(target):
    check_law(_law("idle_fraction_is_at_most_p_minus_1_over_m_plus_p_minus_1"), target.spec)


def test_1f1b_holds_at_most_p_minus_s_microbatches_on_stage_s_and_afab_holds_all_m(target):
    check_law(_law("in_flight_microbatches_at_most_p_minus_s_under_1f1b_and_m_under_afab"), target.spec)


def test_afab_and_1f1b_gradients_equal_the_dense_model_on_the_whole_batch(target, device):
    check_law(_law("afab_and_1f1b_gradients_equal_the_dense_model"), target.spec, device)


def test_stages_on_a_group_of_other_ranks_match_the_dense_model(target, device):
    # 3 or 4 ranks an example; the spec cases hold three fixed groups
    check_law(_law("stages_on_a_group_of_other_ranks_match_the_dense_model"), target.spec, device, max_examples=examples(4))


def test_afab_and_1f1b_gradients_agree_to_the_bit_where_their_backward_orders_agree(target, device):
    check_law(_law("afab_and_1f1b_gradients_agree_to_the_bit_where_their_backward_orders_agree"), target.spec, device,
              max_examples=examples(4))


def test_gradients_accumulated_over_pipeline_steps_equal_one_step_on_the_whole_batch(target, device):
    check_law(_law("gradient_accumulation_across_steps_equals_one_step_on_the_whole_batch"), target.spec, device, max_examples=examples(6))


def test_float64_stages_send_float64_and_match_the_dense_model_to_float64_precision(target, device):
    check_law(_law("float64_stages_send_float64_and_match_the_dense_model_to_float64_precision"), target.spec, device,
              max_examples=examples(4))


def test_gpt_cut_into_stages_matches_the_dense_gpt_with_ignored_targets(target, device):
    check_law(_law("gpt_stages_match_the_dense_gpt_with_ignored_targets"), target.spec, device, max_examples=examples(6))


def test_a_steps_point_to_point_calls_would_complete_under_nccls_rules(target, device):
    check_law(_law("point_to_point_calls_cannot_hang_on_nccl"), target.spec, device, max_examples=examples(6))


def test_a_pipeline_over_a_group_of_other_ranks_makes_point_to_point_calls_that_complete_under_nccls_rules(target, device):
    check_law(_law("point_to_point_calls_over_a_group_of_other_ranks_cannot_hang_on_nccl"), target.spec, device,
              max_examples=examples(4))


# --- our implementation's own properties -------------------------------------------------


@settings(max_examples=examples(50))
@given(n_layers=st.integers(1, 40), n_stages=st.integers(1, 12))
def test_partition_cuts_consecutive_non_empty_stages_differing_by_at_most_one_layer(n_layers, n_stages):
    from impl.pipeline import partition

    if n_layers < n_stages:
        with pytest.raises(ValueError, match="non-empty"):
            partition(n_layers, n_stages)
        return
    bounds = partition(n_layers, n_stages)
    assert bounds[0][0] == 0 and bounds[-1][1] == n_layers
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


@settings(max_examples=examples(12))
@given(
    name=st.sampled_from(["afab", "1f1b"]),
    m=st.integers(1, 5),
    rows=st.integers(0, 4),
    seed=st.integers(0, 2**20),
    model=st.sampled_from(["mlp", "gpt"]),
)
def test_impl_single_stage_equals_the_plain_microbatch_loop_bit_for_bit(name, m, rows, seed, model):
    """One rank, no process group: the executor does exactly the plain loop's arithmetic
    (backward of loss_m / count for m = 0..M-1), so the gradients agree to the bit."""
    from conformance.laws.pipeline.reference import microbatched
    from impl.pipeline import pipeline_train_step

    case = PipelineCase(world_size=1, model=model, n_layers=4, width=3, batch=m + rows, n_microbatches=m, seed=seed, seq=3)
    layers, inputs, targets, loss_fn, count = models.build(case)
    loss = pipeline_train_step(nn.Sequential(*layers), name, inputs, targets, loss_fn, m, normalizer=count)
    want, want_loss = microbatched(case)
    for pname, grad in models.named_grads(layers).items():
        assert torch.equal(grad, want[pname]), pname
    assert torch.equal(loss.double(), want_loss)


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (lambda: ("zigzag", 2, 4), ValueError, "unknown pipeline schedule"),
        (lambda: ("1f1b", 0, 4), ValueError, "n_stages"),
        (lambda: ("afab", 2, 0), ValueError, "n_microbatches"),
        (lambda: ("afab", 2.0, 3), TypeError, "n_stages"),
    ],
    ids=["unknown name", "no stages", "no micro-batches", "float stages"],
)
def test_bad_schedule_request_is_a_clear_error(bad, error, words):
    from impl.pipeline import schedule

    with pytest.raises(error, match=words):
        schedule(*bad())


def test_more_microbatches_than_rows_is_a_clear_error():
    from impl.pipeline import pipeline_train_step

    with pytest.raises(ValueError, match="micro-batches"):
        pipeline_train_step(nn.Linear(2, 2), "afab", torch.zeros(2, 2), torch.zeros(2, 2), models.sum_squared_error, 3)


@pytest.mark.parametrize("sub, world, expected", [
    ("gloo", "gloo", "world"), ("nccl", "nccl", "world"), ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl", "world"),
    ("gloo", "nccl", "itself"), ("nccl", "gloo", "error"),
])
def test_impl_channels_for_a_subgroup_are_the_subgroup_and_the_world_on_one_backend(monkeypatch, sub, world, expected):
    """impl's two channels for a pipeline over a subgroup (impl.pipeline.executor._channels),
    with torch.distributed stood in for: the subgroup and the world group where both are on
    one backend; a gloo subgroup of another world keeps its one group (gloo buffers); an
    NCCL one is a clear error naming both backends."""
    from types import SimpleNamespace

    from impl.pipeline import executor

    subgroup, world_group = object(), object()
    fake = SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, group=SimpleNamespace(WORLD=world_group),
        get_world_size=lambda g=None: 2 if g is subgroup else 4,
        get_process_group_ranks=lambda g: [1, 2] if g is subgroup else [0, 1, 2, 3],
        get_backend=lambda g=None: sub if g is subgroup else world)
    monkeypatch.setattr(executor, "dist", fake)
    if expected == "error":
        with pytest.raises(RuntimeError, match=f"on {sub}.*world group is on {world}"):
            executor._channels(subgroup)
        return
    acts, grads = executor._channels(subgroup)
    assert acts is subgroup and grads is (world_group if expected == "world" else subgroup)
