"""Running an attention law (or spec check) against a kept mutant, for a verdict only.

``rejection(law_name, target_spec, max_examples, flavour)`` returns the first line of the
failure, or None when the target passes.  A bounded number of examples, no shrinking: a
verdict, not a minimal counterexample.  ``CONTROL`` is the mutants' shared implementation
with every bug switched off: it must pass the same runs, so a rejection is the bug's doing.
None with a ``LawBudgetWarning`` means the law's time budget ended the run first (every
example that ran passed): not shown, not passed.  A Gluon run happens in a child process,
whose budget warning is warned again here.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
from hypothesis import Phase

from conformance.harness import resolve_device
from conformance.lawbook import LawBudgetWarning
from conformance.laws.attention import spec
from conformance.laws.attention.hopper import refuse_gluon_here
from conformance.laws.attention.laws import LAWS_BY_NAME, check_law
from conformance.target import load_target

CONTROL = "conformance.mutants.attention:correct"
DEFAULT_EXAMPLES = 40  # enough that each bug's triggering shapes are drawn
# Every example of this law already runs one neighbour of each kind (causal flag, layout,
# key length, dtype, scale): its bugs show in any example, and under the interpreter each
# example costs about five calls forward and backward.  The recycled-address law runs its
# case five times an example: an address-keyed bug shows in any example too.
# The long bf16 contract law (check_law caps it at 3 examples: thousands of keys, seconds
# each in the PyTorch flavour): its mutant (bf16 accumulators) fails at the first example.
# The batch law draws two batch elements at least: a batch-mixing bug shows in every example.
FEWER_EXAMPLES = {"results_do_not_depend_on_earlier_calls": 2,
                  "fresh_values_at_recycled_addresses_give_fresh_results": 2,
                  "contract_long_sequences_in_bf16_match_float64_reference": 1,
                  "batch_elements_are_independent": 10}


def mutant_examples(law_name: str) -> int:
    return FEWER_EXAMPLES.get(law_name, DEFAULT_EXAMPLES)
SETTINGS = dict(phases=[Phase.explicit, Phase.generate], database=None)


# A kernel whose barriers wait on a phase that never comes hangs the process on the GPU, where
# nothing can interrupt it: the Gluon flavour's runs go to a child process, and a child that
# makes no progress for this long rejects the target as hung.  Progress is a call of the
# implementation starting through the laws' ``call``, or a float64 reference starting or done
# (``references``; the child says "PROGRESS" for each): a run of many examples on a GPU that
# other workers load is slow, not hung.  A law that judges its calls after all have run
# (results_do_not_depend_on_earlier_calls: seven calls, then seven references with gradients)
# spends that whole stretch without a call starting (its slowest example took 26 s in all on an
# H200 that twelve workers shared).  The child waits for each reference's GPU work before it
# says it is done.  A hung kernel still shows: that wait, or the judging's first read of its
# output, never returns, and no progress follows.  Spec checks call the target
# themselves, so for them the whole run's time counts.  Time spent compiling is not counted either (the child
# reports each Triton compile's start and end, and each C++ extension's build or load through
# torch.utils.cpp_extension): a cold cache on a loaded machine compiles for longer than any call
# that finishes takes, and is no hang.  Nor is the child's setup before the target is loaded
# (its imports; ``READY`` ends it): no kernel of the target has run yet.  Both count against
# COMPILE_ALLOWANCE_S.  On a fresh H200 whose twelve workers started children at once, a correct
# control read "hung" at a 40 s limit with no progress line from its start: the clock had counted
# its imports, its target's load and, in its first call, the load of impl's C++ launcher, which
# waits on the build's lock while other processes hold it.
HANG_LIMIT_S = float(os.environ.get("SUITE_HANG_LIMIT_S", 150))
COMPILE_ALLOWANCE_S = 900.0  # compiling past this much in one run is reported as a hang too

_CHILD = """
from hypothesis import settings
settings.register_profile('child', deadline=None)
settings.load_profile('child')
try:
    from triton import knobs
    def _say(word):
        def hook(*args, **kwargs):
            print(word, flush=True)
            return None  # the cache hook's True would skip the compile
        return hook
    knobs.runtime.jit_cache_hook = _say('COMPILING')
    knobs.runtime.jit_post_compile_hook = _say('COMPILED')
except Exception:  # no hooks: every second counts towards the limit
    pass
from conformance.laws.attention.rejection import announce_extension_builds
announce_extension_builds()
from conformance.laws.attention import laws as _laws
_call = _laws.call
def _call_with_progress(*args, **kwargs):
    print('PROGRESS', flush=True)
    return _call(*args, **kwargs)
_laws.call = _call_with_progress
_references = _laws.references
import torch
def _references_with_progress(*args, **kwargs):
    print('PROGRESS', flush=True)
    refs = _references(*args, **kwargs)
    if torch.cuda.is_available():  # done means computed, not queued
        torch.cuda.synchronize()
    print('PROGRESS', flush=True)
    return refs
_laws.references = _references_with_progress
import warnings
from conformance.lawbook import LawBudgetWarning
from conformance.laws.attention.rejection import BUDGET_CUT, rejection
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always', LawBudgetWarning)
    v = rejection({law!r}, {target!r}, {examples}, {flavour!r}, in_child=True)
for w in caught:  # the parent's caller decides what a cut law means (the mutant tests: not shown here)
    if issubclass(w.category, LawBudgetWarning):
        print(BUDGET_CUT + str(w.message).splitlines()[0], flush=True)
print('VERDICT:' + ('' if v is None else v), flush=True)
"""
READY = "READY"  # the child's line once its target is loaded: the end of its setup


def announce_extension_builds() -> None:
    """torch.utils.cpp_extension's ``load`` and ``load_inline`` say "COMPILING" before and
    "COMPILED" after (a child's compiles, which its clock does not count): a target may build
    or load a C++ extension in its first call, and on a loaded machine its processes wait in
    turn on the build's lock."""
    from torch.utils import cpp_extension

    for name in ("load", "load_inline"):
        build = getattr(cpp_extension, name)
        if getattr(build, "announced", False):
            continue

        def announced(*args, _build=build, **kwargs):
            print("COMPILING", flush=True)
            try:
                return _build(*args, **kwargs)
            finally:
                print("COMPILED", flush=True)

        announced.announced = True
        setattr(cpp_extension, name, announced)


# The child's line for a law its time budget cut short (every example that ran passed): the
# parent warns it again, so a caller that reads LawBudgetWarning sees it as it would in-process.
BUDGET_CUT = "BUDGET_CUT:"


def rejection(law_name: str, target_spec: str, max_examples: int, flavour: str = "pytorch",
              in_child: bool = False) -> str | None:
    device = torch.device(resolve_device())
    if flavour == "gluon":
        refuse_gluon_here(device)  # its bugs show on a Hopper GPU only: elsewhere "not run here"
        if not in_child:
            return _rejection_in_child(law_name, target_spec, max_examples, flavour)
    attn = load_target(target_spec).attention(flavour or "pytorch")
    if in_child:  # the setup is done: from here the parent's clock counts (watch_for_progress)
        print(READY, flush=True)
    try:
        if law_name.startswith("spec:"):
            spec.SPEC_CHECKS[law_name.removeprefix("spec:")](attn, device)
        else:
            check_law(LAWS_BY_NAME[law_name], attn, device, flavour or "pytorch", max_examples=max_examples, **SETTINGS)
    except AssertionError as exc:
        return str(exc).splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - a crash rejects too, but says so
        return f"crashed: {type(exc).__name__}: {exc}"
    return None


def _rejection_in_child(law_name: str, target_spec: str, max_examples: int, flavour: str) -> str | None:
    code = _CHILD.format(law=law_name, target=target_spec, examples=max_examples, flavour=flavour)
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=root, env=env)
    lines, hung, stderr = watch_for_progress(proc, HANG_LIMIT_S, COMPILE_ALLOWANCE_S, setup=True)
    if hung:
        return (f"hung: no call of the implementation started or the run ended within {HANG_LIMIT_S:g} s, compiling "
                f"not counted (a kernel that never finishes, as one whose barrier waits on a phase that never "
                f"completes)")
    for line in lines:
        if line.startswith(BUDGET_CUT):
            warnings.warn(LawBudgetWarning(line.removeprefix(BUDGET_CUT)), stacklevel=2)
    verdicts = [line.removeprefix("VERDICT:") for line in lines if line.startswith("VERDICT:")]
    if not verdicts:
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"crashed: the check's process exited with code {proc.returncode}: {tail}"
    return verdicts[-1] or None


def watch_for_progress(proc: subprocess.Popen, limit_s: float, compile_allowance_s: float,
                       setup: bool = False) -> tuple[list, bool, str]:
    """Read ``proc``'s output to its end; kill it once it has run ``limit_s`` seconds outside
    compiles since its last "PROGRESS" line (between a "COMPILING" and a "COMPILED" line the
    clock stops, up to ``compile_allowance_s`` in all).  ``setup``: the clock also stops from
    the start to a "READY" line, counted against the same allowance.  Returns (stdout lines but
    those four kinds, whether it was killed, stderr)."""
    out: queue.Queue = queue.Queue()
    err: list = []
    threading.Thread(target=lambda: [out.put(line) for line in proc.stdout] + [out.put(None)], daemon=True).start()
    err_reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    err_reader.start()
    lines, running, compiled, compiling = [], 0.0, 0.0, int(setup)  # the setup holds the clock as a compile does
    mark, hung = time.monotonic(), False
    while True:
        left = (compile_allowance_s - compiled) if compiling else (limit_s - running)
        try:
            line = out.get(timeout=max(left, 0.0))
        except queue.Empty:
            proc.kill()
            hung = True
            break
        now = time.monotonic()
        if compiling:
            compiled += now - mark
        else:
            running += now - mark
        mark = now
        if line is None:
            break
        line = line.rstrip("\n")
        if line == "PROGRESS":
            running = 0.0
        elif line == "COMPILING":
            compiling += 1
        elif line == "COMPILED" or (line == READY and setup):
            compiling = max(compiling - 1, 0)
            setup = setup and line != READY
        else:
            lines.append(line)
    proc.wait()
    err_reader.join(timeout=5)
    return lines, hung, "".join(err)
