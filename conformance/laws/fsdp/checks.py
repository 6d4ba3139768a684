"""The comparisons each law makes on what the ranks reported.

Where each compared quantity comes from (issue 38).  The course's own expectations are
quoted in ``conformance/spec/test_fsdp.py``; torch's are ``fully_shard``'s.  A quantity
no handout or library contract fixes is a bound from the side that costs the user (memory,
bytes, gathers), never this project's own figure.

    check_parity            course test_fsdp_correctness (allclose to one process); exact where any sum-then-halve gives the same bits
    check_shard_algebra     the handout's sharding; the per-rank share is a bound (1/S of each matrix, whole rows)
    check_dtypes            course test_fsdp_gradient_sync (fp32 gradients of the parameters' shapes); the
                            forward's float collectives no wider than the compute dtype (fully_shard's param_dtype)
    check_replicated        course test_fsdp_gradient_sync (replicated gradients identical across ranks)
    check_memory            the handout's ZeRO-3 memory, no figure: a bound (total / S + the largest parameter)
    check_gather_window     the handout's "two layers before" rule: a bound on what forward has gathered
    check_autograd_after_forward, check_reduction_dtype, check_frees_after_backward,
    check_frees_after_no_grad_forward, check_backward_gathers, check_same_results
                            extras (API tier): no handout figure; each a bound or torch's behaviour
"""

from __future__ import annotations

import math

import torch

from conformance.harness import resolve_device

from conformance import oracle
from conformance.verdicts import NotApplicable

from . import model as models
from .strategies import FSDPCase, optimizer_state_bytes_per_element

SUITE_SOURCE = models.SUITE_BLOCKS.source
SLACK_BYTES = 256  # scalars: an optimizer's step counters and the like


def shard_size(case: FSDPCase) -> int:
    if case.strategy == "NO_SHARD":
        return 1
    if case.strategy == "HYBRID_SHARD":
        return 2 if case.world_size % 2 == 0 else case.world_size
    return case.world_size


def check_parity(case: FSDPCase, results: list[dict], ref32: list[dict], ref64: list[dict]) -> None:
    """Gathered parameters equal the reference after every step, on every rank.

    Source: CS336 2026 test_fsdp_correctness (fsdp_gather_full_params after each of three
    SGD steps, every name of named_parameters(), allclose to one process on the whole batch;
    spec module).  Bit for bit here only where no correct design can differ: fp32 on the
    CPU at W <= 2, against the ranks' own split (per-rank gradients summed, then halved) --
    any sum of two fp32 gradients rounds once and halving is exact, so pre-dividing,
    all-reducing, reduce-scattering or reducing in float64 all give these bits.  Elsewhere
    the float64 oracle."""
    # Bit for bit only where the reference's arithmetic is the ranks': on the CPU (the
    # reference runs there; a GPU's kernels round differently), fp32, up to two ranks.
    exact = case.compute is None and case.world_size <= 2 and resolve_device() == "cpu"
    # Every parameter by the name named_parameters() gives it; a tied weight's other names
    # (head.weight beside embedding.weight) may be left out, as named_parameters() leaves
    # them out, and are checked where given.
    required = set(dict(models.build(case).named_parameters()))
    for s in range(case.steps):
        expected32, expected64 = ref32[s + 1], ref64[s + 1]
        for r, res in enumerate(results):
            full = res["steps"][s]["full"]
            missing = sorted(required - set(full))
            if missing:
                raise AssertionError(f"step {s} rank {r}: gather_full_params lacks {missing}")
            for name in (n for n in expected32 if n in full):
                got = full[name]
                where = f"step {s} rank {r} {name}"
                if got.dtype != torch.float32:
                    raise AssertionError(f"{where}: gathered dtype {got.dtype}, expected torch.float32")
                if tuple(got.shape) != tuple(expected32[name].shape):
                    raise AssertionError(f"{where}: gathered shape {tuple(got.shape)}, expected {tuple(expected32[name].shape)}")
                if exact:
                    oracle.assert_bitwise_equal(where + " (fp32, same reduction order)", got, expected32[name])
                else:
                    oracle.assert_close(where, got, expected64[name], eager=expected32[name], dtype=torch.float32)


def check_same_results(case: FSDPCase, a: list[dict], b: list[dict], what: str) -> None:
    """Two runs of the same case give the same bits (extras: strategy and delay invariance;
    no handout fixes them, a race or a strategy-dependent reduction breaks them)."""
    for s in range(case.steps):
        for name, t in a[0]["steps"][s]["full"].items():
            oracle.assert_bitwise_equal(f"step {s} {name}: {what}", b[0]["steps"][s]["full"][name], t)


def _unique_matrices(case: FSDPCase):
    base = models.build(case)
    seen, trainable, frozen = set(), [], []
    for mname, mod in base.named_modules():
        if isinstance(mod, models.MATRIX_CLASSES) and id(mod.weight) not in seen:
            seen.add(id(mod.weight))
            (trainable if mod.weight.requires_grad else frozen).append(mod.weight)
    replicated = [p for n, p in base.named_parameters() if p.dim() < 2 and p.requires_grad]
    return base, trainable, frozen, replicated


def check_something_sharded(case: FSDPCase, results: list[dict]) -> None:
    """Name a wrapper that sharded nothing as such, before any bound it then breaks."""
    if shard_size(case) == 1:
        return
    _, trainable, _, _ = _unique_matrices(case)
    full = sum(p.numel() for p in trainable)
    for s in range(case.steps):
        held = [res["steps"][s]["local_shard"].numel() for res in results]
        if full and min(held) >= full:
            raise AssertionError(
                f"step {s}: no Linear/Embedding weight was sharded: every rank holds all {full} of their elements "
                f"at W={case.world_size} (the model was built from {results[0].get('blocks', SUITE_SOURCE)}; does the FSDP wrap them?)"
            )


def check_shard_algebra(case: FSDPCase, results: list[dict], ref32: list[dict]) -> None:
    """Every rank holds at most its share; the shards of all ranks are the full parameters.

    Source: the handout's FSDP (each rank keeps a 1/W shard of every Linear and Embedding
    weight and steps it with the optimizer built on ``fsdp_model.parameters()``, as the
    course test builds SGD).  The share is not a handout figure: it is the user's bound,
    1/S of each matrix rounded up to whole rows (what dim-0 sharding pads, torch's
    ``fully_shard``; a flat buffer padded to a multiple of S needs no more).  The partition
    compares the nonzero values held with the full parameters', so padding of any layout
    is free."""
    check_something_sharded(case, results)
    S, W = shard_size(case), case.world_size
    base, trainable, _, _ = _unique_matrices(case)
    share = sum(math.ceil(p.shape[0] / S) * (p.numel() // p.shape[0]) for p in trainable)
    names = {}
    for n, p in base.named_parameters():
        if any(p is q for q in trainable):
            names[n] = p
    for s in range(case.steps):
        pieces = [res["steps"][s]["local_shard"] for res in results]
        for r, piece in enumerate(pieces):
            if piece.numel() > share:
                raise AssertionError(f"step {s} rank {r} holds {piece.numel()} elements of the sharded parameters; its share is at most {share} (W={W}, shard group {S})")
        held = torch.cat(pieces)
        # the parameters the shards hold before this step's update: the initial ones, then
        # what the target itself gathered after the previous step
        before = ref32[0] if s == 0 else results[0]["steps"][s - 1]["full"]
        full = torch.cat([before[n].reshape(-1) for n in names]) if names else torch.zeros(0)
        full = full.repeat(W // S)
        a, b = held[held != 0].sort().values, full[full != 0].sort().values
        if a.shape != b.shape or not torch.equal(a, b):
            raise AssertionError(
                f"step {s}: the ranks' shards are not a partition of the full parameters (x{W // S} replicas): "
                f"{a.numel()} nonzero elements held, {b.numel()} expected"
                + ("" if a.shape != b.shape else f", first differing value {a[(a != b).nonzero()[0]].item()} vs {b[(a != b).nonzero()[0]].item()}")
            )


def check_dtypes(case: FSDPCase, results: list[dict]) -> None:
    """Master parameters and gradients fp32 with their shapes; forward gathers in the compute dtype.

    Sources: CS336 2026 test_fsdp_gradient_sync ("every parameter must have a gradient
    matching its data shape and in the master weight dtype (fp32), regardless of
    compute_dtype", over ``fsdp_model.module.named_parameters()``) and its mixed-precision
    baseline (master weights and optimizer updates in fp32).  Forward's communication:
    torch's ``fully_shard`` contract (``MixedPrecisionPolicy.param_dtype`` is the dtype of
    the unsharded parameters, all-gathered in it) and the handout's.  Bounded from the
    user's side: no floating-point collective in forward carries a wider dtype than the
    compute dtype (integer or boolean ones, a design's metadata, are not parameters)."""
    compute_dtype = case.compute_dtype or torch.float32
    compute = str(compute_dtype).replace("torch.", "")
    for r, res in enumerate(results):
        for s, rec in enumerate(res["steps"]):
            for i, (shape, dtype, grad, requires_grad) in enumerate(rec["params"]):
                if not requires_grad:
                    continue
                if dtype != "torch.float32":
                    raise AssertionError(f"step {s} rank {r}: parameter {i} of fsdp_model.parameters() is {dtype}, expected fp32 master weights")
                if grad is None:
                    raise AssertionError(f"step {s} rank {r}: parameter {i} (shape {shape}) has no gradient after on_after_backward")
                if grad != (shape, "torch.float32"):
                    raise AssertionError(f"step {s} rank {r}: parameter {i} shape {shape}: gradient {grad}, expected its shape in fp32")
            for name, shape, dtype, grad in rec["module_params"]:
                if grad is None or grad != (shape, dtype):
                    raise AssertionError(f"step {s} rank {r}: {name} {shape} {dtype}: gradient {grad}")
        gathers = [(n, d) for n, phase, d in res["collectives"] if phase == "forward"]
        wrong = [(n, d) for n, d in gathers if _wider_float(d, compute_dtype)]
        if wrong:
            raise AssertionError(f"rank {r}: forward communicated {wrong[:3]}, expected floating-point data in {compute} "
                                 f"(gather the shards cast to the compute dtype)")
        if case.world_size > 1 and shard_size(case) > 1 and not gathers:
            raise AssertionError(f"rank {r}: nothing was gathered in forward at W={case.world_size}: parameters are not sharded")


def _wider_float(dtype_name: str, compute: torch.dtype) -> bool:
    """Is the collective's dtype (as the spy names it) a floating type wider than ``compute``?"""
    dtype = getattr(torch, dtype_name, None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype.itemsize > compute.itemsize


def check_replicated(case: FSDPCase, results: list[dict]) -> None:
    """Parameters FSDP does not shard get bit-identical gradients on every rank.

    Source: CS336 2026 test_fsdp_gradient_sync ("Replicated (non-FSDP) parameter gradients
    must be identical across ranks").  Bit for bit: an all-reduce of any algorithm hands
    every rank the same bits, and replicas whose gains differ by a rounding drift apart
    step by step (DDP's contract of bit-identical replicas)."""
    for s in range(case.steps):
        first = results[0]["steps"][s]["replicated_grads"]
        for r, res in enumerate(results[1:], start=1):
            other = res["steps"][s]["replicated_grads"]
            if set(other) != set(first):
                raise AssertionError(f"step {s}: replicated parameters with gradients differ: rank 0 {sorted(first)}, rank {r} {sorted(other)}")
            for name, g in first.items():
                oracle.assert_bitwise_equal(f"step {s}: gradient of replicated {name}, rank {r} vs rank 0", other[name], g)


def _rest_bound(case: FSDPCase) -> tuple[float, int]:
    """Bytes a rank may hold at rest (its shards, their gradients and optimizer state, one
    largest parameter, the replicated and frozen ones), and the number of sharded elements."""
    S = shard_size(case)
    _, trainable, frozen, replicated = _unique_matrices(case)
    K = optimizer_state_bytes_per_element(case)
    n_sharded = sum(p.numel() for p in trainable)
    largest = max([p.numel() for p in trainable + frozen] or [0])
    n_params = len(trainable) + len(frozen) + len(replicated)
    # per parameter: a step counter, and a rank's shard of a flat buffer rounds up by one element
    slack = SLACK_BYTES + n_params * (16 + 2 * (8 + K))
    rest = (8 + K) * (n_sharded / S + largest + sum(p.numel() for p in replicated)) + 4 * sum(p.numel() for p in frozen) + slack
    return rest, n_sharded


def _beyond_share(case: FSDPCase, names: list[str]) -> list[str]:
    """The names among ``names`` (parameters a module attribute holds whole) whose whole is
    more than a rank's share: a matrix of one row is its rank's whole share under dim-0
    sharding (torch's fully_shard), so holding it whole is no fault."""
    S = shard_size(case)
    rows = {n: p.shape[0] for n, p in models.build(case).named_parameters(remove_duplicate=False)}
    return [n for n in names if n not in rows or -(-rows[n] // S) < rows[n]]


def check_memory(case: FSDPCase, results: list[dict], after_forward: bool = False) -> None:
    """At rest no full parameter is held; bytes at most total / S plus the largest parameter.

    Source: the handout's FSDP memory (parameters, gradients and optimizer state sharded at
    rest: ZeRO-3), which gives no figure.  The bound is the user's: a rank's storages after
    backward and after the step are at most 1/S of the sharded parameters with their
    gradients and optimizer state, plus one largest parameter (a gather buffer a design may
    keep), the replicated and frozen ones and per-parameter slack; and no module attribute
    holds a full parameter.  ``after_forward`` (an extra: FULL_SHARD's reshard after forward)
    adds the after-forward bound."""
    check_something_sharded(case, results)
    S = shard_size(case)
    _, trainable, frozen, replicated = _unique_matrices(case)
    K = optimizer_state_bytes_per_element(case)
    largest = max([p.numel() for p in trainable + frozen] or [0])
    n_params = len(trainable) + len(frozen) + len(replicated)
    slack = SLACK_BYTES + n_params * (16 + 2 * (8 + K))
    rest, n_sharded = _rest_bound(case)
    fwd = (4 + K) * n_sharded / S + 8 * largest + (8 + K) * sum(p.numel() for p in replicated) + 4 * sum(p.numel() for p in frozen) + slack
    for r, res in enumerate(results):
        for s, rec in enumerate(res["steps"]):
            held = _beyond_share(case, rec["full_attrs_after_backward"])
            if S > 1 and held:  # with one shard, the shard is the parameter
                raise AssertionError(f"step {s} rank {r}: after backward full parameters are still held: {held}")
            for when in ("after_backward", "after_step"):
                if rec[f"bytes_{when}"] > rest:
                    raise AssertionError(f"step {s} rank {r}: {rec[f'bytes_{when}']} bytes reachable {when.replace('_', ' ')}, bound {rest:.0f} (total/{S} + the largest parameter)")
            if after_forward:
                held = _beyond_share(case, rec["full_attrs_after_forward"])
                if S > 1 and held:
                    raise AssertionError(f"step {s} rank {r}: after forward full parameters are still held: {held}")
                if rec["bytes_after_forward"] > fwd:
                    raise AssertionError(f"step {s} rank {r}: {rec['bytes_after_forward']} bytes reachable after forward, bound {fwd:.0f}")
    if after_forward:
        check_autograd_after_forward(case, results)


def check_autograd_after_forward(case: FSDPCase, results: list[dict]) -> None:
    """After forward, what autograd alone keeps for backward is the unwrapped model's
    activations, give or take two of the largest parameter: no gathered full parameter.

    An extra (no handout figure): a bound from the user's side, activations plus slack.
    What autograd saves is recorded through saved-tensor hooks; a target whose own hooks are
    innermost while its layers run (a design that packs gathered weights away) hides it, and
    the check reads not applicable rather than passed."""
    if shard_size(case) <= 1:
        return  # one shard: the shard is the parameter
    if any(rec.get("saved_tensors_hidden") for res in results for rec in res["steps"]):
        raise NotApplicable("the target's own saved-tensor hooks are innermost while its layers run, so what autograd "
                            "saves for backward cannot be recorded here (only the innermost hooks see it)")
    _, trainable, frozen, replicated = _unique_matrices(case)
    largest = max([p.numel() for p in trainable + frozen] or [0])
    slack = SLACK_BYTES + (len(trainable) + len(frozen) + len(replicated)) * 16
    for r, res in enumerate(results):
        for s, rec in enumerate(res["steps"]):
            extra = rec["autograd_bytes_after_forward"] - rec["unwrapped_autograd_bytes"]
            if extra > 8 * largest + slack:
                raise AssertionError(
                    f"step {s} rank {r}: after forward autograd alone holds {rec['autograd_bytes_after_forward']} bytes "
                    f"for backward, {extra} more than the unwrapped model's activations ({rec['unwrapped_autograd_bytes']}; "
                    f"bound: two of the largest parameter, {8 * largest + slack:.0f}): gathered full parameters saved "
                    "for backward (F.linear(x, gathered) keeps `gathered` alive until backward however the module's "
                    "attribute is reset); free the gathered storage itself after forward and gather again in backward")


REDUCTIONS = ("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter", "all_reduce")


def check_reduction_dtype(case: FSDPCase, results: list[dict]) -> None:
    """Gradients are reduced in fp32 whatever the compute dtype (the API's default
    ``reduce_dtype``): a sum over ranks in fp16/bf16 rounds every gradient once more, an
    error the oracle's compute-dtype bound cannot tell from the compute's own.

    An extra: the course test casts gradients to fp32 after they arrive and fixes no
    reduction dtype; torch's ``MixedPrecisionPolicy(reduce_dtype=None)`` reduces in
    param_dtype unless fp32 is asked for.  The fp32 default is this protocol's
    (``get_fsdp_strategy(..., reduce_dtype=None)``)."""
    for r, res in enumerate(results):
        reductions = [(n, phase, d) for n, phase, d in res["collectives"] if n in REDUCTIONS and phase in ("backward", "after_backward")]
        wrong = [(n, d) for n, _, d in reductions if d != "float32"]
        if wrong:
            raise AssertionError(
                f"rank {r}: gradients reduced in {sorted({d for _, d in wrong})} ({wrong[:3]}) with compute dtype "
                f"{case.compute or 'fp32'}; expected float32 (cast the gradient to fp32 before the reduce-scatter / all-reduce)")
        if case.world_size > 1 and not reductions:
            raise AssertionError(f"rank {r}: no gradient reduction was seen in backward or on_after_backward at W={case.world_size}")


def check_frees_after_backward(case: FSDPCase, results: list[dict]) -> None:
    """When loss.backward() returns, every unit's backward has run: no unit but the root
    still holds its gathered parameters (each is freed after its own backward, not all at
    on_after_backward, which would hold the whole model at the end of backward).

    An extra: the handout frees a unit after its backward but fixes no figure; the bound is
    the at-rest one plus one full fp32 gradient for reductions in flight, and the gathered
    parameters still allocated (leaf tensors requiring grad that are not the wrapper's own
    parameters) at most a root unit's: the two largest matrices and the vectors.  Bytes
    alone cannot tell a whole gathered model from reductions in flight of the same size."""
    check_something_sharded(case, results)
    if shard_size(case) == 1:
        return
    rest, n_sharded = _rest_bound(case)
    # Reductions may still be in flight (waited for in on_after_backward): their inputs, at
    # most one full fp32 gradient, are allowed on top of the rest; gathered parameters are not.
    bound = rest + 4 * n_sharded
    # Gathered parameters get no allowance for reductions in flight (those are gradients):
    # only a root unit may still be gathered, at most the two largest matrices (an embedding
    # and an untied head) and the vectors, in fp32.
    _, trainable, frozen, replicated = _unique_matrices(case)
    sizes = sorted((p.numel() for p in trainable + frozen), reverse=True)
    root_bound = 4 * (sum(sizes[:2]) + sum(p.numel() for p in replicated)) + SLACK_BYTES
    for r, res in enumerate(results):
        for s, rec in enumerate(res["steps"]):
            held_bytes = rec.get("bytes_after_loss_backward", 0)
            if held_bytes > bound:
                raise AssertionError(f"step {s} rank {r}: {held_bytes} bytes reachable when loss.backward() returned, bound {bound:.0f} "
                                     f"(at rest plus one full fp32 gradient for reductions in flight): are units kept gathered "
                                     f"after their backward?")
            gathered = rec.get("gathered_bytes_after_loss_backward", 0)
            if gathered > root_bound:
                raise AssertionError(f"step {s} rank {r}: {gathered} bytes of gathered parameters (leaf tensors requiring grad, "
                                     f"not the wrapper's own parameters) still allocated when loss.backward() returned, bound "
                                     f"{root_bound:.0f} (a root unit of the two largest matrices and the vectors): are units kept "
                                     f"gathered after their backward?")
            held = _beyond_share(case, rec.get("full_attrs_after_loss_backward") or [])
            if held:
                raise AssertionError(f"step {s} rank {r}: when loss.backward() returned, full parameters were still held: {held} "
                                     f"(free each unit's gathered parameters after its backward)")


def check_frees_after_no_grad_forward(case: FSDPCase, results: list[dict]) -> None:
    """A forward under torch.no_grad (an evaluation) leaves no unit but the root gathered,
    whatever the strategy: no backward will come to free it (cases with ``eval_forward``).
    An extra, this protocol's: torch's ``fully_shard(reshard_after_forward=False)`` keeps
    the parameters gathered after such a forward (its SHARD_GRAD_OP adapter fails it)."""
    if shard_size(case) == 1 or not case.eval_forward:
        return
    for r, res in enumerate(results):
        held = res.get("full_attrs_after_no_grad_forward")
        if held is None:
            raise AssertionError(f"rank {r}: the evaluation forward was not run (the case asks for it)")
        held = _beyond_share(case, held)
        if held:
            raise AssertionError(f"rank {r}: after a forward under torch.no_grad full parameters are still held: {held} "
                                 f"(strategy {case.strategy or 'get_fsdp'}); no backward will free them")


GATHER_COLLECTIVES = ("all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather")


def check_backward_gathers(case: FSDPCase, results: list[dict]) -> None:
    """Backward all-gathers no more than forward did: each unit at most once (FULL_SHARD
    re-gathers what forward freed; a unit gathered again after its own backward is waste).

    An extra, and a bound from the user's side (fewer is better): no handout fixes a count
    of gathers; torch's FULL_SHARD gathers each group once in backward."""
    if shard_size(case) == 1:
        return
    for r, res in enumerate(results):
        forward = sum(1 for n, phase, _ in res["collectives"] if n in GATHER_COLLECTIVES and phase == "forward")
        backward = sum(1 for n, phase, _ in res["collectives"] if n in GATHER_COLLECTIVES and phase == "backward")
        if backward > forward:
            raise AssertionError(f"rank {r}: backward issued {backward} all-gathers over {case.steps} step(s), forward {forward}: "
                                 f"some unit is gathered more than once in backward (a prefetch of a unit whose backward is done?)")


LOOKAHEAD = 2  # layers gathered ahead of the one whose forward begins


def check_gather_window(case: FSDPCase, results: list[dict]) -> None:
    """Forward gathers no further ahead than two layers (CS336: "only start gathering after
    the layer two before the current one has completed its forward pass", to limit memory).

    Read from the order of events in the last step's forward (a wrapper's prefetch may
    follow an order learnt in the first): when the k-th layer to run begins its forward,
    the elements all-gathered so far in that forward are at most those of the layers that
    have begun (it included), the two largest of those that have not, and the parameters
    that are no layer's, each padded to a multiple of W.  The strict reading (gathering of
    layer j begins after layer j - 2 ends) allows one layer ahead at that moment; a second
    is slack for a prefetch issued inside the layer's own hook.  A wrapper that gathers the
    whole model before the first layer runs holds every layer at once."""
    if shard_size(case) == 1:
        return
    model = models.build(case)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
    layers = models.matrix_names(model)
    W = shard_size(case)  # the ranks a parameter is sharded over (a hybrid group's, not the world)

    def padded(name):  # flat shards pad the elements to a multiple of W; row shards, the rows
        shape = shapes[name]
        numel = math.prod(shape)
        rows = -(-shape[0] // W) * W if shape else W
        return max(-(-numel // W) * W, rows * math.prod(shape[1:]))

    # what is not a layer (norm gains) may be gathered too, by a wrapper that shards it
    others = sum(padded(n) for n in shapes if n not in layers)
    for r, res in enumerate(results):
        order, gathered = [], 0
        for entry in res.get("timeline", []):
            if entry[0] == "gather":
                if entry[1] != "forward":
                    if order:
                        break  # the first forward is over
                    continue
                gathered += entry[2]
                continue
            name = entry[1]
            if name in order:
                continue
            order.append(name)
            unseen = [n for n in layers if n not in order]
            k = len(order) - 1
            # layers that have not run yet may be anywhere after k: the window counts the
            # largest of them, as many as the window still has room for
            ahead = sorted((padded(n) for n in unseen), reverse=True)[:LOOKAHEAD]
            allowed = sum(padded(n) for n in order) + sum(ahead) + others
            if gathered > allowed:
                raise AssertionError(
                    f"rank {r}: when layer {name} (the {_ordinal(k + 1)} to run) began its forward, {gathered} elements had "
                    f"been all-gathered in forward, more than the {allowed} of the layers up to it, the {LOOKAHEAD} "
                    f"largest after it and the parameters that are no layer's: gather a layer only once the layer "
                    f"two before it has finished its forward (the handout's bound on memory), not the whole model up front")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
