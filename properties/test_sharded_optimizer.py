"""Sharded-optimizer (ZeRO-1) laws, checked against the target's get_sharded_optimizer.

Every law in ``conformance.laws.zero.laws.LAWS`` runs under Hypothesis against
``--target`` (default: our ``impl``) on world sizes 1..4 (1..#GPUs on CUDA).  Below them,
properties of our own implementation: the owner assignment's balance, the bucket rounds,
and both sync strategies and the pipelined (many-round) step under the same laws.
"""

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from conformance.profiles import examples
from impl.zero.param_sync import plan_rounds
from impl.zero.optimizer import assign_greedy
from conformance.laws.zero.laws import CONTRACT_LAWS, LAWS, LAWS_BY_NAME, check_law

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("law", CONTRACT_LAWS, ids=lambda law: law.name)
def test_contract_sharded_optimizer_law(law, target, device):
    """The course's use of a sharded optimizer only: a wider case can never stop it."""
    check_law(law, target.spec, device)


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.name)
def test_sharded_optimizer_law(law, target, device):
    check_law(law, target.spec, device)


# --- our implementation's own options, under the same laws ------------------------------


def _default_target_only(target) -> None:
    """impl's own options and internals are self-checks, the same whatever ``--target``
    says: they run with the default target only (a run against another target, such as
    each known-good target's in CI, would only repeat them)."""
    if target.spec != "impl":
        pytest.skip(f"checks impl's own sharded optimizer; it runs with the default target, not {target.spec}")


VARIANT_LAWS = (
    "matches_unsharded_bit_for_bit",
    "add_param_group_mid_training_matches_unsharded",
    "per_rank_state_dict_round_trips",
    "consolidated_state_dict_resumes_at_any_world_size",
)


@pytest.mark.parametrize("variant", ["broadcast", "allgather_buckets", "broadcast_buckets"])
@pytest.mark.parametrize("law_name", VARIANT_LAWS)
def test_impl_sync_variant_obeys_law(variant, law_name, device, target):
    """Both sync strategies, and the pipelined step with many small buckets, obey the laws
    (the default, allgather with one round for small models, runs in the test above)."""
    _default_target_only(target)
    check_law(LAWS_BY_NAME[law_name], f"impl.zero.optimizer:variants.{variant}", device, max_examples=examples(6))


# --- the owner assignment and the rounds (pure functions) --------------------------------

sizes_lists = st.lists(st.integers(0, 10_000), min_size=0, max_size=40)


@settings(max_examples=examples(100))
@given(sizes=sizes_lists, world_size=st.integers(1, 8), start=st.lists(st.integers(0, 5_000), min_size=8, max_size=8))
def test_greedy_assignment_load_is_at_most_mean_plus_largest(sizes, world_size, start):
    """LPT bound: no rank's load grows past (its share of the total) + the largest item."""
    loads = start[:world_size]
    before = list(loads)
    owners = assign_greedy(sizes, loads)
    note(f"owners {owners}, loads {before} -> {loads}")
    assert all(0 <= r < world_size for r in owners)
    assert sum(loads) == sum(before) + sum(sizes)
    if sizes:
        for r in range(world_size):
            added = loads[r] - before[r]
            if added:
                assert loads[r] <= sum(loads) / world_size + max(sizes)


@settings(max_examples=examples(50))
@given(sizes=sizes_lists, world_size=st.integers(1, 8))
def test_greedy_assignment_depends_only_on_sizes(sizes, world_size):
    """Every rank computes the same owners (no randomness, no rank in the rule)."""
    assert assign_greedy(sizes, [0] * world_size) == assign_greedy(list(sizes), [0] * world_size)


@settings(max_examples=examples(100))
@given(sizes=sizes_lists, world_size=st.integers(1, 6), bucket=st.one_of(st.none(), st.integers(1, 20_000)))
def test_rounds_cover_each_owned_parameter_once_in_order(sizes, world_size, bucket):
    owners = assign_greedy(sizes, [0] * world_size)
    owned = [[i for i, r in enumerate(owners) if r == rank] for rank in range(world_size)]
    rounds = plan_rounds(owned, sizes, bucket)
    for rank in range(world_size):
        sent = [i for rnd in rounds for i in rnd.buckets[rank]]
        assert sent == owned[rank]
        for rnd in rounds:
            b = rnd.buckets[rank]
            if bucket is not None and len(b) > 1:
                assert sum(sizes[i] for i in b) <= bucket


def test_world_size_one_runs_without_a_process_group(target):
    """No torch.distributed initialised: the optimizer is a plain one over its params."""
    _default_target_only(target)
    from impl.zero.optimizer import ShardedOptimizer

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    sharded = ShardedOptimizer(params, torch.optim.AdamW, lr=0.1, weight_decay=0.1)
    plain = torch.optim.AdamW(ref, lr=0.1, weight_decay=0.1)
    for _ in range(3):
        for p, q in zip(params, ref):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        sharded.step()
        plain.step()
    for p, q in zip(params, ref):
        assert torch.equal(p, q)
    assert sharded.world_size == 1 and sharded.owned_indices() == [0, 1]


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (lambda: ([], torch.optim.SGD, {}), ValueError, "empty parameter list"),
        (lambda: ([{"params": []}], torch.optim.SGD, {}), ValueError, "empty"),
        (lambda: (torch.nn.Parameter(torch.zeros(2)), torch.optim.SGD, {}), TypeError, "single tensor"),
        (lambda: ([torch.nn.Parameter(torch.zeros(2))], torch.optim.SGD(
            [torch.nn.Parameter(torch.zeros(1))], lr=0.1), {}), TypeError, "optimizer class"),
        (lambda: ([torch.nn.Parameter(torch.zeros(2))], torch.optim.SGD, {"sync": "gossip"}), ValueError, "sync"),
        (lambda: ([torch.nn.Parameter(torch.zeros(2))], torch.optim.SGD, {"bucket_mb": 0}), ValueError, "bucket_mb"),
        (lambda: ([torch.nn.Parameter(torch.zeros(2))], torch.optim.SGD, {"betas": (0.9, 0.9)}), TypeError, "betas"),
    ],
    ids=["empty list", "empty groups", "bare tensor", "optimizer instance", "unknown sync", "zero bucket", "bad optimizer kwarg"],
)
def test_bad_construction_is_a_clear_error(bad, error, words):
    from impl.zero.optimizer import ShardedOptimizer

    params, cls, kwargs = bad()
    with pytest.raises(error, match=words):
        ShardedOptimizer(params, cls, lr=0.1, **kwargs)


def rank_disagreeing_input(ctx, what):
    """Rank 0 passes good parameters; the others pass bad or different ones."""
    from impl.zero.optimizer import ShardedOptimizer

    shape = (3, 4)
    device = ctx.device
    if ctx.rank > 0 and what == "device":
        device = "meta" if ctx.backend == "gloo" else "cpu"
    if ctx.rank > 0 and what == "shapes":
        shape = (4, 3, 1)
    params = [torch.nn.Parameter(torch.zeros(shape, device=device)), torch.nn.Parameter(torch.zeros(5, device=ctx.device))]
    try:
        opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
        if what == "late group":  # a group added later, bad on the other ranks only
            late = torch.zeros(2, device=ctx.device if ctx.rank == 0 else ("meta" if ctx.backend == "gloo" else "cpu"))
            opt.add_param_group({"params": [torch.nn.Parameter(late)]})
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("what", ["device", "shapes", "late group"])
def test_ranks_that_disagree_all_raise_instead_of_hanging(what, device, target):
    """One rank's bad or different parameters make every rank raise a ValueError (the
    ranks agree in one collective before any other), never a hang."""
    _default_target_only(target)
    from conformance.harness import available_world_sizes, run_on_ranks

    if max(available_world_sizes(device.type)) < 2:
        pytest.skip("needs 2 GPUs")
    messages = run_on_ranks(rank_disagreeing_input, 2, what, timeout=60, device=device.type)
    for rank, message in enumerate(messages):
        assert message is not None, f"rank {rank} accepted parameters the other rank disagrees with ({what})"


def rank_mixed_dtypes(ctx, sync):
    """Parameters of three dtypes (one flat byte buffer holds them all for allgather)."""
    from impl.zero.optimizer import ShardedOptimizer

    g = torch.Generator().manual_seed(7)
    shapes_dtypes = [((7, 3), torch.float32), ((5,), torch.float64), ((4, 4), torch.bfloat16), ((), torch.float32), ((9,), torch.float64)]
    make = lambda: [torch.nn.Parameter(torch.randn(s, generator=g).to(dt).to(ctx.device)) for s, dt in shapes_dtypes]  # noqa: E731
    params = make()
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    sharded = ShardedOptimizer(params, torch.optim.Adam, sync=sync, bucket_mb=1e-4, lr=0.05)
    plain = torch.optim.Adam(ref, lr=0.05)
    for _ in range(3):
        for p, q in zip(params, ref):
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype).to(ctx.device)
            q.grad = p.grad.clone()
        sharded.step()
        plain.step()
    return [p.detach() for p in params], [q.detach() for q in ref]


@pytest.mark.parametrize("sync", ["allgather", "broadcast"])
def test_mixed_parameter_dtypes_match_unsharded(sync, device, target):
    _default_target_only(target)
    from conformance import oracle
    from conformance.harness import available_world_sizes, run_on_ranks

    world_size = min(3, max(available_world_sizes(device.type)))
    for rank, (got, want) in enumerate(run_on_ranks(rank_mixed_dtypes, world_size, sync, timeout=60, device=device.type)):
        for i, (a, e) in enumerate(zip(got, want)):
            oracle.assert_bitwise_equal(f"rank {rank}, parameter {i} ({a.dtype})", a, e)
