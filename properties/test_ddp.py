"""Data-parallel laws against ``--target``, for every DDP flavour it offers.

Flavours: ``individual`` (2025 get_ddp_individual_parameters), ``bucketed`` (2025
get_ddp_bucketed), ``ddp2026`` (get_ddp).  With the default target the project's own
naive and flat wrappers are checked too (``conformance.adapters.impl_ddp_wrappers``).  The laws, the random
models and the oracle comparison are described in ``conformance/laws/ddp/``.

Each example runs one case on a live pool of rank processes (gloo on the CPU, world
sizes 1 to 4; NCCL on GPUs, up to the number of GPUs).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from conformance.laws.ddp import laws
from conformance.laws.ddp.cases import ModelSpec, StepPlan, TrainingCase
from conformance.laws.ddp.flavours import FLAVOURS

pytestmark = pytest.mark.distributed

# With the default target, impl's naive and flat wrappers are checked too (2026 names), and
# the bucketed one with its CUDA side stream on (2025 bucketed names): (target, flavour).
OWN_WRAPPERS = {
    "impl-naive": ("conformance.adapters.impl_ddp_wrappers:naive", "ddp2026"),
    "impl-flat": ("conformance.adapters.impl_ddp_wrappers:flat", "ddp2026"),
    "impl-bucketed-side-stream": ("conformance.adapters.impl_ddp_wrappers:bucketed_side_stream", "bucketed"),
}


@pytest.fixture(params=list(FLAVOURS) + list(OWN_WRAPPERS))
def flavour(request):
    return request.param


@pytest.fixture
def subject(flavour, target):
    """(target spec, flavour); skipped as "not offered" when the target lacks the flavour."""
    if flavour in OWN_WRAPPERS:
        if target.spec != "impl":
            pytest.skip(f"{OWN_WRAPPERS[flavour][0]} checks impl's own wrappers; it runs with the default target")
        spec, flavour = OWN_WRAPPERS[flavour]
    else:
        spec = target.spec
    laws.probe(spec, flavour)
    return spec, flavour


def _applicable(law: str, subject) -> None:
    verdict = laws.not_applicable(law, *subject)
    if verdict is not None:
        pytest.skip(verdict.reason)


@given(case=laws.training_cases())
def test_replicas_are_bit_identical_and_match_one_process_on_the_whole_batch(subject, case):
    laws.law_replicas_identical_and_match_single_process(*subject, case)


def test_no_sync_micro_batches_then_a_synced_step_equal_one_step_on_their_concatenation(subject):
    _applicable("no_sync", subject)

    @given(case=laws.no_sync_cases())
    # A tied bias that ends near 3.6e-4 while its gradients' summands were far larger: the final
    # parameter's bound must count those summands (a false alarm in CI before it did).
    @example(case=TrainingCase(
        model=ModelSpec(d_in=6, widths=(8, 1), d_out=4, bias=True, tied=True, frozen=True, branch=True), world_size=2,
        steps=(StepPlan(micro_splits=((1, 2), (5, 5), (5, 5)), branch_p=0.3), StepPlan(micro_splits=((2, 5),), branch_p=0.0)),
        optimizer="sgd", lr=0.01, precision="fp32", bucket_size_mb=1e-06, seed=2069))
    def law(case):
        laws.law_no_sync_accumulation_equals_concatenated_batch(*subject, case)

    law()


def test_buckets_partition_the_trainable_parameters_in_reverse_registration_order_within_the_cap(subject):
    _applicable("layout", subject)

    @given(layout_case=laws.layout_cases())
    def law(layout_case):
        laws.law_buckets_partition_in_reverse_order(*subject, layout_case)

    law()


def test_a_gradient_collective_is_issued_while_backward_still_produces_gradients(subject):
    _applicable("overlap", subject)

    @given(case=laws.overlap_cases())
    def law(case):
        laws.law_collective_overlaps_backward(*subject, case)

    law()
