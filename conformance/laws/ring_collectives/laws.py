"""The ring-collective laws, written against the target protocol.

A target offers (every rank of ``group`` calls with its own tensor; group None: the default
group) ``ring_all_reduce``, ``ring_all_gather``, ``ring_reduce_scatter`` and
``ring_all_reduce_alternate`` ``(tensor, group=None) -> new tensor``: the sum over ranks;
``torch.cat`` of every rank's tensor along dim 0; ``sum.flatten().tensor_split(W)[rank]``;
the sum again, by passing every rank's original tensor around the ring.  They must be built
from point-to-point calls looked up on ``torch.distributed`` at call time (that is how the
messages are counted).

Capability "ring collectives".  No course handout covers it; the sources are the issue
that asked for it (ring collectives from point-to-point calls: all-reduce, all-gather,
reduce-scatter and the alternate ring, W 1..4 on gloo, any dtype, sizes W does not divide
split by ``tensor_split``, with the ring's time model) and torch.distributed's collective
semantics (what each returns, on the default group or any subgroup).  Each law says which
fixes what it pins.

Contract:
- ``results_equal_torch_distributed_collectives``: the values torch.distributed's
  collectives give (their semantics; exactly for integer values and gathers, within the
  float64 oracle for floating sums, whose order of addition no source fixes); a new tensor,
  the input unwritten (the protocol's signatures above: ``-> new tensor``).
- ``messages_and_bytes_per_rank_stay_within_the_ring_bounds``: bounds from the user's side.
  Contract, because the issue asks for *ring* collectives built from point-to-point calls:
  the data moves in point-to-point messages (a rank whose result holds other ranks' data
  received some), and a rank exchanges them with its two ring neighbours only (the ring is
  the group's rank order, as torch numbers a group; which way it turns is the target's
  choice).  At most W - 1 sends and W - 1 receives a phase (the ring's steps) and at most
  the formula's bytes plus W - 1 elements of padding a message (the ring's volume, the
  issue's time model; where the chunks are cut and whether they are padded no source
  fixes).  Fewer is never a fault.

Extras:
- ``messages_and_bytes_per_rank_equal_the_ring_formulas`` ("exact ring formulas"): impl's
  figures exactly (``reference``): sends to r + 1, receives from r - 1, one ``tensor_split``
  chunk a message, 2 (W - 1) or W - 1 of them.  No source fixes these.
- ``subgroups_use_their_own_ring_of_global_ranks``: values and the contract's bounds on a
  subgroup whose group ranks differ from its members' global ranks (torch.distributed's
  group semantics: ``dist.get_global_rank``).
- ``point_to_point_calls_cannot_hang_on_nccl`` (``conformance.laws.p2p_hang``: gloo buffers
  what NCCL makes wait, so CPU ranks alone would pass an exchange that hangs on GPUs; NCCL's
  ordering as measured there fixes it).
- ``non_contiguous_inputs_give_the_same_results``: no source fixes it (torch's own
  collectives ask for contiguous tensors); a caller's transposed tensor is ordinary input.
- ``mismatched_shapes_across_ranks_are_a_clear_error_on_every_rank``: torch.distributed
  leaves mismatched shapes undefined; the suite asks for an error on every rank that names
  the sizes that differ in any unit (shapes, elements, bytes), never our wording.

The message laws read "not applicable" on a target that declares its collectives are not
point-to-point rings (``checks.NOT_POINT_TO_POINT``) and sends no message.

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


def _values_and_bounds(subject, case):
    """Values, then the contract's message bounds (on a subgroup: peers as global ranks)."""
    checks.check_values(subject, case)
    checks.check_message_bounds(subject, case)


LAWS = (
    Law("results_equal_torch_distributed_collectives", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(), check=checks.check_values, needs=("ranks",)),
    Law("messages_and_bytes_per_rank_stay_within_the_ring_bounds", CAPABILITY, CONTRACT,
        cases=lambda device=None: ring_cases(), check=checks.check_message_bounds, needs=("ranks",)),
    Law("messages_and_bytes_per_rank_equal_the_ring_formulas", CAPABILITY, API,
        cases=lambda device=None: ring_cases(), check=checks.check_messages_exactly, needs=("ranks",),
        extra="exact ring formulas"),
    Law("subgroups_use_their_own_ring_of_global_ranks", CAPABILITY, API,
        cases=lambda device=None: subgroup_cases(), check=_values_and_bounds, needs=("3 ranks",), extra="subgroups"),
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
