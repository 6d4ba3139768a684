"""The gradient-scaler laws, written against the target protocol.

A target offers
    ``get_distributed_grad_scaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=2000, group=None)`` -> torch.amp.GradScaler's contract with the
        non-finite check agreed across ``group`` and ``step`` returning whether it
        stepped (impl/amp/grad_scaler.py states it; ``clip_grad_norm_`` for the
        clipping extra);
    ``first_nonfinite_gradient(model, group=None)`` -> the first parameter name whose
        gradient is non-finite on any rank, the same on every rank.

Capability "gradient scaler".  No course handout: the contract tier is torch.amp.GradScaler's
documented contract plus the protocol's two additions (agreement across the group, step's
return value), with impl's DDP wrappers at W = 2 (unscale exactness, skip agreement with
backoff, scaled = unscaled training, growth and its counter, second unscale_, the first
non-finite parameter, two optimizers under one scaler, frozen and unused parameters drawn
into every DDP case); ``checks``' docstring says which source fixes each quantity, and
that none fixes how the ranks agree (no law counts the scaler's collectives).  The extras
run FSDP, clipping to the global norm, no_sync accumulation, and W up to 4.

``rejection(law_name, target_spec, max_examples)`` is the mutant self-test's runner.
"""

from __future__ import annotations


from conformance.harness import resolve_device
from conformance.lawbook import API, CONTRACT, Law, by_name, first_failure_line, mutant_settings, check_examples
from conformance.laws.grad_scaler import checks
from conformance.laws.grad_scaler.strategies import scaler_cases, subgroup_cases

CAPABILITY = "gradient scaler"
CONTROL = "impl"
DDP = ("bucketed", "individual")

LAWS = (
    Law("unscale_gives_the_scaled_gradient_times_the_inverse_scale_exactly", CAPABILITY, CONTRACT,
        cases=lambda device=None: scaler_cases(device), check=checks.check_unscale, needs=("ranks",)),
    Law("nonfinite_on_one_rank_skips_everywhere_keeps_state_and_backs_off", CAPABILITY, CONTRACT,
        cases=lambda device=None: scaler_cases(device, steps=(2, 3), injections=(1, 2), where=("grad", "grad", "input"),
                                               delay_injected_ranks=True),
        check=checks.check_skip, needs=("ranks",)),
    Law("power_of_two_scale_trains_bit_for_bit_like_no_scaling", CAPABILITY, CONTRACT,
        cases=lambda device=None: scaler_cases(device, steps=(2, 4), explicit=(True,)), check=checks.check_parity,
        needs=("ranks",)),
    Law("scale_grows_after_growth_interval_clean_steps_and_overflow_resets_the_count", CAPABILITY, CONTRACT,
        cases=lambda device=None: scaler_cases(device, steps=(5, 8), injections=(1, 2), where=("input", "grad"),
                                               growth=(2, 3), factors=((2.0, 4.0), (0.5, 0.25))),
        check=checks.check_growth, needs=("ranks",)),
    Law("a_second_unscale_before_update_raises", CAPABILITY, CONTRACT,
        cases=lambda device=None: scaler_cases(device, steps=(1, 2), explicit=(True,), second_unscale=True),
        check=checks.check_second_unscale, needs=("ranks",)),
    Law("first_nonfinite_gradient_is_the_same_first_parameter_on_every_rank", CAPABILITY, CONTRACT,
        cases=lambda device=None: scaler_cases(device, steps=(1, 2), injections=(0, 3), find_first=True),
        check=checks.check_first_nonfinite, needs=("ranks",)),
    Law("each_of_two_optimizers_skips_on_its_own_gradients_and_update_backs_off_once", CAPABILITY, CONTRACT,
        cases=lambda device=None: scaler_cases(device, steps=(2, 4), injections=(1, 2), where=("grad",), growth=(1, 2),
                                               explicit=(True, False), two_optimizers=True),
        check=checks.check_each_optimizer, needs=("ranks",)),
    Law("each_group_of_other_ranks_decides_its_own_skip_and_first_nonfinite_gradient", CAPABILITY, CONTRACT,
        cases=lambda device=None: subgroup_cases(), check=checks.check_subgroups, needs=("3 ranks",)),
    Law("fsdp_shard_overflow_on_one_rank_skips_everywhere", CAPABILITY, API,
        cases=lambda device=None: scaler_cases(device, contract=False, wrappers=("fsdp",), steps=(2, 3), injections=(1, 2)),
        check=checks.check_skip, needs=("ranks",), extra="FSDP, W up to 4"),
    Law("clipping_after_unscale_uses_the_global_norm_across_ranks_and_shards", CAPABILITY, API,
        cases=lambda device=None: scaler_cases(device, contract=False, wrappers=("fsdp", "bucketed"), steps=(1, 2),
                                               explicit=(True,), clip_fraction=0.5),
        check=checks.check_clip, needs=("ranks",), extra="clipping to the global norm"),
    Law("no_sync_accumulation_with_scaling_equals_the_big_batch_and_skips_as_one", CAPABILITY, API,
        cases=lambda device=None: scaler_cases(device, contract=False, wrappers=("bucketed",), steps=(1, 1), injections=(0, 1),
                                               where=("input",), explicit=(True,), micro_batches=3),
        check=checks.check_accumulation, needs=("ranks",), extra="gradient accumulation with no_sync"),
)
LAWS_BY_NAME = by_name(LAWS)


def check_law(law: Law, subject: str, device=None, max_examples: int | None = None, **extra_settings) -> None:
    device = resolve_device(device)
    check_examples(law, subject, device=device, max_examples=max_examples, go_on_after_verdicts=True, **extra_settings)


MUTANT_SETTINGS = mutant_settings()
DEFAULT_EXAMPLES = 6


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure on ``target_spec``, or None if it passes
    (``spec:<name>``: one of the fixed spec cases in ``checks.SPEC_CHECKS``)."""
    if law_name.startswith("spec:"):
        return first_failure_line(lambda: checks.SPEC_CHECKS[law_name.removeprefix("spec:")](target_spec))
    return first_failure_line(lambda: check_law(LAWS_BY_NAME[law_name], target_spec, max_examples=max_examples, **MUTANT_SETTINGS))
