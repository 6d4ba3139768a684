"""The distributed worker harness: run one case on every rank of a live process pool.

Every distributed check (DDP, sharded optimizer, conformance) goes through this module::

    from conformance.harness import RankContext, run_on_ranks

    def allreduce_sum(ctx: RankContext, n: int):          # module level: pickled by reference
        t = torch.full((n,), float(ctx.rank + 1), device=ctx.device)
        torch.distributed.all_reduce(t)
        return t.cpu()                                      # results must be picklable

    results = run_on_ranks(allreduce_sum, 2, 3, timeout=10)   # [r0_result, r1_result]

Contract
    ``run_on_ranks(fn, world_size, *args, timeout=60, device=None, **kwargs)`` runs
    ``fn(ctx, *args, **kwargs)`` once on every rank of a pool of ``world_size`` processes
    whose default ``torch.distributed`` process group is already initialised, and returns
    the per-rank results ``[r0, ..., r_{W-1}]``.

    - ``fn`` must be a module-level function (it is pickled by reference); ``args``,
      ``kwargs`` and the results must be picklable.  Tensors in a result (at any depth of
      lists/tuples/dicts) are detached and moved to the CPU on the rank before they travel.
    - Device: ``device=None`` reads ``SUITE_DEVICE`` (``auto|cpu|cuda``, set by
      conftest.py; ``auto`` means CUDA when present).  ``cpu`` uses gloo, world sizes 1..8
      (oversubscribed processes are fine; each rank gets ``cpu_count // world_size``
      intra-op threads, at least one).  ``cuda`` uses NCCL with rank r on ``cuda:r``;
      a world size above ``torch.cuda.device_count()`` raises ``NotEnoughDevices``
      (conftest.py reports it as a skip "needs N GPUs").
    - Pools: one per (world size, backend), started lazily and reused across tests and
      Hypothesis examples, so a case costs milliseconds (perf/notes/RESULTS.md).  Ranks
      are forked from a ``multiprocessing`` fork server that imported torch and this
      module once (``SUITE_HARNESS_START=spawn`` starts each rank from scratch instead):
      on the 2-core box an eight-rank pool starts in about 0.2 s, against about 9 s when
      every rank imports torch itself.  Several pools can be
      alive at once, up to ``SUITE_HARNESS_MAX_RANKS`` (12) rank processes in all; the
      least recently used pool is closed first.  A pool is replaced when a case asks for
      a timeout longer than its collectives' timeout, or when the suite's environment
      changed (below).
    - Helpers: ``available_world_sizes(device)`` (a range), ``require_world_size(n,
      device)`` (skips a test with "needs N GPUs"), ``resolve_device(device)``,
      ``live_pools()``, ``shutdown_pools()``.
    - Rendezvous: a ``FileStore`` in a fresh temporary directory per pool, so pytest-xdist
      workers never collide and no store listens on a port.  gloo and NCCL bootstrap
      sockets are pinned to the loopback interface (``GLOO_SOCKET_IFNAME`` /
      ``NCCL_SOCKET_IFNAME`` = ``lo`` unless the user set them).
    - Timeouts: every collective has the process group's timeout (at least 60 s and at
      least the case timeout); the parent waits at most ``timeout`` seconds per case.
      A rank still busy then becomes ``RankTimeout``: it names the case and, per rank,
      whether it finished or what it was doing (its phase and its Python stack, dumped by
      ``faulthandler``).  A rank that raises becomes ``RankFailure`` naming the rank, the
      case and the rank's traceback, at once: the parent does not wait for the timeout
      while other ranks sit in a collective.  A rank that dies (``os._exit``, a signal) is
      a ``RankFailure`` with its exit code.  After any of these the pool is killed and
      the next call starts a fresh one; the one exception is a case where *every* rank
      raised (a symmetric failed assertion, a verdict such as "not offered"): the ranks
      re-synchronise with a barrier and the pool is kept, so a failing Hypothesis example
      does not pay for a respawn.  After the first rank raises, the others get as long
      again as it took (1 to 15 s) to raise too -- on a loaded machine ranks running the
      same code raise seconds apart -- and no longer once every one of them sleeps (Linux:
      blocked in a collective the raising rank will not join).
    - Time budgets: inside ``with time_budget(seconds, what)`` (a law's budget, set by
      ``conformance.lawbook.BudgetedLaw``) every case's timeout is cut to what is left
      of it; a case cut so is ``LawBudgetSpent`` (a ``RankTimeout``: "undecided", with
      where each rank was), and a case asked for once the budget is spent raises it at
      once.  The first start of a pool of each world size is not charged to the budget
      (a respawn after a failure is).  ``budget_left()`` tells the seconds left (None
      outside a budget), ``pool_startup_seconds()`` the time spent starting pools.
    - Verdicts: a rank passes its exception through ``conformance.verdicts.classify``
      (inside the rank, where the traceback still has its frames); when no rank died and
      every rank that raised reached a verdict (not offered, needs hardware, an
      environment refusal), the lowest such rank's verdict is raised in the parent,
      rebuilt by class name, instead of a ``RankFailure``.  The harness does not know
      what any verdict means.
    - Isolation: after each case, every rank restores grad mode and the default dtype
      and passes a barrier (which also drains the group's pending asynchronous work;
      NCCL ranks synchronise their device) before it reports its result; the parent
      sends the next case only when every rank has reported.  A case must complete every
      communication it starts (wait on its async handles, match every send with a recv);
      seeding (``torch.manual_seed``) is the case's job.
    - Environment: ranks take the parent's environment and ``sys.path`` as they are when
      the pool starts (``SUITE_DEVICE``, ``SUITE_TARGET``, ``TRITON_INTERPRET``, a target's
      directory, ...), not the fork server's; a pool whose snapshot of those three
      variables differs from the current environment is replaced.  The fork server
      imports only what reads no suite variable at import (torch, this module).
    - Lifetime: ``shutdown_pools()`` kills every pool; it runs at interpreter exit and
      from conftest.py's ``pytest_sessionfinish``.  Ranks are daemon processes and also
      exit by themselves within about a second when their parent dies.

torchrun
    The same case functions run under ``torchrun`` for users past one machine; the
    process group then comes from torchrun's environment::

        torchrun --standalone --nproc-per-node 2 -m conformance.harness_torchrun \\
            conformance.selftests.test_harness:rank_and_sum '[3]' '{"scale": 2}'

    See ``conformance/harness_torchrun.py``: each rank runs the case once, rank 0 gathers
    the results with ``all_gather_object`` and prints them as one JSON line
    (``--expect-equal`` fails unless every rank returned the same result).  Unlike the
    pool, torchrun's agent serves its TCP store on every interface (torch binds it so,
    whatever host is named); the suite's one torchrun test therefore runs it inside a
    private network namespace (``unshare -rn``) where that works.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import pickle
import re
import reprlib
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import connection as mp_connection
from typing import Any, Callable

import torch

from conformance import verdicts

MAX_CPU_WORLD_SIZE = 8
# Collectives time out after this many seconds at least (the case timeout if larger).
MIN_COLLECTIVE_TIMEOUT_S = 60.0
# Starting a pool imports torch in every rank: slow on 2 oversubscribed cores.
STARTUP_TIMEOUT_S = float(os.environ.get("SUITE_HARNESS_STARTUP_TIMEOUT", "240"))
# Live rank processes kept per parent; the least recently used pools go first.
MAX_LIVE_RANKS = int(os.environ.get("SUITE_HARNESS_MAX_RANKS", "12"))
# Environment that changes what a rank computes: a pool started under other values is replaced.
PROPAGATED_ENV = ("SUITE_DEVICE", "SUITE_TARGET", "TRITON_INTERPRET")
# After one rank raises, how long to wait for the others to raise too (then the pool is
# kept): as long again as the first took, within these bounds (a fresh rank's first case
# imports for seconds on a loaded machine, so ranks running the same code raise seconds
# apart), and no longer once every pending rank has slept this long (blocked in a collective).
_SYMMETRIC_FAILURE_GRACE_S = (1.0, 15.0)
_BLOCKED_FOR_S = 0.3
_RESYNC_TIMEOUT_S = 5.0
_STACK_DUMP_WAIT_S = 1.0


# --- public types ----------------------------------------------------------------------


@dataclass
class RankContext:
    """What a case function receives as its first argument."""

    rank: int
    world_size: int
    device: torch.device  # cpu, or cuda:<rank> with NCCL
    backend: str  # "gloo" or "nccl"


_SIGNALS = {6: "SIGABRT: an abort, e.g. gloo or NCCL on mismatched collectives", 9: "SIGKILL", 11: "SIGSEGV: a crash in native code"}


def _last_frame(tb: str) -> str:
    """The innermost 'File "...", line N' of a formatted traceback, with its source line."""
    lines = tb.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "([^"]+)", line (\d+)', lines[i])
        if m:
            source = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].lstrip().startswith("File ") else ""
            return f"{m.group(1)}:{m.group(2)}" + (f": `{source}`" if source else "")
    return ""


def _cause(state: "_CaseState", rank: int) -> str:
    """What went wrong on the blamed rank, for the failure's first line (a report shows only
    that line): its exception and message, where it was raised when there is no message,
    or how it died."""
    if rank in state.dead:
        code = state.dead[rank]
        how = _SIGNALS.get(-code) if isinstance(code, int) and code < 0 else None
        return f"died (exit code {code}{', ' + how if how else ''})"
    exc_type, tb = state.errors[rank]
    if exc_type.startswith("verdict:"):
        return "failed"
    message = (state.messages.get(rank) or "").strip().splitlines()
    if message:
        return f"raised {exc_type}: {message[0][:200]}"
    where = _last_frame(tb)
    return f"raised {exc_type} without a message" + (f" at {where}" if where else "")


class RankFailure(AssertionError):
    """A rank raised (or died) while running a case.

    ``rank`` is the rank blamed first (a dead rank before one that raised), ``case`` the
    case's description, ``exc_type`` the exception's type name ("" for a dead rank),
    ``exc_message`` its ``str()`` and ``rank_traceback`` the rank's formatted traceback.
    """

    def __init__(
        self, message: str, *, rank: int | None = None, case: str = "", exc_type: str = "",
        rank_traceback: str = "", exc_message: str = "",
    ):
        super().__init__(message)
        self.rank = rank
        self.case = case
        self.exc_type = exc_type
        self.rank_traceback = rank_traceback
        self.exc_message = exc_message


class RankTimeout(AssertionError):
    """A case did not finish on every rank within its timeout.

    ``stuck_ranks`` lists the ranks that had not finished; the message says per rank
    whether it finished or what it was doing (phase and Python stack).
    """

    def __init__(self, message: str, *, case: str = "", stuck_ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.case = case
        self.stuck_ranks = stuck_ranks


class LawBudgetSpent(RankTimeout):
    """A case cut short, or never started, because the running law's time budget
    (``time_budget``) was spent: the law could not decide in time.  A failure ("undecided"),
    never a pass; the message says where each rank was."""


class NotEnoughDevices(verdicts.NeedsHardware):
    """The requested world size needs more GPUs than this machine has.

    The message starts with "needs N GPUs" ("needs a GPU" for one), the reason conftest.py
    skips with.
    """


# --- devices and world sizes --------------------------------------------------------------


def rank_threads(world_size: int) -> int:
    """Intra-op threads of each CPU rank: the machine's cores shared among the ranks."""
    return max(1, (os.cpu_count() or 1) // world_size)


@contextlib.contextmanager
def threads_of_ranks(world_size: int):
    """Run a single-process reference with the intra-op thread count of W CPU ranks.

    CPU kernels split their reductions by thread (measured: the same embedding backward
    differs in 79 of 102 elements between 1 and 2 threads), so a reference that must match
    the ranks bit for bit has to use their thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(rank_threads(world_size))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_device(device: str | torch.device | None = None) -> str:
    """'cpu' or 'cuda': ``device`` if given, else ``SUITE_DEVICE`` (auto|cpu|cuda)."""
    choice = device if device is not None else os.environ.get("SUITE_DEVICE", "auto")
    if isinstance(choice, torch.device):
        choice = choice.type
    if not isinstance(choice, str):
        raise TypeError(f"device must be a str, torch.device or None, got {type(choice).__name__}")
    choice = choice.split(":", 1)[0]
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {choice!r}")
    return choice


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def available_world_sizes(device: str | torch.device | None = None) -> range:
    """The world sizes ``run_on_ranks`` can run on this machine for this device."""
    dev = resolve_device(device)
    if dev == "cuda":
        return range(1, torch.cuda.device_count() + 1)
    return range(1, MAX_CPU_WORLD_SIZE + 1)


def pinned_world_size() -> int | None:
    """The world size every drawn distributed case uses, when pinned (``--world-size N``,
    environment ``SUITE_WORLD_SIZE``): a scale run on a large host.  None: drawn."""
    raw = os.environ.get("SUITE_WORLD_SIZE", "")
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"SUITE_WORLD_SIZE / --world-size must be a positive integer, got {raw!r}")
    return int(raw)


def check_world_size(world_size: int, device: str | torch.device | None = None) -> None:
    """Raise ValueError/TypeError for a bad world size, NotEnoughDevices for too few GPUs."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    dev = resolve_device(device)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if dev == "cuda":
        have = torch.cuda.device_count()
        if world_size > have:
            need = "a GPU" if world_size == 1 else f"{world_size} GPUs"
            raise NotEnoughDevices(f"needs {need}: this machine has {have}")
    elif world_size > MAX_CPU_WORLD_SIZE:
        raise ValueError(f"world_size on the CPU must be at most {MAX_CPU_WORLD_SIZE}, got {world_size}")


def require_world_size(world_size: int, device: str | torch.device | None = None) -> None:
    """In a test: skip with "needs N GPUs: ..." unless ``world_size`` ranks can run here."""
    try:
        check_world_size(world_size, device)
    except NotEnoughDevices as exc:
        import pytest

        pytest.skip(str(exc))


# --- case descriptions --------------------------------------------------------------------


class _ShortRepr(reprlib.Repr):
    """reprlib with tensors shown as shape and dtype, never their values."""

    def __init__(self):
        super().__init__()
        self.maxstring = 40
        self.maxother = 40
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 4

    def repr1(self, x, level):
        if isinstance(x, torch.Tensor):
            kind = "Parameter" if isinstance(x, torch.nn.Parameter) else "tensor"
            return f"{kind}(shape={tuple(x.shape)}, dtype={str(x.dtype).replace('torch.', '')}, device={x.device})"
        return super().repr1(x, level)


_short = _ShortRepr()


def describe_case(fn: Callable, args: tuple = (), kwargs: dict | None = None, limit: int = 240) -> str:
    """``module.fn(arg, ..., key=value)`` with long values abbreviated."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    parts = [_short.repr(a) for a in args]
    parts += [f"{k}={_short.repr(v)}" for k, v in (kwargs or {}).items()]
    text = f"{name}({', '.join(parts)})"
    return text if len(text) <= limit else text[: limit - 4] + "...)"


# --- the rank process ---------------------------------------------------------------------


def _results_to_cpu(obj):
    """Detach and move every tensor in a (nested) list/tuple/dict to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, list):
        return [_results_to_cpu(x) for x in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_results_to_cpu(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _results_to_cpu(v) for k, v in obj.items()}
    return obj


def _loopback_interface() -> str | None:
    import socket

    names = {name for _, name in socket.if_nameindex()}
    for candidate in ("lo", "lo0"):
        if candidate in names:
            return candidate
    return None


def _exit_when_parent_dies(parent_pid: int) -> None:
    """Watchdog thread: a rank never outlives its parent (even while a case is stuck).

    A forked-from-server rank's OS parent is the fork server, so the parent is watched
    through multiprocessing's sentinel (readable once the process that started the
    server or the spawn is gone), with the OS parent as a fallback for spawned ranks."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    spawned = os.getppid() == parent_pid
    while True:
        if sentinel is not None and mp_connection.wait([sentinel], timeout=0.5):
            os._exit(3)
        if sentinel is None:
            time.sleep(0.5)
        if spawned and os.getppid() != parent_pid:
            os._exit(3)


def _rank_main(rank, world_size, backend, store_path, collective_timeout_s, conn, parent_pid, stack_path,
               environ=None, sys_path=None):
    """Body of one rank process: join the group, then run cases until told to stop."""
    if environ is not None:  # the parent's, now: a forked rank would otherwise have the server's
        os.environ.clear()
        os.environ.update(environ)
    if sys_path is not None:
        sys.path[:] = sys_path
    threading.Thread(target=_exit_when_parent_dies, args=(parent_pid,), daemon=True, name="parent-watchdog").start()
    stack_file = open(stack_path, "w")  # the parent sends SIGUSR1 to get a stack dump here
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    loopback = _loopback_interface()
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)

    import torch.distributed as dist

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
            torch.set_num_threads(rank_threads(world_size))
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=collective_timeout_s)
        )
        _barrier(dist, backend, rank)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", 0, type(exc).__name__, traceback.format_exc()))
        return
    ctx = RankContext(rank=rank, world_size=world_size, device=device, backend=backend)
    default_dtype = torch.get_default_dtype()
    conn.send(("ready", 0, threading.get_ident()))

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        kind, case_id = message[0], message[1]
        if kind == "stop":
            break
        if kind == "resync":  # every rank raised in the last case: meet again, then go on
            try:
                _barrier(dist, backend, rank)
                conn.send(("synced", case_id))
            except BaseException as exc:  # noqa: BLE001
                conn.send(("error", case_id, type(exc).__name__, traceback.format_exc()))
            continue
        try:
            conn.send(("phase", case_id, "unpickling the case"))
            fn, args, kwargs = pickle.loads(message[2])
            conn.send(("phase", case_id, f"running {getattr(fn, '__qualname__', fn)}"))
            result = fn(ctx, *args, **kwargs)
            conn.send(("phase", case_id, "pickling the result"))
            payload = pickle.dumps(_results_to_cpu(result), protocol=pickle.HIGHEST_PROTOCOL)
            conn.send(("phase", case_id, "finished the case; waiting in the post-case barrier"))
            torch.set_grad_enabled(True)
            torch.set_default_dtype(default_dtype)
            _barrier(dist, backend, rank)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            verdict = _classify(exc)
            etype = f"verdict:{type(verdict).__name__}" if verdict is not None else type(exc).__name__
            message = str(verdict) if verdict is not None else str(exc)
            conn.send(("error", case_id, etype, _format_case_exception(exc), message))
            continue
        conn.send(("result", case_id, payload))

    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


def _classify(exc: BaseException):
    try:
        return verdicts.classify(exc)
    except Exception:  # noqa: BLE001 - a rule that breaks must not lose the rank's own error
        return None


def _format_case_exception(exc: BaseException) -> str:
    """The traceback from the case's own frames on (the harness's loop frame left out)."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is _rank_main.__code__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _barrier(dist, backend, rank):
    if backend == "nccl":
        dist.barrier(device_ids=[rank])
        torch.cuda.synchronize()
    else:
        dist.barrier()


# --- the pool (parent side) ---------------------------------------------------------------


# Imported once by the fork server, so a rank starts without importing torch.  Nothing here
# may read a suite variable at import (a Triton kernel module would fix the interpreter;
# triton itself reads TRITON_INTERPRET only when a kernel is decorated).
# torch._inductor.config: torch.use_deterministic_algorithms imports it (and with it dynamo,
# sympy and triton: 3 s of CPU a rank, over 20 s on a loaded 2-core machine) on first use in every
# rank that calls it; hypothesis: every laws package's strategies module imports it.
_SERVER_PRELOAD = ["conformance.harness", "torch.distributed", "torch._inductor.config", "hypothesis"]


def _start_context(mp):
    """Ranks fork from a server that has torch imported; spawn where there is no fork server
    or ``SUITE_HARNESS_START=spawn`` asks for it."""
    method = os.environ.get("SUITE_HARNESS_START", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"SUITE_HARNESS_START must be forkserver or spawn, got {method!r}")
    if method == "forkserver" and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_SERVER_PRELOAD)
        return ctx
    return mp.get_context("spawn")


class _Pool:
    """``world_size`` live rank processes sharing one process group."""

    def __init__(self, world_size: int, backend: str, collective_timeout_s: float, env: tuple):
        self.world_size = world_size
        self.backend = backend
        self.collective_timeout_s = collective_timeout_s
        self.env = env
        self.procs: list = []
        self.conns: list = []
        self.main_thread_ids: list[int | None] = [None] * world_size
        self.tmpdir = tempfile.mkdtemp(prefix=f"harness-w{world_size}-")
        self.next_case_id = 1
        self.closed = False

    @property
    def label(self) -> str:
        return f"world size {self.world_size} ({self.backend})"

    def _stack_path(self, rank: int) -> str:
        return os.path.join(self.tmpdir, f"rank{rank}.stacks")

    # startup -----------------------------------------------------------------

    def start(self) -> None:
        import multiprocessing as mp

        ctx = _start_context(mp)
        store_path = os.path.join(self.tmpdir, "store")
        environ, sys_path = dict(os.environ), list(sys.path)
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=_rank_main,
                args=(rank, self.world_size, self.backend, store_path, self.collective_timeout_s, child_end, os.getpid(),
                      self._stack_path(rank), environ, sys_path),
                name=f"harness-rank{rank}-of-{self.world_size}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            self.procs.append(proc)
            self.conns.append(parent_end)
        case = f"starting the pool of {self.label}"
        state = self._collect(0, case, STARTUP_TIMEOUT_S, expect="ready")
        for rank, message in enumerate(state.results):
            self.main_thread_ids[rank] = message

    # one case ----------------------------------------------------------------

    def run(self, payload: bytes, case: str, timeout: float) -> list:
        case_id = self.next_case_id
        self.next_case_id += 1
        for rank, conn in enumerate(self.conns):
            try:
                conn.send(("case", case_id, payload))
            except (BrokenPipeError, OSError):
                self.procs[rank].join(timeout=0.5)
                code = self.procs[rank].exitcode
                self.close()
                raise RankFailure(
                    f"rank {rank} of {self.label} was dead (exit code {code}) before case {case} started; "
                    "the pool was torn down",
                    rank=rank,
                    case=case,
                )
        state = self._collect(case_id, case, timeout, expect="result")
        results = []
        for rank, data in enumerate(state.results):
            try:
                results.append(pickle.loads(data))
            except Exception as exc:  # noqa: BLE001 - the ranks are fine; the parent cannot read this
                raise RankFailure(
                    f"the result of rank {rank} in case {case} cannot be unpickled in the parent: "
                    f"{type(exc).__name__}: {exc}",
                    rank=rank, case=case, exc_type=type(exc).__name__,
                ) from exc
        return results

    def _collect(self, case_id: int, case: str, timeout: float, expect: str) -> "_CaseState":
        """Wait for ``expect`` from every rank; raise RankFailure/RankTimeout otherwise."""
        state = _CaseState(self.world_size)
        started = time.monotonic()
        deadline = started + timeout
        while state.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout(state, case, timeout)
            waitables = {}
            for rank in state.pending:
                waitables[self.conns[rank]] = ("conn", rank)
                waitables[self.procs[rank].sentinel] = ("proc", rank)
            for ready in mp_connection.wait(list(waitables), timeout=remaining):
                what, rank = waitables[ready]
                if what == "conn":
                    self._receive(rank, case_id, expect, state)
                else:
                    self._drain(rank, case_id, expect, state)
                    if rank in state.pending:
                        self._mark_dead(rank, state)
            if state.errors or state.dead:
                self._settle_failure(state, case_id, expect, deadline, time.monotonic() - started)
                raise self._failure(state, case, expect)
        return state

    def _receive(self, rank: int, case_id: int, expect: str, state: "_CaseState") -> None:
        try:
            message = self.conns[rank].recv()
        except (EOFError, OSError):
            self._mark_dead(rank, state)
            return
        kind, msg_case = message[0], message[1]
        if msg_case != case_id:
            return  # a stale message from an earlier case
        if kind == "phase":
            state.phase[rank] = message[2]
        elif kind == expect:
            state.results[rank] = message[2] if len(message) > 2 else None
            state.pending.discard(rank)
        elif kind == "error":
            state.errors[rank] = (message[2], message[3])
            state.messages[rank] = message[4] if len(message) > 4 else ""
            state.pending.discard(rank)

    def _mark_dead(self, rank: int, state: "_CaseState") -> None:
        self.procs[rank].join(timeout=1.0)
        state.dead[rank] = self.procs[rank].exitcode
        state.pending.discard(rank)

    def _drain(self, rank: int, case_id: int, expect: str, state: "_CaseState") -> None:
        try:
            while rank in state.pending and self.conns[rank].poll():
                self._receive(rank, case_id, expect, state)
        except (EOFError, OSError):
            pass

    def _settle_failure(self, state: "_CaseState", case_id: int, expect: str, deadline: float, took: float) -> None:
        """After a failure (``took`` seconds into the case), give the other ranks as long
        again to report too, within ``_SYMMETRIC_FAILURE_GRACE_S``, and no longer once every
        one of them is blocked (sleeping: in a collective the raising rank will not join)."""
        low, high = _SYMMETRIC_FAILURE_GRACE_S
        grace_end = min(deadline, time.monotonic() + min(high, max(low, took)))
        blocked_since = None
        while state.pending and not state.dead:
            now = time.monotonic()
            remaining = grace_end - now
            if remaining <= 0:
                break
            if all(_sleeping(self.procs[rank].pid) for rank in state.pending):
                blocked_since = blocked_since or now
                if now - blocked_since >= _BLOCKED_FOR_S:
                    break
            else:
                blocked_since = None
            remaining = min(remaining, 0.05)
            waitables = {}
            for rank in state.pending:
                waitables[self.conns[rank]] = ("conn", rank)
                waitables[self.procs[rank].sentinel] = ("proc", rank)
            for ready in mp_connection.wait(list(waitables), timeout=remaining):
                what, rank = waitables[ready]
                if what == "conn":
                    self._receive(rank, case_id, expect, state)
                else:
                    self._drain(rank, case_id, expect, state)
                    if rank in state.pending:
                        self._mark_dead(rank, state)
        # A rank that dies often makes its peers raise: notice deaths that are on their way.
        for rank, proc in enumerate(self.procs):
            if rank not in state.dead and rank not in state.errors and not proc.is_alive():
                self._mark_dead(rank, state)

    def _failure(self, state: "_CaseState", case: str, expect: str) -> Exception:
        keep = (
            expect == "result"
            and not state.dead
            and not state.pending
            and len(state.errors) == self.world_size
            and self._resync()
        )
        lines = []
        if state.dead:
            first = min(state.dead)
            for rank, code in sorted(state.dead.items()):
                lines.append(f"rank {rank} died (exit code {code}) while {state.phase[rank]}")
            exc_type, tb = "", ""
        else:
            # blame a rank with a real error before one that reached a verdict
            real = [r for r, (etype, _) in state.errors.items() if not etype.startswith("verdict:")]
            first = min(real or state.errors)
            exc_type, tb = state.errors[first]
        for rank, (etype, rank_tb) in sorted(state.errors.items()):
            lines.append(f"rank {rank} raised {etype} while {state.phase[rank]}:\n{_indent(rank_tb)}")
        for rank in sorted(state.pending):
            lines.append(f"rank {rank} had not finished ({state.phase[rank]})")
        for rank in sorted(set(range(self.world_size)) - state.pending - set(state.errors) - set(state.dead)):
            lines.append(f"rank {rank} finished")
        head = f"rank {first} {_cause(state, first)} in case {case} on {self.label}"
        tail = "the pool was kept (every rank raised and they re-synchronised)" if keep else "the pool was torn down"
        message = head + "\n" + "\n".join(lines) + "\n" + tail
        if not keep:
            self.close()
        if not state.dead and state.errors and all(etype.startswith("verdict:") for etype, _ in state.errors.values()):
            # the ranks that raised reached a verdict (not offered, needs hardware, ...): not a failure
            verdict = verdicts.rebuild(exc_type.removeprefix("verdict:"), state.messages.get(first, ""))
            if verdict is not None:
                return verdict
        return RankFailure(
            message, rank=first, case=case, exc_type=exc_type, rank_traceback=tb, exc_message=state.messages.get(first, "")
        )

    def _resync(self) -> bool:
        """Every rank raised: bring them back to a barrier; False if that fails."""
        case_id = self.next_case_id
        self.next_case_id += 1
        try:
            for conn in self.conns:
                conn.send(("resync", case_id))
            self._collect(case_id, "re-synchronising after a failed case", _RESYNC_TIMEOUT_S, expect="synced")
        except (AssertionError, OSError):
            return False
        return True

    def _timeout(self, state: "_CaseState", case: str, timeout: float) -> RankTimeout:
        stuck = sorted(state.pending)
        stacks = self._dump_stacks(stuck)
        lines = []
        for rank in range(self.world_size):
            if rank in state.pending:
                lines.append(f"rank {rank}: still running ({state.phase[rank]}); its stack:\n{_indent(stacks.get(rank) or '(no stack dump)')}")
            elif rank in state.errors:
                lines.append(f"rank {rank}: raised {state.errors[rank][0]}")
            else:
                lines.append(f"rank {rank}: finished")
        message = (
            f"case {case} on {self.label} exceeded its timeout of {timeout:g} s; stuck: ranks {stuck}\n"
            + "\n".join(lines)
            + "\nthe pool was torn down"
        )
        self.close()
        return RankTimeout(message, case=case, stuck_ranks=tuple(stuck))

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Ask stuck ranks for their Python stacks (faulthandler on SIGUSR1)."""
        if not hasattr(signal, "SIGUSR1"):
            return {}
        sizes = {}
        for rank in ranks:
            path = self._stack_path(rank)
            sizes[rank] = os.path.getsize(path) if os.path.exists(path) else 0
            if self.procs[rank].is_alive():
                try:
                    os.kill(self.procs[rank].pid, signal.SIGUSR1)
                except OSError:
                    pass
        stacks: dict[int, str] = {}
        end = time.monotonic() + _STACK_DUMP_WAIT_S
        while time.monotonic() < end and len(stacks) < len(ranks):
            time.sleep(0.02)
            for rank in ranks:
                path = self._stack_path(rank)
                if rank in stacks or not os.path.exists(path) or os.path.getsize(path) <= sizes[rank]:
                    continue
                time.sleep(0.05)  # let the dump finish
                with open(path) as f:
                    f.seek(sizes[rank])
                    stacks[rank] = _main_thread_stack(f.read(), self.main_thread_ids[rank])
        return stacks

    # teardown ----------------------------------------------------------------

    def close(self) -> None:
        """Kill the ranks and forget the pool; safe to call twice and from a failed close."""
        key = getattr(self, "key", None)
        if _POOLS.get(key) is self:
            del _POOLS[key]
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            try:
                conn.send(("stop", 0))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        try:
            for proc in self.procs:
                proc.join(timeout=5.0)
        finally:
            for conn in self.conns:
                conn.close()
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def alive(self) -> bool:
        return not self.closed and all(p.is_alive() for p in self.procs)


class _CaseState:
    def __init__(self, world_size: int):
        self.pending = set(range(world_size))
        self.results: list = [None] * world_size
        self.errors: dict[int, tuple[str, str]] = {}
        self.dead: dict[int, int | None] = {}
        self.messages: dict[int, str] = {}  # str(exception) per rank that raised
        self.phase = ["waiting for the case"] * world_size


def _sleeping(pid: int | None) -> bool:
    """Whether a process's main thread sleeps (Linux ``/proc``: state S), as a rank blocked
    in a collective does; False where that cannot be read (then only the grace time counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "S"
    except (OSError, IndexError):
        return False


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def _main_thread_stack(dump: str, main_ident: int | None) -> str:
    """The main thread's frames from a faulthandler dump, down to the case function.

    The frames below the harness's rank loop (multiprocessing's bootstrap) say nothing
    about the case and are left out; the whole dump is kept if the thread is not found.
    """
    blocks = [b for b in dump.strip().split("\n\n") if b.strip()]
    if main_ident is not None:
        marker = f"0x{main_ident:016x}"
        blocks = [b for b in blocks if marker in b.splitlines()[0]] or blocks
    kept = []
    for block in blocks:
        for line in block.splitlines():
            if "in _rank_main" in line:
                break
            kept.append(line)
        kept.append("")
    return "\n".join(kept).strip()


# --- the registry of pools ----------------------------------------------------------------

_POOLS: dict[tuple, _Pool] = {}
_LOCK = threading.RLock()


def _env_snapshot() -> tuple:
    return tuple((name, os.environ.get(name)) for name in PROPAGATED_ENV)


def _get_pool(world_size: int, backend: str, timeout: float) -> _Pool:
    env = _env_snapshot()
    for key, pool in list(_POOLS.items()):
        w, b, t, e = key
        if (w, b) == (world_size, backend) and (e != env or t < timeout or not pool.alive()):
            pool.close()
    for key in list(_POOLS):
        if key[:2] == (world_size, backend):
            pool = _POOLS.pop(key)
            _POOLS[key] = pool  # most recently used last
            return pool
    _make_room(world_size)
    collective_timeout = max(MIN_COLLECTIVE_TIMEOUT_S, float(timeout))
    pool = _Pool(world_size, backend, collective_timeout, env)
    pool.key = (world_size, backend, collective_timeout, env)
    _POOLS[pool.key] = pool
    started = time.monotonic()
    try:
        pool.start()
    except BaseException:
        pool.close()
        raise
    _charge_startup((world_size, backend), time.monotonic() - started)
    return pool


def _make_room(world_size: int) -> None:
    live = sum(p.world_size for p in _POOLS.values())
    for pool in list(_POOLS.values()):  # oldest first
        if live + world_size <= MAX_LIVE_RANKS:
            break
        live -= pool.world_size
        pool.close()


def live_pools() -> list[tuple[int, str]]:
    """(world size, backend) of every live pool, oldest first."""
    with _LOCK:
        return [(p.world_size, p.backend) for p in _POOLS.values() if p.alive()]


def shutdown_pools() -> None:
    """Kill every pool's rank processes (also runs at exit and at pytest session finish)."""
    with _LOCK:
        for pool in list(_POOLS.values()):
            pool.close()
        _POOLS.clear()


atexit.register(shutdown_pools)


# --- the entry point ----------------------------------------------------------------------


def run_on_ranks(fn: Callable, world_size: int, *args, timeout: float = 60.0, device: str | torch.device | None = None, **kwargs) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on every rank of a live pool of ``world_size``
    processes (``torch.distributed`` default group already initialised) and return the
    per-rank results ``[r0, ..., r_{W-1}]``.

    ``fn`` must be a module-level function (pickled by reference); args and results must
    be picklable (tensors in results are moved to the CPU).  Raises RankFailure when a
    rank raises or dies, RankTimeout when the case takes longer than ``timeout`` seconds,
    LawBudgetSpent when it would outlast the ``time_budget`` it runs in, NotEnoughDevices
    when CUDA has fewer GPUs than ``world_size``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable, got {type(fn).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    dev = resolve_device(device)
    check_world_size(world_size, dev)
    qualname = getattr(fn, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(f"fn must be a module-level function (it is pickled by reference); got {qualname}")
    case = describe_case(fn, args, kwargs)
    try:
        payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - pickling errors come in many types
        raise TypeError(f"case {case} cannot be sent to the ranks: {type(exc).__name__}: {exc}") from exc
    with _LOCK:
        pool = _get_pool(world_size, backend_for(dev), timeout)
        budget = _binding_budget()  # after the pool's start: a rank's startup is not the case's
        left = None if budget is None else budget.left()
        if left is not None and left <= 0:
            raise LawBudgetSpent(f"undecided: the {budget.what}'s time budget of {budget.seconds:g} s was spent before case "
                                 f"{case} started on {pool.label}", case=case)
        cut = left is not None and left < timeout
        try:
            return pool.run(payload, case, float(left if cut else timeout))
        except RankTimeout as exc:
            if not cut:
                raise
            raise LawBudgetSpent(
                f"undecided: the {budget.what}'s time budget of {budget.seconds:g} s ran out while case {case} ran on "
                f"{pool.label} (its own timeout is {timeout:g} s); where the ranks were:\n" + str(exc),
                case=exc.case, stuck_ranks=exc.stuck_ranks) from None
        except (RankFailure, verdicts.Verdict):
            raise  # the pool was kept or torn down as the failure required (a verdict: as a failure)
        except BaseException:
            pool.close()  # interrupted mid-case (Ctrl-C): the ranks' state is unknown
            raise


# --- time budgets -----------------------------------------------------------------------------

class _Budget:
    def __init__(self, seconds: float, what: str):
        self.seconds, self.what = float(seconds), what
        self.deadline = time.monotonic() + self.seconds
        self.pools_started: set[tuple[int, str]] = set()

    def left(self) -> float:
        return self.deadline - time.monotonic()


_BUDGETS: list[_Budget] = []  # innermost last
_STARTUP_S = [0.0]  # seconds spent starting pools in this process


@contextlib.contextmanager
def time_budget(seconds: float, what: str = "law"):
    """Inside, every case's timeout is cut to what is left of ``seconds``: a case cut so, or
    asked for once they are spent, raises ``LawBudgetSpent`` (nested budgets: the earliest
    end binds).  The first start of a pool of each world size inside is not charged to the
    budget (the harness's cost, shared with whatever runs next); a pool started again after
    its ranks failed is."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"a time budget must be a positive number of seconds, got {seconds!r}")
    budget = _Budget(seconds, what)
    _BUDGETS.append(budget)
    try:
        yield budget
    finally:
        _BUDGETS.remove(budget)


def _charge_startup(pool_key: tuple[int, str], seconds: float) -> None:
    _STARTUP_S[0] += seconds
    for budget in _BUDGETS:
        if pool_key not in budget.pools_started:
            budget.pools_started.add(pool_key)
            budget.deadline += seconds


def _binding_budget() -> _Budget | None:
    return min(_BUDGETS, key=lambda b: b.deadline) if _BUDGETS else None


def budget_left() -> float | None:
    """Seconds left of the binding time budget (negative once spent); None outside one."""
    budget = _binding_budget()
    return None if budget is None else budget.left()


def pool_startup_seconds() -> float:
    """Seconds this process has spent starting rank pools (what a case's wall time includes
    when its pool had to start first)."""
    return _STARTUP_S[0]
