"""The DDP gradient law must not fail a correct DDP.

Splitting a batch over ranks reassociates every weight-gradient sum.  The whole-batch
eager error alone was the yardstick once, and at W = 3 with uneven rank batches a correct
DDP (impl's and torch's) missed 4 x that error by 1.2x on a 1 x 4 weight (found by
mutation testing).  The law now also measures the rank-split eager gradient's error
(``reference.split_eager_gradients``) and judges against the larger of the two.
"""

from __future__ import annotations

from conformance.harness import require_world_size
from conformance.laws.ddp import laws
from conformance.laws.ddp.cases import ModelSpec, StepPlan, TrainingCase

UNEVEN_W3 = TrainingCase(
    model=ModelSpec(d_in=4, widths=(1, 4), d_out=2, bias=False, tied=True, frozen=False, branch=True), world_size=3,
    steps=(StepPlan(micro_splits=((1, 1, 4),), branch_p=0.0), StepPlan(micro_splits=((4, 1, 4),), branch_p=0.0),
           StepPlan(micro_splits=((1, 2, 5),), branch_p=0.0)),
    optimizer="sgd", lr=0.05, precision="fp32", bucket_size_mb=1e-06, seed=0)


def test_a_correct_ddp_passes_the_gradient_law_at_three_ranks_with_uneven_batches():
    require_world_size(3, "cpu")
    laws.law_replicas_identical_and_match_single_process("impl", "bucketed", UNEVEN_W3)
