"""Checks that die or hang become failing rows that say how, and the run goes on.

The main job (``python -m conformance``) runs the target's checks in pytest-xdist worker
processes, replaced when one dies.  This plugin makes a dead worker's row say *how* it died:

    worker side   every check runs under a watchdog: past ``--check-timeout`` seconds the
                  worker writes which check it was running and every thread's stack, then
                  exits (a hang inside C code cannot be interrupted any other way);
                  ``faulthandler`` writes the Python stack of a fatal signal (a segfault
                  in the target's kernel, an abort) to a file of the worker's own.
    controller    when xdist reports "worker crashed while running <check>", the report
                  is rewritten from those files and the worker's exit status: "killed by
                  SIGSEGV (segmentation fault)", "exited with code 3 (os._exit or
                  sys.exit in the target's code)", "timed out after 300 s", with the stack
                  of the check's thread when there is one.

Files live in a fresh temporary directory per run (``SUITE_ISOLATION_DIR``, inherited by
the workers).  Without xdist the plugin only arms the watchdog.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import tempfile
import threading

import pytest

ENV_DIR = "SUITE_ISOLATION_DIR"
DEFAULT_CHECK_TIMEOUT_S = 900.0
TIMEOUT_EXIT_CODE = 124
_SIGNAL_WORDS = {
    "SIGSEGV": "segmentation fault", "SIGABRT": "abort", "SIGBUS": "bus error", "SIGFPE": "arithmetic fault",
    "SIGILL": "illegal instruction", "SIGKILL": "killed (out of memory?)", "SIGTERM": "terminated",
}


# faulthandler's names for the fatal signals it reports
_FAULT_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                  "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


def pytest_addoption(parser):
    parser.getgroup("conformance").addoption(
        "--check-timeout", type=float, default=None,
        help=f"seconds one check may run before it is stopped and reported as timed out (default {DEFAULT_CHECK_TIMEOUT_S:.0f})",
    )


def _timeout(config) -> float:
    value = config.getoption("--check-timeout", None)
    return float(value) if value else float(os.environ.get("SUITE_CHECK_TIMEOUT", DEFAULT_CHECK_TIMEOUT_S))


def _worker_id(config) -> str:
    return getattr(config, "workerinput", {}).get("workerid", "main")


_RUNNING: dict = {}  # "nodeid" and "worker" of the check this process runs now


def note_step(text: str) -> None:
    """Where a check has got to ("N=16, d=16"), for the verdict if its process dies there:
    a crash leaves no exception to say which of a check's inputs killed it.  A no-op
    outside the isolated main job."""
    directory = os.environ.get(ENV_DIR)
    if not (directory and _RUNNING):
        return
    with open(os.path.join(directory, f"{_RUNNING['worker']}.step"), "w") as fh:
        fh.write(f"{_RUNNING['nodeid']}\n{text}")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        if config.pluginmanager.hasplugin("dsession") or getattr(config.option, "numprocesses", None):
            os.environ.setdefault(ENV_DIR, tempfile.mkdtemp(prefix="suite-isolation-"))
        config.pluginmanager.register(_Controller(config), "conformance-isolation-controller")
    directory = os.environ.get(ENV_DIR)
    if directory and hasattr(config, "workerinput"):
        fault = open(os.path.join(directory, f"{_worker_id(config)}.fault"), "w")  # kept open for the process
        faulthandler.enable(file=fault, all_threads=True)
        config._isolation_fault = fault


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    config = item.config
    limit = _timeout(config)
    directory = os.environ.get(ENV_DIR)
    wid = _worker_id(config)
    if directory:
        with open(os.path.join(directory, f"{wid}.running"), "w") as fh:
            fh.write(item.nodeid)
    _RUNNING.update(nodeid=item.nodeid, worker=wid)
    def expire():
        # Write what ran and where every thread stood, then leave: the controller reports it.
        if directory:
            with open(os.path.join(directory, f"{wid}.timeout"), "w") as fh:
                fh.write(f"{item.nodeid}\n{limit:g}\n")
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
        else:
            faulthandler.dump_traceback(all_threads=True)
        os._exit(TIMEOUT_EXIT_CODE)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    try:
        return (yield)
    finally:
        timer.cancel()


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _thread_stack(dump: str, limit_lines: int = 8) -> str:
    """The innermost frames of the first thread in a faulthandler dump (the current one)."""
    frames = [ln.strip() for ln in dump.splitlines() if ln.strip().startswith("File ")]
    return " <- ".join(frames[:limit_lines])


def how_it_died(directory: str, worker: str, nodeid: str, returncode: int | None) -> str:
    """One line: how the worker running ``nodeid`` died, from its files and exit status."""
    timeout = _read(os.path.join(directory, f"{worker}.timeout"))
    if timeout.startswith(nodeid + "\n"):
        seconds = timeout.splitlines()[1]
        stack = _thread_stack("\n".join(timeout.splitlines()[2:]))
        return f"timed out after {seconds} s (the check hung or ran too long; --check-timeout)" + (f"; stack: {stack}" if stack else "")
    fault = _read(os.path.join(directory, f"{worker}.fault"))
    m = re.search(r"Fatal Python error: ([^\n]+)", fault)
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else f"signal {-returncode}"
        what = f"killed by {name} ({_SIGNAL_WORDS.get(name, 'a signal')})"
    elif m and m.group(1).strip() in _FAULT_SIGNALS:
        # the exit status was not seen (execnet may not hand it over in time), but
        # faulthandler named the signal: the same words either way
        name = _FAULT_SIGNALS[m.group(1).strip()]
        what = f"killed by {name} ({_SIGNAL_WORDS[name]})"
    elif m:
        what = f"killed: {m.group(1).strip()}"
    elif returncode is not None:
        what = f"exited with code {returncode} (os._exit, sys.exit or a kill in the checked code)"
    else:
        what = "its process ended without a report"
    stack = _thread_stack(fault[m.start():]) if m else ""
    memory = ("SIGSEGV", "SIGABRT", "SIGBUS")
    if any(sig in what for sig in memory) and os.environ.get("TRITON_INTERPRET") == "1" and "triton" in nodeid:
        # The interpreter runs a kernel's loads and stores as raw reads and writes of host
        # memory: out of bounds they fault, or corrupt the heap until the allocator aborts
        what += (" (under the Triton interpreter, most often a tl.load or tl.store outside its tensor: "
                 "a missing mask, or a block pointer read without boundary_check)")
    step = _read(os.path.join(directory, f"{worker}.step"))
    if step.startswith(nodeid + "\n"):
        what += f" at {step.split(chr(10), 1)[1].strip()}"
    return what + (f"; stack: {stack}" if stack else "")


def _returncode(node) -> int | None:
    """The exit status of a dead xdist worker, where execnet lets us see it."""
    io = getattr(getattr(node, "gateway", None), "_io", None)
    popen = getattr(io, "popen", None)
    if popen is None:
        return None
    try:
        return popen.wait(timeout=5)
    except Exception:  # noqa: BLE001 - best effort
        return None


class _Controller:
    def __init__(self, config):
        self.config = config
        self.returncodes: dict[str, int | None] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        if error is not None:
            self.returncodes[node.gateway.id] = _returncode(node)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        directory = os.environ.get(ENV_DIR)
        worker = report.node.gateway.id
        how = how_it_died(directory, worker, crashitem, self.returncodes.get(worker)) if directory else ""
        report.longrepr = f"the check crashed its worker process: {how} (while running {crashitem})"
