"""The NCCL hang model (``conformance.laws.p2p_hang``) on schedules whose fate is known:
the ring step that hung on two H200s, its batched form that ran, a ring of three on pair
streams, and the pipeline's 1F1B on one process group (hangs) and on two (the design
impl's executor uses, which ran on two H200s)."""

from __future__ import annotations

from conformance.laws.p2p_hang import Op, first_hang


def send(peer, group="0", batched=False):
    return Op("send", peer, group, batched)


def recv(peer, group="0", batched=False):
    return Op("recv", peer, group, batched)


def test_two_ranks_that_each_send_before_receiving_unbatched_hang():
    why = first_hang({0: [(send(1),), (recv(1),)], 1: [(send(0),), (recv(0),)]})
    assert why is not None and "rank 0 send to rank 1" in why and "hang on NCCL" in why


def test_the_same_exchange_in_one_batch_each_completes():
    assert first_hang({0: [(send(1, batched=True), recv(1, batched=True))],
                       1: [(recv(0, batched=True), send(0, batched=True))]}) is None


def test_opposite_orders_on_the_two_ranks_complete():
    assert first_hang({0: [(send(1),), (recv(1),)], 1: [(recv(0),), (send(0),)]}) is None


def test_a_ring_of_three_sends_and_receives_on_different_pairs_and_completes():
    sched = {r: [(send((r + 1) % 3),), (recv((r - 1) % 3),)] for r in range(3)}
    assert first_hang(sched) is None


def _one_f_one_b(act_group, grad_group, m=3):
    """Two stages, 1F1B: stage 0 runs F0, then (F_{i+1}, B_i) ..., then the last B;
    stage 1 runs (F_i, B_i) for each micro-batch."""
    s0 = [(send(1, act_group),)]
    for i in range(m):
        if i + 1 < m:
            s0.append((send(1, act_group),))
        s0.append((recv(1, grad_group),))
    s1 = [u for _ in range(m) for u in ((recv(0, act_group),), (send(0, grad_group),))]
    return {0: s0, 1: s1}


def test_pipeline_1f1b_on_one_group_hangs_and_on_two_groups_completes():
    assert first_hang(_one_f_one_b("pp", "pp")) is not None
    assert first_hang(_one_f_one_b("activations", "gradients")) is None


def test_a_send_no_receive_takes_is_named():
    why = first_hang({0: [(send(1),)], 1: []})
    assert why is not None and "no matching receive" in why


def test_an_unbatched_send_never_meets_a_batched_receive():
    why = first_hang({0: [(send(1),)], 1: [(recv(0, batched=True),)]})
    assert why is not None and "batched and an unbatched call never meet" in why


def test_message_order_pairs_the_kth_send_with_the_kth_receive():
    # rank 1 receives from 0 twice, then sends back: completes in order
    assert first_hang({0: [(send(1),), (send(1),), (recv(1),)], 1: [(recv(0),), (recv(0),), (send(0),)]}) is None


# --- the recorder ----------------------------------------------------------------------------


def rank_blocking_exchange(ctx):
    """Rank 0 sends one tensor with dist.send, rank 1 takes it with dist.recv, under P2PLog."""
    import torch
    import torch.distributed as dist

    from conformance.laws.p2p_hang import P2PLog

    t = torch.arange(4.0)
    with P2PLog() as probe:
        if ctx.rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
    return [[(op.kind, op.peer, op.batched) for op in unit] for unit in probe.units]


def test_a_blocking_recv_is_recorded_once_though_it_calls_irecv():
    """torch's ``recv`` may call ``irecv`` on the module the recorder wraps: one call, one
    unit (counted twice, every blocking receive looked like a receive with no send)."""
    import pytest

    from conformance.harness import require_world_size, run_on_ranks

    pytest.importorskip("torch.distributed")
    require_world_size(2, "cpu")
    # CPU tensors: a gloo pool whatever --device says (NCCL refuses them)
    sender, receiver = run_on_ranks(rank_blocking_exchange, 2, timeout=120, device="cpu")
    assert sender == [[("send", 1, False)]] and receiver == [[("recv", 0, False)]], (sender, receiver)
    assert first_hang({0: [(send(1),)], 1: [(recv(0),)]}) is None
