"""The activation-checkpointing laws, written against the target protocol.

A target offers ``get_checkpointed_blocks(blocks, strategy, segment_size=None)`` -> an
``nn.Module`` whose ``forward(x)`` runs x through ``blocks`` in order and returns the last
block's output; its parameters are the blocks' own.  Strategies: "none", "every",
"segments" (k = segment_size blocks per checkpoint, the last shorter), "sqrt" (the best
single level), "nested" (recursive halving, minimum peak).  Composition: a block returning
a tuple passes its first item on; the last block's output comes back whole.

Capability "activation checkpointing".  No CS336 handout covers checkpointing and no course
test exists; torch's ``checkpoint`` contract fixes what a caller sees (the same loss and
gradients, dropout's random numbers redrawn the same), not a figure of memory or
recomputation.  So the contract is: gradients and loss equal to no checkpointing bit for bit
(fp32, CPU, deterministic, dropout included), and what a strategy promises, bounded from the
side that costs the user: the activation peak at most the strategy's bound + slack, the
block forwards at most the strategy's (``reference.bound``: every, segments, sqrt and
nested, N 1..24, k 1..N).  Any correct design conforms: torch's early stop (fewer forwards,
a lower peak), reentrant recomputation, either half of a nested split larger.  A target
that checkpoints less than asked holds more and fails; one that recomputes more fails.

Extras: the exact peak and the exact forwards of the reference plan (impl's: "does more /
less than the reference", never a contract failure), an input that does not require grad,
blocks with buffers and non-tensor outputs, bad requests.

``check_law(law, subject, device=None, max_examples=None, **settings)`` runs one law;
``rejection(law_name, target_spec, max_examples)`` is the mutant self-test's runner.
"""

from __future__ import annotations

from hypothesis import settings

from conformance.lawbook import API, CONTRACT, Law, by_name, first_failure_line, mutant_settings, check_examples
from conformance.laws.checkpointing import checks
from conformance.laws.checkpointing.strategies import bad_requests, stack_cases
from conformance.target import load_target

CAPABILITY = "activation checkpointing"
CONTROL = "impl"
DEFAULT_EXAMPLES = 12

LAWS = (
    Law("gradients_and_loss_equal_no_checkpointing_bit_for_bit", CAPABILITY, CONTRACT,
        cases=lambda device=None: stack_cases(max_n=12), check=checks.check_gradients),
    Law("activation_peak_is_at_most_the_bound", CAPABILITY, CONTRACT,
        cases=lambda device=None: stack_cases(p=(0.25, 0.5)), check=checks.check_peak),
    Law("block_forwards_are_at_most_the_bound", CAPABILITY, CONTRACT,
        cases=lambda device=None: stack_cases(), check=checks.check_forwards),
    Law("activation_peak_equals_the_reference_plans", CAPABILITY, API,
        cases=lambda device=None: stack_cases(p=(0.25, 0.5)), check=checks.check_exact_peak,
        extra="exact peak of the reference plan"),
    Law("block_forwards_equal_the_reference_plans", CAPABILITY, API,
        cases=lambda device=None: stack_cases(), check=checks.check_exact_forwards,
        extra="exact recomputation of the reference plan"),
    Law("input_without_grad_still_gives_parameter_gradients", CAPABILITY, API,
        cases=lambda device=None: stack_cases(max_n=8), check=checks.check_input_without_grad,
        extra="inputs that do not require grad"),
    Law("blocks_with_buffers_and_non_tensor_outputs_match_the_plain_stack", CAPABILITY, API,
        cases=lambda device=None: stack_cases(max_n=8), check=checks.check_buffers_and_tuples,
        extra="buffers and non-tensor outputs"),
    Law("bad_strategy_or_segment_size_is_a_clear_error", CAPABILITY, API,
        cases=lambda device=None: bad_requests(), check=checks.check_bad_request, extra="bad requests"),
)
LAWS_BY_NAME = by_name(LAWS)


def check_law(law: Law, subject: str, device=None, max_examples: int | None = None, **extra_settings) -> None:
    load_target(subject).factory(checks.ENTRY)  # not offered: say so before any example runs
    check_examples(law, subject, device=device, max_examples=max_examples, **extra_settings)


MUTANT_SETTINGS = mutant_settings()


# Fixed spec cases a kept mutant may name as "spec:<name>".
SPEC_CHECKS = {"exact_peak_at_perfect_squares": checks.check_exact_peak_at_perfect_squares}


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure on ``target_spec``, or None if it passes."""
    if law_name.startswith("spec:"):
        return first_failure_line(lambda: SPEC_CHECKS[law_name.removeprefix("spec:")](target_spec))
    return first_failure_line(lambda: check_law(LAWS_BY_NAME[law_name], target_spec, max_examples=max_examples, **MUTANT_SETTINGS))
