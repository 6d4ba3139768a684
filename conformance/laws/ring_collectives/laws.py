"""The ring-collective laws, written against the target protocol.

A target offers (every rank of ``group`` calls with its own tensor; group None: the default
group) ``ring_all_reduce``, ``ring_all_gather``, ``ring_reduce_scatter`` and
``ring_all_reduce_alternate`` ``(tensor, group=None) -> new tensor``: the sum over ranks;
``torch.cat`` of every rank's tensor along dim 0; ``sum.flatten().tensor_split(W)[rank]``;
the sum again, by passing every rank's original tensor around the ring.  They must be built
from point-to-point calls looked up on ``torch.distributed`` at call time (that is how the
messages are counted).

Capability "ring collectives".  The contract is the issue's list: results equal
torch.distributed's collectives (exactly for integer values, within the oracle otherwise),
W 1..4 on gloo, any dtype, sizes not divisible by W; messages, peers and bytes per rank
equal the formulas of ``reference`` (with the time model beside them).  Extras: subgroups
(global ranks of the peers), mismatched shapes across ranks as a clear error on every rank,
and calls that cannot hang on NCCL (``conformance.laws.p2p_hang``: gloo buffers what NCCL
makes wait, so CPU ranks alone would pass an exchange that hangs on GPUs).

``check_law`` runs one law; ``rejection(law_name, target_spec, max_examples)`` is the mutant
self-test's runner.
"""

from __future__ import annotations

from dataclasses import replace

from conformance.lawbook import API, CONTRACT, Law, by_name, first_failure_line, mutant_settings, check_examples
from conformance.laws.ring_collectives import checks
from conformance.laws.ring_collectives.strategies import mismatch_cases, ring_cases, subgroup_cases
from conformance.target import load_target

CAPABILITY = "ring collectives"
CONTROL = "impl"
DEFAULT_EXAMPLES = 10

def _strided(case):
    """The case with a non-contiguous input that no view flattens: at least 2 x ... x 2."""
    shape = case.shape if len(case.shape) >= 2 else case.shape + (1,)
    return replace(case, layout="strided", shape=(max(2, shape[0]),) + tuple(shape[1:-1]) + (max(2, shape[-1]),))


LAWS = (
    Law("results_equal_torch_distributed_collectives", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(), check=checks.check_values, needs=("ranks",)),
    Law("messages_and_bytes_per_rank_equal_the_ring_formulas", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(), check=checks.check_messages, needs=("ranks",)),
    Law("subgroups_use_their_own_ring_of_global_ranks", CAPABILITY, API,
        cases=lambda device=None: subgroup_cases(), check=lambda s, c: (checks.check_values(s, c), checks.check_messages(s, c)),
        needs=("3 ranks",), extra="subgroups"),
    Law("point_to_point_calls_cannot_hang_on_nccl", CAPABILITY, API,
        cases=lambda device=None: ring_cases(worlds=(2, 3, 4)), check=checks.check_no_nccl_hang, needs=("ranks",),
        extra="NCCL-safe exchanges"),
    Law("non_contiguous_inputs_give_the_same_results", CAPABILITY, API,
        cases=lambda device=None: ring_cases().map(_strided), check=checks.check_values,
        needs=("ranks",), extra="non-contiguous inputs"),
    Law("mismatched_shapes_across_ranks_are_a_clear_error_on_every_rank", CAPABILITY, API,
        cases=lambda device=None: mismatch_cases(), check=checks.check_mismatch, needs=("2 ranks",),
        extra="mismatched shapes"),
)
LAWS_BY_NAME = by_name(LAWS)


def check_law(law, subject: str, device=None, max_examples: int | None = None, **extra_settings) -> None:
    load_target(subject).factory("ring_all_reduce")  # not offered: say so before any rank starts
    check_examples(law, subject, device=device, max_examples=max_examples, **extra_settings)


MUTANT_SETTINGS = mutant_settings()


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure on ``target_spec``, or None if it passes."""
    return first_failure_line(lambda: check_law(LAWS_BY_NAME[law_name], target_spec, max_examples=max_examples, **MUTANT_SETTINGS))
