"""The distributed harness's contract, checked on live rank pools (gloo on the CPU).

Each test names the law it checks.  The case functions run inside rank processes, so
they live at module level (they are pickled by reference).  Timeouts are kept short so
that the failure paths (hangs, deaths) cost seconds, not minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from conformance import harness
from conformance.verdicts import NotOffered
from conformance.harness import (
    NotEnoughDevices,
    RankContext,
    RankFailure,
    RankTimeout,
    available_world_sizes,
    require_world_size,
    run_on_ranks,
)

pytestmark = pytest.mark.distributed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- case functions (run on the ranks) ------------------------------------------------


def rank_and_sum(ctx: RankContext, n: int, scale: int = 1):
    """Each rank contributes rank+1; every rank returns the all-reduced sum."""
    t = torch.full((n,), float(ctx.rank + 1) * scale, device=ctx.device)
    dist.all_reduce(t)
    return {"rank": ctx.rank, "world_size": ctx.world_size, "backend": ctx.backend, "sum": t.tolist()}


def identity(ctx: RankContext):
    return ctx.rank, ctx.world_size, ctx.backend, str(ctx.device), os.getpid()


def raise_on_rank(ctx: RankContext, bad_rank: int):
    """bad_rank raises; the others wait in an all-reduce it never joins."""
    if ctx.rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    t = torch.ones(1, device=ctx.device)
    dist.all_reduce(t)
    return t


def raise_everywhere(ctx: RankContext):
    assert ctx.rank < 0, f"symmetric assertion fails on rank {ctx.rank}"


def sleep_on_rank(ctx: RankContext, sleepy_rank: int):
    """sleepy_rank sleeps forever; the others wait in an all-reduce it never joins."""
    if ctx.rank == sleepy_rank:
        while True:
            time.sleep(0.1)
    t = torch.ones(1, device=ctx.device)
    dist.all_reduce(t)
    return t


def bare_assert_on_rank(ctx: RankContext, bad_rank: int):
    """bad_rank fails an assert that has no message, as a student's shape check would."""
    assert ctx.rank != bad_rank
    return ctx.rank


def exit_on_rank(ctx: RankContext, dying_rank: int, code: int):
    if ctx.rank == dying_rank:
        os._exit(code)
    t = torch.ones(1, device=ctx.device)
    dist.all_reduce(t)
    return t


def nested_tensors(ctx: RankContext):
    w = torch.randn(3, 2, requires_grad=True, device=ctx.device)
    y = (w * 2).sum(0)  # a non-leaf tensor that requires grad
    return {"w": w, "pair": (y, [torch.arange(ctx.rank + 1)])}


def unpicklable_result(ctx: RankContext):
    return lambda: ctx.rank


def change_global_state(ctx: RankContext):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    return ctx.rank


def read_global_state(ctx: RankContext):
    return str(torch.get_default_dtype()), torch.is_grad_enabled()


def read_env(ctx: RankContext, names):
    return {name: os.environ.get(name) for name in names}


def echo_args(ctx: RankContext, *args, **kwargs):
    return args, kwargs


def not_offered_everywhere(ctx: RankContext):
    raise NotOffered("target 'x' has no get_ddp()")


def not_offered_on_rank_0(ctx: RankContext):
    if ctx.rank == 0:
        raise NotOffered("target 'x' has no get_ddp()")
    return ctx.rank


def not_offered_on_rank_0_wrong_on_rank_1(ctx: RankContext):
    if ctx.rank == 0:
        raise NotOffered("target 'x' has no get_ddp()")
    raise AssertionError("rank 1 computed a wrong answer")


# --- results ----------------------------------------------------------------------------


@pytest.fixture(params=["cpu", "cuda"])
def rank_device(request):
    """The checks that matter on both backends run on gloo (CPU) and on NCCL (GPUs);
    NCCL ones skip with "needs N GPUs" where there are too few."""
    return request.param


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_results_come_back_in_rank_order(world_size, rank_device):
    require_world_size(world_size, rank_device)
    results = run_on_ranks(rank_and_sum, world_size, 4, scale=2, timeout=30, device=rank_device)
    total = 2.0 * world_size * (world_size + 1) / 2
    assert [r["rank"] for r in results] == list(range(world_size))
    assert all(r["world_size"] == world_size and r["backend"] == harness.backend_for(rank_device) for r in results)
    assert all(r["sum"] == [total] * 4 for r in results)


def test_args_and_kwargs_reach_every_rank_unchanged():
    x = torch.randn(5, 3)
    results = run_on_ranks(echo_args, 2, x, "s", n=3, t={"k": [1, 2]}, timeout=30, device="cpu")
    for args, kwargs in results:
        assert torch.equal(args[0], x) and args[1] == "s"
        assert kwargs == {"n": 3, "t": {"k": [1, 2]}}


def test_tensors_in_results_come_back_detached_on_the_cpu(rank_device):
    require_world_size(2, rank_device)
    results = run_on_ranks(nested_tensors, 2, timeout=30, device=rank_device)
    for rank, r in enumerate(results):
        assert r["w"].device.type == "cpu" and not r["w"].requires_grad
        assert torch.equal(r["pair"][1][0], torch.arange(rank + 1))


def test_pool_is_reused_across_calls():
    first = run_on_ranks(identity, 2, timeout=30, device="cpu")
    second = run_on_ranks(identity, 2, timeout=30, device="cpu")
    assert [r[4] for r in first] == [r[4] for r in second], "same rank processes serve both cases"


def test_two_world_sizes_are_alive_at_once():
    two = run_on_ranks(identity, 2, timeout=30, device="cpu")
    three = run_on_ranks(identity, 3, timeout=30, device="cpu")
    two_again = run_on_ranks(identity, 2, timeout=30, device="cpu")
    assert {(2, "gloo"), (3, "gloo")} <= set(harness.live_pools())
    assert [r[4] for r in two] == [r[4] for r in two_again]
    assert not {r[4] for r in two} & {r[4] for r in three}


def test_a_case_costs_milliseconds_once_the_pool_is_up():
    run_on_ranks(identity, 2, timeout=30, device="cpu")
    n = 20
    start = time.perf_counter()
    for _ in range(n):
        run_on_ranks(rank_and_sum, 2, 8, timeout=30, device="cpu")
    per_case = (time.perf_counter() - start) / n
    assert per_case < 0.25, f"{per_case * 1e3:.1f} ms per case through a live pool"


# --- isolation and environment -----------------------------------------------------------


def test_global_torch_state_does_not_leak_into_the_next_case(rank_device):
    require_world_size(2, rank_device)
    run_on_ranks(change_global_state, 2, timeout=30, device=rank_device)
    for dtype, grad in run_on_ranks(read_global_state, 2, timeout=30, device=rank_device):
        assert dtype == "torch.float32" and grad is True


def test_suite_environment_reaches_the_ranks():
    names = harness.PROPAGATED_ENV
    expected = {name: os.environ.get(name) for name in names}
    for seen in run_on_ranks(read_env, 2, names, timeout=30, device="cpu"):
        assert seen == expected


def test_a_changed_suite_environment_replaces_the_pool(monkeypatch):
    before = run_on_ranks(identity, 2, timeout=30, device="cpu")
    monkeypatch.setenv("SUITE_TARGET", "some_other_target_module")
    seen = run_on_ranks(read_env, 2, ("SUITE_TARGET",), timeout=30, device="cpu")
    assert all(s["SUITE_TARGET"] == "some_other_target_module" for s in seen)
    monkeypatch.undo()
    after = run_on_ranks(identity, 2, timeout=30, device="cpu")
    assert [r[4] for r in after] != [r[4] for r in before]


def _listening_addresses(pid: int) -> list[str]:
    """Hex local addresses (as /proc/net/tcp{,6} writes them) of pid's listening TCP sockets."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    addresses = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.readlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                    addresses.append(fields[1].split(":")[0])
    return addresses


def _is_loopback(hex_address: str) -> bool:
    if len(hex_address) == 8:  # IPv4, little-endian: 127.x.y.z ends in 7F
        return hex_address.upper().endswith("7F")
    return hex_address.upper() in ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


@pytest.mark.parametrize(
    "address, loopback",
    [("0100007F", True), ("0101007F", True), ("00000000", False), ("020200C0", False),
     ("00000000000000000000000001000000", True), ("00000000000000000000000000000000", False)],
)
def test_the_loopback_check_tells_loopback_from_other_addresses(address, loopback):
    assert _is_loopback(address) is loopback


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_nothing_listens_beyond_loopback():
    """Rendezvous is a FileStore (the parent opens no port); gloo's own sockets bind to lo."""
    pids = [r[4] for r in run_on_ranks(identity, 2, timeout=30, device="cpu")]
    assert _listening_addresses(os.getpid()) == []
    rank_addresses = [a for pid in pids for a in _listening_addresses(pid)]
    assert rank_addresses, "gloo ranks listen for their peers; the check must see those sockets"
    assert all(_is_loopback(a) for a in rank_addresses), rank_addresses


# --- failures -------------------------------------------------------------------------------


def test_an_exception_on_rank_1_names_rank_case_and_traceback_without_waiting_for_the_timeout(rank_device):
    require_world_size(2, rank_device)
    run_on_ranks(identity, 2, timeout=60, device=rank_device)  # pool up before the clock starts
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_on_ranks(raise_on_rank, 2, 1, timeout=20, device=rank_device)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert info.value.rank == 1 and info.value.exc_type == "ValueError"
    assert "rank 1" in message and "raise_on_rank(1)" in message
    assert "deliberate failure on rank 1" in message and "Traceback" in message
    # a report shows the first line only: it carries the cause
    assert message.splitlines()[0].startswith("rank 1 raised ValueError: deliberate failure on rank 1 in case ")
    assert "in raise_on_rank" in info.value.rank_traceback and "_rank_main" not in info.value.rank_traceback
    assert elapsed < 10, f"rank 0 sat in an all-reduce; the failure took {elapsed:.1f} s to surface"
    # and the harness works again
    assert [r["sum"] for r in run_on_ranks(rank_and_sum, 2, 1, timeout=30, device=rank_device)] == [[3.0], [3.0]]


def test_a_failure_on_every_rank_keeps_the_pool(rank_device):
    require_world_size(2, rank_device)
    before = run_on_ranks(identity, 2, timeout=30, device=rank_device)
    with pytest.raises(RankFailure, match="symmetric assertion fails on rank 0") as info:
        run_on_ranks(raise_everywhere, 2, timeout=30, device=rank_device)
    assert "rank 1 raised AssertionError" in str(info.value)
    after = run_on_ranks(identity, 2, timeout=30, device=rank_device)
    assert [r[4] for r in after] == [r[4] for r in before]


def test_a_hung_rank_becomes_rank_timeout_naming_what_each_rank_was_doing(rank_device):
    require_world_size(2, rank_device)
    run_on_ranks(identity, 2, timeout=30, device=rank_device)  # pool up before the clock starts
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        run_on_ranks(sleep_on_rank, 2, 1, timeout=2, device=rank_device)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert 2 <= elapsed < 8, f"the timeout surfaced after {elapsed:.1f} s"
    assert info.value.stuck_ranks == (0, 1)
    assert "sleep_on_rank(1)" in message and "exceeded its timeout of 2 s" in message
    assert "rank 0: still running" in message and "rank 1: still running" in message
    if rank_device == "cpu":  # gloo blocks in the call; NCCL blocks later, where the result syncs
        assert "all_reduce" in message, "rank 0's stack shows the collective it waits in"
    assert "time.sleep" in message or "sleep_on_rank" in message
    assert run_on_ranks(identity, 2, timeout=30, device=rank_device)[1][0] == 1


def test_a_rank_waiting_for_a_finished_rank_reports_who_finished():
    with pytest.raises(RankTimeout) as info:
        run_on_ranks(sleep_on_rank, 2, 0, timeout=2, device="cpu")
    assert info.value.stuck_ranks == (0, 1) or info.value.stuck_ranks == (0,)
    assert "rank 0: still running" in str(info.value)


def test_a_rank_that_dies_is_reported_with_its_exit_code(rank_device):
    require_world_size(2, rank_device)
    run_on_ranks(identity, 2, timeout=60, device=rank_device)  # pool up before the clock starts
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_on_ranks(exit_on_rank, 2, 1, 7, timeout=20, device=rank_device)
    assert time.monotonic() - start < 10
    assert info.value.rank == 1
    assert "rank 1 died (exit code 7)" in str(info.value) and "exit_on_rank(1, 7)" in str(info.value)
    assert str(info.value).splitlines()[0].startswith("rank 1 died (exit code 7) in case ")
    assert [r[0] for r in run_on_ranks(identity, 2, timeout=30, device=rank_device)] == [0, 1]


def test_a_bare_assert_on_a_rank_is_reported_with_the_assert_itself():
    with pytest.raises(RankFailure) as info:
        run_on_ranks(bare_assert_on_rank, 2, 0, timeout=30, device="cpu")
    first = str(info.value).splitlines()[0]
    assert first.startswith("rank 0 raised AssertionError without a message at "), first
    assert "test_harness.py:" in first and "`assert ctx.rank != bad_rank`" in first, first


def test_not_offered_on_every_rank_is_not_offered_in_the_parent():
    with pytest.raises(NotOffered, match="has no get_ddp"):
        run_on_ranks(not_offered_everywhere, 2, timeout=20, device="cpu")


def test_a_verdict_on_one_rank_is_that_verdict_in_the_parent_unless_another_rank_failed():
    with pytest.raises(NotOffered, match="has no get_ddp"):
        run_on_ranks(not_offered_on_rank_0, 2, timeout=20, device="cpu")
    with pytest.raises(RankFailure, match="rank 1 raised AssertionError") as info:
        run_on_ranks(not_offered_on_rank_0_wrong_on_rank_1, 2, timeout=20, device="cpu")
    assert "rank 0 raised verdict:NotOffered" in str(info.value)


def test_an_interrupted_case_tears_the_pool_down(monkeypatch):
    """The parent stopped waiting mid-case (Ctrl-C, say): the ranks' state is unknown."""
    pids = [r[4] for r in run_on_ranks(identity, 2, timeout=30, device="cpu")]

    def interrupted(*args, **kwargs):
        raise RuntimeError("interrupted while waiting")

    monkeypatch.setattr(harness._Pool, "_collect", interrupted)
    with pytest.raises(RuntimeError, match="interrupted"):
        run_on_ranks(identity, 2, timeout=30, device="cpu")
    monkeypatch.undo()
    assert _wait_gone(pids, 5) == []
    assert [r[0] for r in run_on_ranks(identity, 2, timeout=30, device="cpu")] == [0, 1]


def test_an_unpicklable_result_is_a_rank_failure():
    with pytest.raises(RankFailure, match="unpicklable_result"):
        run_on_ranks(unpicklable_result, 2, timeout=20, device="cpu")


# --- bad input -------------------------------------------------------------------------------


def _local_fn_holder():
    def local(ctx):
        return 0

    return local


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: run_on_ranks(lambda ctx: 0, 2, device="cpu"), TypeError, "module-level"),
        (lambda: run_on_ranks(_local_fn_holder(), 2, device="cpu"), TypeError, "module-level"),
        (lambda: run_on_ranks(identity, 0, device="cpu"), ValueError, "world_size"),
        (lambda: run_on_ranks(identity, 9, device="cpu"), ValueError, "at most 8"),
        (lambda: run_on_ranks(identity, 2.0, device="cpu"), TypeError, "world_size"),
        (lambda: run_on_ranks(identity, 2, timeout=0, device="cpu"), ValueError, "timeout"),
        (lambda: run_on_ranks(identity, 2, device="tpu"), ValueError, "device"),
        (lambda: run_on_ranks("identity", 2, device="cpu"), TypeError, "callable"),
        (lambda: run_on_ranks(echo_args, 2, lambda: 0, device="cpu"), TypeError, "cannot be sent"),
    ],
)
def test_bad_input_is_a_clear_error(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_more_ranks_than_gpus_is_not_enough_devices():
    have = torch.cuda.device_count()
    with pytest.raises(NotEnoughDevices, match=f"needs {have + 2} GPUs: this machine has {have}"):
        run_on_ranks(identity, have + 2, device="cuda")
    assert list(available_world_sizes("cuda")) == list(range(1, have + 1))
    assert list(available_world_sizes("cpu")) == list(range(1, 9))


# --- lifetime ----------------------------------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); it no longer runs
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _wait_gone(pids, seconds: float) -> list[int]:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        alive = [pid for pid in pids if not _gone(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def test_shutdown_pools_kills_every_rank():
    pids = [r[4] for r in run_on_ranks(identity, 2, timeout=30, device="cpu")]
    harness.shutdown_pools()
    assert harness.live_pools() == []
    assert _wait_gone(pids, 5) == []


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repo!r})
    from conformance.harness import run_on_ranks
    from conformance.selftests.test_harness import identity
    pids = [r[4] for r in run_on_ranks(identity, 2, timeout=60, device="cpu")]
    print(" ".join(map(str, pids)), flush=True)
    os.kill(os.getpid(), 9)  # the parent dies without any cleanup
    """
)


def test_ranks_exit_when_their_parent_is_killed():
    proc = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT.format(repo=REPO)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    assert _wait_gone(pids, 5) == [], "rank processes outlived their killed parent"


# --- torchrun ------------------------------------------------------------------------------------


def _network_isolation_prefix() -> list[str]:
    """``unshare -rn`` (a private network namespace with only lo) where it works here.

    torchrun's agent always serves its TCP store on every interface; inside the namespace
    "every interface" is the loopback one.
    """
    probe = ["unshare", "-rn", "sh", "-c", "ip link set lo up"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] if ok else []


def test_the_same_case_runs_under_torchrun():
    """One slow test: torchrun --standalone --nproc-per-node 2 with gloo on the CPU
    returns what the pool returns for the same case."""
    env = dict(os.environ, SUITE_DEVICE="cpu", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = _network_isolation_prefix() + [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "conformance.harness_torchrun", "conformance.selftests.test_harness:rank_and_sum", "[3]", '{"scale": 2}',
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: the session started above
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in 180 s:\n{out}\n{err}")
    assert proc.returncode == 0, out + err
    line = next(l for l in out.splitlines() if l.startswith("RESULTS "))
    under_torchrun = json.loads(line[len("RESULTS "):])
    through_pool = run_on_ranks(rank_and_sum, 2, 3, scale=2, timeout=30, device="cpu")
    assert under_torchrun == through_pool


@pytest.mark.parametrize(
    "a, b, equal",
    [
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), True),
        (torch.tensor([0.0]), torch.tensor([-0.0]), False),  # equal values, different bits
        (torch.tensor([float("nan")]), torch.tensor([float("nan")]), True),  # same bits
        (torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64), False),
        (torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 2.0]]), False),
        ({"w": [torch.ones(2)], "step": 3}, {"w": [torch.ones(2)], "step": 3}, True),
        ({"w": [torch.ones(2)], "step": 3}, {"w": [torch.ones(2)], "step": 4}, False),
        ([torch.ones(1)], [torch.ones(1), torch.ones(1)], False),
    ],
)
def test_torchrun_expect_equal_compares_results_bitwise(a, b, equal):
    from conformance.harness_torchrun import same

    assert same(a, b) is equal


# --- the checks above catch a broken harness ----------------------------------------------------
#
# Each mutant breaks one promise on the parent side (monkeypatched for one call of the check
# that guards it); the check must fail against it.  The rank-side promises (timeouts, deaths,
# stack dumps) are guarded by checks whose failure modes are hangs, so they are shown by the
# failure-path tests above rather than by mutants here.


def _results_reversed(monkeypatch):
    run = harness._Pool.run
    monkeypatch.setattr(harness._Pool, "run", lambda self, *a, **k: list(reversed(run(self, *a, **k))))


def _symmetric_failure_respawns(monkeypatch):
    monkeypatch.setattr(harness._Pool, "_resync", lambda self: False)


def _pool_ignores_the_environment(monkeypatch):
    monkeypatch.setattr(harness, "_env_snapshot", lambda: ())


def _not_offered_is_a_failure(monkeypatch):
    failure = harness._Pool._failure

    def failure_without_conversion(self, state, case, expect):
        exc = failure(self, state, case, expect)
        return RankFailure(str(exc)) if isinstance(exc, NotOffered) else exc

    monkeypatch.setattr(harness._Pool, "_failure", failure_without_conversion)


HARNESS_MUTANTS = [
    (_results_reversed, lambda mp: test_results_come_back_in_rank_order(2, "cpu")),
    (_symmetric_failure_respawns, lambda mp: test_a_failure_on_every_rank_keeps_the_pool("cpu")),
    (_pool_ignores_the_environment, lambda mp: test_a_changed_suite_environment_replaces_the_pool(mp)),
    (_not_offered_is_a_failure, lambda mp: test_not_offered_on_every_rank_is_not_offered_in_the_parent()),
]


@pytest.mark.parametrize("mutant, check", HARNESS_MUTANTS, ids=[m.__name__.strip("_") for m, _ in HARNESS_MUTANTS])
def test_each_harness_mutant_is_caught_by_its_check(mutant, check):
    with pytest.MonkeyPatch.context() as mp:
        mutant(mp)
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            check(mp)
