"""The capability table: which capability (and tier) every check belongs to.

A check is a test; its node id is ``path/to/module.py::test_name[param-id]``.  The module's
dotted name is looked up in ``MODULES``, explicitly; the entry says how the capability
follows from the test's name and parameter id (the attention flavour and law, the DDP
flavour).  A test module that is not in the table is a collection error
(``check_collected``), so moving or renaming a file can never silently move a check to
another row of a report: the table has to be edited with it.

Self-checks (``SELF``) check the suite or ``impl``'s internals, not the target: they run
with the tests and never appear in a target's report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

SELF = "self-check"

BACKWARD_LAWS = ("gradients", "gradcheck", "backward")
_ATTENTION_FLAVOUR = re.compile(r"(pytorch|triton|gluon)(?:-|$)")
_DDP_FLAVOUR = re.compile(r"(individual|bucketed|ddp2026)(?:-|$)")


@dataclass(frozen=True)
class Check:
    """What the table knows of one test from its node id."""

    module: str  # dotted module name
    func: str  # test function name
    params: str  # the parametrization id, "" if none


def parse_nodeid(nodeid: str) -> Check:
    path, _, rest = nodeid.partition("::")
    name = rest.split("::")[-1]
    func, _, params = name.partition("[")
    module = path.removesuffix(".py").replace("/", ".").replace("\\", ".")
    return Check(module, func, params.removesuffix("]"))


# --- rules: (check) -> capability ----------------------------------------------------------


def fixed(capability: str, self_checks: tuple[str, ...] = ()) -> Callable[[Check], str]:
    """One capability for the module; the named test functions are self-checks."""
    return lambda c: SELF if c.func in self_checks else capability


def attention(c: Check, default_flavour: str = "pytorch") -> str:
    """``attention <flavour> <part>``: the flavour leads the parameter id; the part is
    causal, backward or forward by the law's name."""
    m = _ATTENTION_FLAVOUR.match(c.params)
    if m:
        flavour, law = m.group(1), c.params[m.end():]
    else:
        flavour, law = ("triton" if "triton" in c.func or "triton" in c.module else default_flavour), c.params
    law = law or c.func
    if "causal" in law and "non" not in law:
        part = "causal"
    elif any(word in law for word in BACKWARD_LAWS):
        part = "backward"
    else:
        part = "forward"
    return f"attention {flavour} {part}"


def ddp(c: Check) -> str:
    """``DDP <flavour>``: the flavour leads the parameter id; ``impl-<wrapper>`` ids check
    impl's own wrappers (self-checks)."""
    if c.params.startswith("impl-"):
        return SELF
    m = _DDP_FLAVOUR.match(c.params)
    return f"DDP {m.group(1)}" if m else "DDP"


# --- tiers: (check) -> (tier, extra) --------------------------------------------------------

CONTRACT, API = "contract", "api"  # as conformance.lawbook names them


def tier_by_name(c: Check) -> tuple[str, str]:
    """The contract tier for ``test_contract_*`` and ``test_cs336_*`` tests; every other test
    is an extra of the wider API, named by its law or case (the parameter id, less a leading
    flavour) or else its function name."""
    if c.func.startswith(("test_contract", "test_cs336")):
        return CONTRACT, ""
    params = _ATTENTION_FLAVOUR.sub("", c.params, count=1) if _ATTENTION_FLAVOUR.match(c.params) else c.params
    params = _DDP_FLAVOUR.sub("", params, count=1) if _DDP_FLAVOUR.match(params) else params
    name = params or c.func.removeprefix("test_").removeprefix("api_")
    return API, name.replace("_", " ").strip(" -")


def contract_except(**extras: str) -> Callable[[Check], tuple[str, str]]:
    """Every test of the module is a contract check except the named ones: function name ->
    the extra it checks (for capabilities whose contract is ours, not a course's)."""
    return lambda c: (API, extras[c.func]) if c.func in extras else (CONTRACT, "")


# Modules whose tiers do not follow from their test names (``tier_by_name``).
TIERS: dict[str, Callable[[Check], tuple[str, str]]] = {
    # no course handout for context parallelism: the list is the contract, each count
    # bounded from the user's side; Ring Attention's exact exchanges and zigzag's half blocks
    # are extras (conformance/laws/context_parallel/checks.py names each source)
    "conformance.spec.test_context_parallel": contract_except(
        test_point_to_point_calls_on_two_ranks_cannot_hang_on_nccl="NCCL-safe exchanges",
        test_ring_attention_sends_w_minus_1_key_value_blocks_to_its_ring_neighbours_on_four_ranks="Ring Attention's exchanges",
        test_mismatched_shards_and_an_odd_zigzag_shard_are_clear_errors="clear errors for bad shards"),
    "properties.test_context_parallel": contract_except(
        test_ring_matches_full_attention_in_fp16_and_bf16="fp16 / bf16",
        test_point_to_point_calls_cannot_hang_on_nccl="NCCL-safe exchanges",
        test_the_forward_passes_w_minus_1_key_value_blocks_around_the_ring="Ring Attention's exchanges",
        test_causal_chunk_blocks_above_the_diagonal_are_never_computed="zigzag half blocks skipped"),
    # no course handout for tensor parallelism: the layers are the contract; sequence
    # parallelism is an extra
    "conformance.spec.test_tensor_parallel": contract_except(
        test_sequence_parallel_block_at_2_ranks="sequence parallelism",
        test_sequence_parallel_block_collectives_at_2_ranks="sequence parallelism collectives",
        # Megatron-LM fixes the kinds; the contract is its count as a bound (the test beside it)
        test_mlp_and_block_all_reduce_exactly_as_megatron_at_2_ranks="exactly Megatron's all-reduces",
    ),
    "properties.test_tensor_parallel": contract_except(
        test_sequence_parallel_block_output_and_gradients_equal_the_dense_block="sequence parallelism",
        test_sequence_parallel_block_all_gathers_and_reduce_scatters_instead_of_all_reducing="sequence parallelism collectives",
        test_sequence_parallel_gpt_matches_the_dense_model_over_optimizer_steps="sequence-parallel GPT",
        test_mlp_does_exactly_one_all_reduce_forward_and_one_backward_and_the_block_two="exactly Megatron's all-reduces",
    ),
    "conformance.spec.test_pipeline": contract_except(
        test_gradient_accumulation_over_two_steps_matches_one_dense_step="gradient accumulation",
        test_afab_and_1f1b_agree_to_the_bit_at_2_ranks="AFAB and 1F1B bit-identical",
        test_point_to_point_calls_cannot_hang_on_nccl="NCCL-safe exchanges",  # an extra, as the law is
        test_point_to_point_calls_over_a_group_of_other_ranks_cannot_hang_on_nccl="NCCL-safe exchanges on a group of other ranks",
    ),
    "properties.test_pipeline": contract_except(
        test_gradients_accumulated_over_pipeline_steps_equal_one_step_on_the_whole_batch="gradient accumulation",
        test_gpt_cut_into_stages_matches_the_dense_gpt_with_ignored_targets="GPT stages with ignored targets",
        test_float64_stages_send_float64_and_match_the_dense_model_to_float64_precision="float64 stages",
        test_a_steps_point_to_point_calls_would_complete_under_nccls_rules="NCCL-safe exchanges",
        test_a_pipeline_over_a_group_of_other_ranks_makes_point_to_point_calls_that_complete_under_nccls_rules=(
            "NCCL-safe exchanges on a group of other ranks"),
        test_afab_and_1f1b_gradients_agree_to_the_bit_where_their_backward_orders_agree="AFAB and 1F1B bit-identical",
    ),
}


def tier_of_nodeid(nodeid: str) -> tuple[str, str]:
    c = parse_nodeid(nodeid)
    return TIERS[c.module](c) if c.module in TIERS else tier_by_name(c)


# --- the table -----------------------------------------------------------------------------

MODULES: dict[str, Callable[[Check], str]] = {
    # spec cases: the main job (python -m conformance)
    "conformance.spec.test_attention": attention,
    "conformance.spec.test_ddp": ddp,
    "conformance.spec.test_sharded_optimizer": fixed("sharded optimizer"),
    # properties
    "properties.test_attention": lambda c: SELF if c.func == "test_bf16_is_checked_where_it_can_run" else attention(c),
    # impl's own Triton tile configurations and their patched-helper mutants: no target has them
    "properties.test_triton_configs": fixed(SELF),
    # impl's launch path for host tensor descriptors (the Gluon flavour's): no target has it
    "properties.test_tma_launch": fixed(SELF),
    "properties.test_gluon_host_plans": fixed(SELF),
    # impl's Gluon kernels compiled for sm_90a on any machine: no target has them
    "properties.test_gluon_kernels_compile": fixed(SELF),
    "properties.test_call_graphs": fixed(SELF),
    "properties.test_ddp": ddp,
    "properties.test_sharded_optimizer": fixed(
        "sharded optimizer",
        self_checks=(
            "test_impl_sync_variant_obeys_law",
            "test_greedy_assignment_load_is_at_most_mean_plus_largest",
            "test_greedy_assignment_depends_only_on_sizes",
            "test_rounds_cover_each_owned_parameter_once_in_order",
            "test_world_size_one_runs_without_a_process_group",
            "test_bad_construction_is_a_clear_error",
            "test_ranks_that_disagree_all_raise_instead_of_hanging",
            "test_mixed_parameter_dtypes_match_unsharded",
        ),
    ),
    # capabilities beyond the two course releases' attention and DDP
    "properties.test_fsdp": fixed("FSDP"),
    "conformance.spec.test_fsdp": fixed("FSDP"),
    "properties.test_context_parallel": fixed("context parallel"),
    "conformance.spec.test_context_parallel": fixed("context parallel"),
    "properties.test_tensor_parallel": fixed("tensor parallel"),
    "conformance.spec.test_tensor_parallel": fixed("tensor parallel"),
    "properties.test_pipeline": fixed(
        "pipeline parallel",
        self_checks=(
            "test_partition_cuts_consecutive_non_empty_stages_differing_by_at_most_one_layer",
            "test_impl_single_stage_equals_the_plain_microbatch_loop_bit_for_bit",
            "test_bad_schedule_request_is_a_clear_error",
            "test_more_microbatches_than_rows_is_a_clear_error",
            "test_impl_channels_for_a_subgroup_are_the_subgroup_and_the_world_on_one_backend",
        ),
    ),
    "conformance.spec.test_pipeline": fixed("pipeline parallel"),
    "properties.test_checkpointing": fixed("activation checkpointing"),
    "conformance.spec.test_checkpointing": fixed("activation checkpointing"),
    "properties.test_ring_collectives": fixed("ring collectives"),
    "conformance.spec.test_ring_collectives": fixed("ring collectives"),
    "properties.test_grad_scaler": fixed("gradient scaler"),
    "conformance.spec.test_grad_scaler": fixed("gradient scaler"),
    "properties.test_sampler": fixed("distributed sampler"),
    "conformance.spec.test_sampler": fixed("distributed sampler"),
    "properties.test_composed": fixed("composed parallelism"),
    "conformance.spec.test_composed": fixed("composed parallelism"),
    # facts about torch and impl's model in low precision (no target offers them)
    "properties.test_precision_facts": fixed(SELF),
}

# Which test modules check each capability of the protocol (conformance.target.CAPABILITY_FACTORIES):
# a capability with none reads "no checks yet" in every report.
FAMILY_MODULES = {
    "attention pytorch": ("conformance.spec.test_attention", "properties.test_attention"),
    "attention triton": ("conformance.spec.test_attention", "properties.test_attention"),
    "attention gluon": ("conformance.spec.test_attention", "properties.test_attention"),
    "DDP individual": ("conformance.spec.test_ddp", "properties.test_ddp"),
    "DDP bucketed": ("conformance.spec.test_ddp", "properties.test_ddp"),
    "DDP ddp2026": ("conformance.spec.test_ddp", "properties.test_ddp"),
    "sharded optimizer": ("conformance.spec.test_sharded_optimizer", "properties.test_sharded_optimizer"),
    "FSDP": ("conformance.spec.test_fsdp", "properties.test_fsdp"),
    "context parallel": ("conformance.spec.test_context_parallel", "properties.test_context_parallel"),
    "tensor parallel": ("conformance.spec.test_tensor_parallel", "properties.test_tensor_parallel"),
    "pipeline parallel": ("conformance.spec.test_pipeline", "properties.test_pipeline"),
    "activation checkpointing": ("conformance.spec.test_checkpointing", "properties.test_checkpointing"),
    "ring collectives": ("conformance.spec.test_ring_collectives", "properties.test_ring_collectives"),
    "gradient scaler": ("conformance.spec.test_grad_scaler", "properties.test_grad_scaler"),
    "distributed sampler": ("conformance.spec.test_sampler", "properties.test_sampler"),
    "composed parallelism": ("conformance.spec.test_composed", "properties.test_composed"),
}


# What a student should know when reading a capability's row next to the course's own tests.
NOTES = {
    "FSDP": (
        "the course's test_fsdp_correctness[fp32] asked torch.equal against one process on the whole "
        "batch until release 26.1.2 relaxed it to allclose(atol=1e-6, rtol=1e-4); a correct FSDP misses "
        "the exact check by one rounding (about 1e-8 on linear1.weight at step 0), "
        "because splitting the batch over ranks reorders the weight-gradient sums. This suite compares "
        "bit for bit against the per-rank gradients summed in rank order and divided by W (what an "
        "all-reduce or reduce-scatter computes), and within the float64 oracle against the whole batch."
    ),
}


# Shown where a Triton flavour's checks ran on a CPU machine.
TRITON_ON_THE_CPU = (
    "these checks ran on the CPU, with CPU tensors under the Triton interpreter (TRITON_INTERPRET=1). "
    "A class that hands CPU tensors to other code (a PyTorch fallback) was judged on that code, "
    "not on its kernel; on a GPU (--device cuda) the kernel itself is judged."
)


def has_checks(family: str, exists) -> bool:
    """Whether the suite has a test module for ``family`` (``exists(module) -> bool``)."""
    return any(exists(m) for m in FAMILY_MODULES.get(family, ()))


# Packages whose every module is a self-check (the suite's and perf's own tests).
SELF_PACKAGES = ("conformance.selftests", "perf.tests", "perf")


def register(module: str, rule: Callable[[Check], str]) -> None:
    """Add a module to the table (for a new capability's test modules)."""
    if module in MODULES:
        raise ValueError(f"{module} is already in the capability table")
    MODULES[module] = rule


def _self_package(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in SELF_PACKAGES)


def capability_of_nodeid(nodeid: str) -> str:
    """The capability of the check with this node id (``SELF`` for a self-check).

    KeyError for a module the table does not know (``check_collected`` turns that into a
    collection error naming the module)."""
    c = parse_nodeid(nodeid)
    if c.module in MODULES:
        return MODULES[c.module](c)
    if _self_package(c.module):
        return SELF
    raise KeyError(f"test module {c.module!r} is not in the capability table (conformance/capabilities.py)")


def is_self_check(nodeid: str) -> bool:
    try:
        return capability_of_nodeid(nodeid) == SELF
    except KeyError:
        return False


def unknown_modules(nodeids) -> list[str]:
    """The test modules among ``nodeids`` that the table does not know."""
    missing = []
    for nodeid in nodeids:
        try:
            capability_of_nodeid(nodeid)
        except KeyError:
            module = parse_nodeid(nodeid).module
            if module not in missing:
                missing.append(module)
    return missing
