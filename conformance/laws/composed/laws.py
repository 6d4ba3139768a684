"""The composed-parallelism laws, written against the target protocol.

A target offers
    ``get_parallel_mesh(dims, order=("pp", "dp", "cp", "tp"))`` -> a mesh with
        ``.group(d)``, ``.size(d)``, ``.rank(d)``, ``.ranks(d)`` (sorted global ranks of
        this rank's group along d); row-major layout over ``order``, the last dim inner;
    ``composed_train_step(model, mesh, inputs, targets, *, lr, data_parallel,
        n_microbatches, ignore_index)`` -> an object with ``.loss`` (0-d), ``.grads`` and
        ``.params`` ({dense name: tensor}: gradients before and parameters after one SGD
        step, gathered), the same on every rank.

Capability "composed parallelism".  No course handout: the contract is the protocol's
(``conformance/target.py``): the mesh laws -- the row-major layout over ``order`` is the
protocol's, the layout torch's ``init_device_mesh`` gives (``arange(W).view(sizes)``) -- and
parity of the composed step with one process on the whole batch (DP x TP, FSDP x TP, DP x
PP, PP x TP, TP x CP on up to 4 ranks), judged by the float64 oracle.  Nothing fixes which
collectives a composed step issues, over which groups, how many, or in what order: the
law that reductions run over the mesh's own groups and the replicas' gradients over the
replica group is the extra "reductions over the mesh's groups" (a step that reduces over
the world and divides right gets the right numbers at the price of more traffic).  Extras
also: the loss normalised once by the global token count when ignored targets leave the
data-parallel ranks uneven, CP under pipeline stages and with DP / FSDP, and the 3-D case
PP x DP x TP on 8 ranks (the CPU harness holds at most 8 ranks, so the 4-D case
2 x 2 x 2 x 2 is not run).

``rejection(law_name, target_spec, max_examples)``: the first line of the law's failure on
the target, or None (the mutant self-test's runner).
"""

from __future__ import annotations


from conformance.harness import resolve_device
from conformance.lawbook import API, CONTRACT, Law, by_name, first_failure_line, mutant_settings, check_examples
from conformance.laws.composed import checks
from conformance.laws.composed.strategies import composed_cases, mesh_cases

CAPABILITY = "composed parallelism"
CONTROL = "impl"

LAWS = (
    Law("mesh_groups_partition_the_ranks_once_per_dimension_with_inner_dims_neighbouring", CAPABILITY, CONTRACT,
        cases=lambda device=None: mesh_cases(max_world=4), check=checks.check_mesh, needs=("ranks",)),
    Law("composed_step_matches_one_process_on_the_whole_batch", CAPABILITY, CONTRACT,
        cases=lambda device=None: composed_cases(), check=checks.check_parity, needs=("ranks",)),
    Law("reductions_run_over_the_mesh_groups_and_gradients_over_the_data_parallel_group", CAPABILITY, API,
        cases=lambda device=None: composed_cases(), check=checks.check_collectives, needs=("ranks",),
        extra="reductions over the mesh's groups"),
    Law("loss_is_normalised_once_by_the_global_token_count", CAPABILITY, API,
        cases=lambda device=None: composed_cases(kinds=("dp_x_tp", "fsdp_x_tp", "dp_x_pp"), ignore=True, uneven_dp=True),
        check=checks.check_parity, needs=("ranks",), extra="ignored targets, uneven token counts across data-parallel ranks"),
    Law("context_parallel_chunks_under_pipeline_stages_match_one_process", CAPABILITY, API,
        cases=lambda device=None: composed_cases(kinds=("pp_x_cp", "dp_x_cp")), check=checks.check_parity,
        needs=("ranks",), extra="context parallelism under pipeline stages and with data parallelism (positions offset per chunk)"),
    Law("three_dimensional_pp_dp_tp_step_matches_one_process", CAPABILITY, API,
        cases=lambda device=None: composed_cases(kinds=("pp_x_dp_x_tp",)), check=checks.check_parity,
        needs=("ranks",), extra="3-D mesh PP x DP x TP on 8 ranks"),
)
LAWS_BY_NAME = by_name(LAWS)


def check_law(law: Law, subject: str, device=None, max_examples: int | None = None, **extra_settings) -> None:
    resolve_device(device)
    extra_settings.setdefault("deadline", None)
    # a composition a target declines (a verdict: torch's pieces have no CP on the CPU) is set
    # aside and the other cases still run; the law then reads that verdict, never passed
    check_examples(law, subject, device=device, max_examples=max_examples, go_on_after_verdicts=True, **extra_settings)


def rejection(law_name: str, target_spec: str, max_examples: int) -> str | None:
    """The first line of ``law_name``'s failure on ``target_spec``, or None if it passes."""
    return first_failure_line(lambda: check_law(LAWS_BY_NAME[law_name], target_spec, max_examples=max_examples, **mutant_settings()))


def mutant_examples(law_name: str) -> int:
    """Examples (ci profile) a mutant run draws: each costs a step on 4 (or 8) ranks."""
    return {LAWS[0].name: 6, "three_dimensional_pp_dp_tp_step_matches_one_process": 2}.get(law_name, 4)
