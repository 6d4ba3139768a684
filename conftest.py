"""Suite-wide options and fixtures.

Options
    --target SPEC         the implementation under test: a module (default ``impl``),
                          ``module:attr``, or a path to a Python file (a CS336
                          ``tests/adapters.py``).
    --device auto|cpu|cuda
                          where tensors live; ``auto`` picks CUDA when present.  On the
                          CPU, Triton kernels run under the interpreter
                          (TRITON_INTERPRET=1 is set here, before anything imports triton).
    --hypothesis-profile ci|dev|gate|thorough
                          (Hypothesis's own option) example budgets; default ``dev``.

A check that raises a verdict (``conformance.verdicts``: not offered, needs hardware, an
environment refusal, including the refusal rules of ``conformance.refusals``) is skipped
with the verdict's reason; it is never reported as passed.
"""

from __future__ import annotations

import os
import sys

# numpy's OpenBLAS starts one thread per core; on CI's 2 cores, shared with pytest-xdist
# workers and torch's own threads, the Triton interpreter's small tl.dot matmuls then ran
# ~100x slower (25 ms instead of 0.2 ms each).  Must be set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _device_from_argv(argv) -> str:
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return os.environ.get("SUITE_DEVICE", "auto")


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


# The interpreter must be chosen before the first `import triton`.
if _device_from_argv(sys.argv) == "cpu" or (
    _device_from_argv(sys.argv) == "auto" and not _cuda_present()
):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

from conformance import profiles  # noqa: E402,F401  (registers the profiles)
from conformance.target import load_target  # noqa: E402
from conformance.capabilities import capability_of_nodeid, is_self_check  # noqa: E402
from conformance.verdicts import NotOffered, Verdict, classify  # noqa: E402

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

pytest_plugins = ["conformance.report", "conformance.isolation"]


def pytest_addoption(parser):
    group = parser.getgroup("conformance")
    group.addoption("--target", default=None, help="implementation under test: module, module:attr, or file path (default: impl)")
    group.addoption("--device", default="auto", choices=("auto", "cpu", "cuda"), help="device for tensors (default: auto)")
    group.addoption(
        "--world-size",
        type=int,
        default=None,
        help="pin every drawn distributed case to this many ranks (default: drawn from 1 to 4); "
        "more ranks than GPUs is reported as skipped",
    )
    group.addoption(
        "--shards",
        type=int,
        default=1,
        help="split the examples of each sharded law (the attention kernels') over this many test items, "
        "each drawing its share independently, so xdist workers run one law in parallel (default 1)",
    )


def pytest_configure(config):
    device = config.getoption("--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: no CUDA device is visible")
    # Child processes (distributed ranks, xdist workers) read these.
    os.environ["SUITE_DEVICE"] = device
    world_size = config.getoption("--world-size")
    if world_size is not None:
        if world_size < 1:
            raise pytest.UsageError(f"--world-size must be at least 1, got {world_size}")
        from conformance.harness import MAX_CPU_WORLD_SIZE

        on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        if on_cpu and world_size > MAX_CPU_WORLD_SIZE:
            raise pytest.UsageError(f"--world-size {world_size}: the CPU harness runs at most {MAX_CPU_WORLD_SIZE} ranks")
        os.environ["SUITE_WORLD_SIZE"] = str(world_size)
    spec = config.getoption("--target")
    if spec:
        os.environ["SUITE_TARGET"] = spec
        if not hasattr(config, "workerinput") and not config.option.collectonly:  # once, in the controller
            from conformance.target import probe_target

            why = probe_target(spec)
            if why:
                raise pytest.UsageError(why)


def pytest_generate_tests(metafunc):
    """A test that takes ``shard`` runs once per shard (``--shards``): see ``profiles.sharded_examples``."""
    if "shard" in metafunc.fixturenames:
        shards = metafunc.config.getoption("--shards")
        if shards < 1:
            raise pytest.UsageError(f"--shards must be at least 1, got {shards}")
        if shards > 1:  # one shard: the ``shard`` fixture, and test ids as without sharding
            metafunc.parametrize("shard", [(i, shards) for i in range(shards)], ids=[f"shard{i + 1}of{shards}" for i in range(shards)])


@pytest.fixture
def shard() -> tuple[int, int]:
    """(index, shards) of this test item's share of a sharded law; (0, 1) unsharded."""
    return (0, 1)


@pytest.fixture(scope="session")
def device(request) -> torch.device:
    choice = request.config.getoption("--device")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


@pytest.fixture
def gluon_on_hopper():
    """``impl.attention.flash_gluon``, or the test skipped with the reason this machine cannot run it."""
    fg = pytest.importorskip("impl.attention.flash_gluon")
    reason = fg.hopper_reason() if fg.GLUON_IMPORT_ERROR is None else str(fg.GLUON_IMPORT_ERROR)
    if reason:
        pytest.skip(f"not run here: {reason}")
    return fg


@pytest.fixture(scope="session")
def target(request):
    return load_target(request.config.getoption("--target"))


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A verdict (not offered, needs hardware, an environment refusal) is a skip with its reason."""
    if "target" in pyfuncitem.fixturenames and not is_self_check(pyfuncitem.nodeid):
        # a capability the target does not offer is told so here, without starting rank pools
        reason = pyfuncitem.funcargs["target"].not_offered_reason(capability_of_nodeid(pyfuncitem.nodeid))
        if reason:
            pytest.skip(NotOffered(reason).reason)
    try:
        return (yield)
    except Exception as exc:
        verdict = classify(exc)
        if verdict is None or (is_self_check(pyfuncitem.nodeid) and _own_defect(exc, verdict)):
            raise
        pytest.skip(verdict.reason)


def _own_defect(exc, verdict) -> bool:
    """In a self-check the code run is the suite's own: "not offered" there is a defect, and so
    is a refusal read from an ordinary error's words (our code on the CPU that touches CUDA
    is a bug, not a target refusing CPU tensors); only a verdict raised as such is a skip."""
    return isinstance(verdict, NotOffered) or not isinstance(exc, Verdict)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A verdict raised while a fixture asks the target for its implementation (``attn``
    calls the factory, whose lazy import may fail) reads as it would inside the check:
    one cause, one verdict, whichever of the two met it first."""
    try:
        return (yield)
    except NotOffered as exc:
        pytest.skip(exc.reason)
    except Exception as exc:
        verdict = classify(exc) if "target" in getattr(item, "fixturenames", ()) else None
        if verdict is None or (is_self_check(item.nodeid) and _own_defect(exc, verdict)):
            raise
        pytest.skip(verdict.reason)


def pytest_sessionfinish(session, exitstatus):
    """No rank process outlives the session (the distributed harness's pools)."""
    harness = sys.modules.get("conformance.harness")
    if harness is not None:
        harness.shutdown_pools()
