"""The distributed-sampler laws, written against the target protocol.

A target offers
    ``get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0,
        drop_last=False)`` -> an iterable of indices with ``set_epoch`` and ``__len__``,
        under torch's DistributedSampler rule (stated in impl/data/sampler.py);
    optionally ``ddp_join(model)`` -> a context manager for uneven inputs around a model
        from impl's ``get_ddp`` (the rule in impl/data/join.py).

Capability "distributed sampler".  No course handout: the contract tier is torch's
DistributedSampler contract as its documentation states it (``checks``' docstring quotes
it): every index covered with padding to equal lengths, len, identical shuffles on every
rank, a new order per epoch, no reordering without shuffling, set_epoch on a kept sampler.
torch's exact partition (strided) and padding (the start of the order again) are a choice
its documentation leaves free: the extra "torch's partition and padding".  Further extras:
the seed, drop_last's dropped tail, argument checks, and uneven inputs (join), run on 2..4
ranks under a watchdog timeout: a hang is a failure with a message, never a stuck suite.

``rejection(law_name, target_spec, max_examples)`` is the mutant self-test's runner.
"""

from __future__ import annotations

import torch

from conformance import oracle
from conformance.harness import require_world_size, resolve_device, run_on_ranks
from conformance.lawbook import API, CONTRACT, Law, by_name, first_failure_line, mutant_settings, check_examples
from conformance.laws.sampler import checks, reference
from conformance.laws.sampler.rank import rank_uneven_training
from conformance.laws.sampler.strategies import MIN_LEN_FOR_REORDER, sampler_cases, uneven_cases

CAPABILITY = "distributed sampler"
CONTROL = "impl"
TORCH_ORDER = "torch's partition and padding"
# A joined rank that stops answering leaves the others in a collective: the watchdog.
# NCCL builds its communicators at the first collective of a pool (seconds on an H100: a
# 15 s watchdog timed out there once, then passed), so the GPU gets more.
JOIN_CASE_TIMEOUT_S = {"cpu": 15.0, "cuda": 90.0}


def check_uneven(subject, case) -> None:
    """Ranks with different numbers of batches finish (no hang within the watchdog) and
    end with identical parameters equal to the rule: step t averages the gradients of the
    ranks still active over the initial world size; joined ranks take the last joiner's."""
    require_world_size(case.world_size)
    results = run_on_ranks(rank_uneven_training, case.world_size, subject, case, timeout=JOIN_CASE_TIMEOUT_S[resolve_device()])
    mags: dict = {}
    ref64 = reference.uneven_rule(case, torch.float64, mags)
    eager = reference.uneven_rule(case, torch.float32)
    for rank, params in enumerate(results):
        for name, value in params.items():
            oracle.assert_bitwise_equal(f"rank {rank} vs rank 0: {name} (batches {case.batches})", value, results[0][name])
            oracle.assert_close(f"rank {rank}: {name} (batches {case.batches})", value, ref64[name], eager[name], value.dtype,
                                mags[name])


LAWS = (
    Law("shares_cover_every_index_and_pad_to_equal_lengths", CAPABILITY, CONTRACT,
        cases=lambda device=None: sampler_cases(), check=checks.check_cover),
    Law("len_is_ceil_n_over_r_or_floor_with_drop_last", CAPABILITY, CONTRACT,
        cases=lambda device=None: sampler_cases(), check=checks.check_len),
    Law("same_seed_and_epoch_repeat_and_the_next_epoch_reorders", CAPABILITY, CONTRACT,
        cases=lambda device=None: sampler_cases(shuffle=(True,), min_len=MIN_LEN_FOR_REORDER), check=checks.check_epochs),
    Law("without_shuffle_the_shares_keep_the_dataset_order_for_every_seed_and_epoch", CAPABILITY, CONTRACT,
        cases=lambda device=None: sampler_cases(shuffle=(False,)), check=checks.check_unshuffled),
    Law("a_sampler_kept_across_epochs_follows_set_epoch", CAPABILITY, CONTRACT,
        cases=lambda device=None: sampler_cases(), check=checks.check_reused_sampler),
    Law("padding_repeats_the_start_of_the_order_as_torch_does", CAPABILITY, API,
        cases=lambda device=None: sampler_cases(), check=checks.check_torch_padding, extra=TORCH_ORDER),
    Law("without_shuffle_rank_r_gets_the_strided_order", CAPABILITY, API,
        cases=lambda device=None: sampler_cases(shuffle=(False,)), check=checks.check_strided, extra=TORCH_ORDER),
    Law("another_seed_gives_another_order", CAPABILITY, API,
        cases=lambda device=None: sampler_cases(shuffle=(True,), min_len=MIN_LEN_FOR_REORDER), check=checks.check_seed,
        extra="the seed"),
    Law("drop_last_drops_another_tail_each_epoch", CAPABILITY, API,
        cases=lambda device=None: sampler_cases(shuffle=(True,), min_len=MIN_LEN_FOR_REORDER, drop_last=(True,),
                                                ragged=True),
        check=checks.check_dropped_tail, extra="drop_last with shuffling"),
    Law("a_rank_outside_0_to_r_is_a_value_error", CAPABILITY, API,
        cases=lambda device=None: sampler_cases(max_len=20), check=checks.check_bad_rank, extra="argument checks"),
    Law("uneven_batches_finish_and_equal_the_join_rule", CAPABILITY, API,
        cases=lambda device=None: uneven_cases(device), check=check_uneven, needs=("ranks",),
        extra="uneven inputs (join)"),
)
LAWS_BY_NAME = by_name(LAWS)
DISTRIBUTED = {law.name for law in LAWS if law.needs}


def check_law(law: Law, subject: str, device=None, max_examples: int | None = None, **extra_settings) -> None:
    device = resolve_device(device)
    check_examples(law, subject, device=device, max_examples=max_examples, go_on_after_verdicts=True, **extra_settings)


MUTANT_SETTINGS = mutant_settings()
DEFAULT_EXAMPLES = 30


def mutant_examples(law_name: str) -> int:
    return 2 if law_name in DISTRIBUTED else 30


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure on ``target_spec``, or None if it passes."""
    return first_failure_line(lambda: check_law(LAWS_BY_NAME[law_name], target_spec, max_examples=max_examples, **MUTANT_SETTINGS))
