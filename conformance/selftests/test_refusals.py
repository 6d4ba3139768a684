"""Errors that mean "could not run here" or "not written yet", not "wrong".

A target that refuses CPU tensors is "not run here: needs a GPU" on a machine without
one; only that situation: the same refusal with a GPU visible, an error about something
else, and a wrong answer all still fail.  A NotImplementedError raised by the target's
own backward (the handout's placeholder) is "not offered: backward"; one raised by torch,
or one the suite caught where it expected a clear error, still fails.  The targets are written to a temporary file, since
the rule looks at where the error was raised (the target's code, not the suite's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conformance.laws.attention import spec
from conformance.refusals import gpu_refusal, not_implemented_refusal
from conformance.target import load_target

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGETS = """
    import torch
    from conformance.target import load_target

    _FLASH = load_target("impl").attention("pytorch")


    class RaisesOnCpu:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            if q.device.type != "cuda":
                raise ValueError("this FlashAttention path requires CUDA tensors")
            return _FLASH.apply(q, k, v, is_causal)


    class AssertsIsCuda:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            assert q.is_cuda and k.is_cuda and v.is_cuda
            return _FLASH.apply(q, k, v, is_causal)


    class RefusesOtherwise:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            raise ValueError("tile size must divide the sequence length")


    class WrongAnswer:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            return _FLASH.apply(q, k, v, is_causal) * 1.01


    class NoBackward(_FLASH):
        @staticmethod
        def backward(ctx, grad_o, *rest):
            raise NotImplementedError


    class DefinesNoBackward(_FLASH):
        backward = staticmethod(torch.autograd.Function.backward)  # as if never written


    class ImportsAMissingModule:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            import cs336_basics_not_installed.nn  # noqa: F401 - its own package, absent here


    class NoForward:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            raise NotImplementedError("forward comes next week")


    class TorchLacksAnOperator:
        @staticmethod
        def apply(q, k, v, is_causal=False):
            return q.to_sparse().view(-1)  # torch: NotImplementedError for sparse tensors


    def get_flashattention_autograd_function_triton():
        return RaisesOnCpu
"""


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    path = tmp_path_factory.mktemp("cuda_only") / "cuda_only_adapters.py"
    path.write_text(textwrap.dedent(TARGETS))
    return load_target(str(path))


def _error(check, attn):
    with pytest.raises(Exception) as info:
        check(attn, torch.device("cpu"))
    return info.value


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("kind", ["RaisesOnCpu", "AssertsIsCuda"])
@pytest.mark.parametrize("check", [spec.cs336_noncausal_forward_backward, spec.bad_input_errors], ids=lambda f: f.__name__)
def test_a_cuda_only_target_without_a_gpu_needs_a_gpu(targets, kind, check, no_gpu):
    reason = gpu_refusal(_error(check, getattr(targets.obj, kind)))
    assert reason is not None and reason.startswith("needs a GPU: the target refuses CPU tensors"), reason


def test_the_same_refusal_with_a_gpu_visible_still_fails(targets, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_refusal(_error(spec.cs336_noncausal_forward_backward, targets.obj.RaisesOnCpu)) is None


@pytest.mark.parametrize("kind", ["RefusesOtherwise", "WrongAnswer"])
def test_other_errors_and_wrong_answers_still_fail(targets, kind, no_gpu):
    assert gpu_refusal(_error(spec.cs336_noncausal_forward_backward, getattr(targets.obj, kind))) is None


@pytest.mark.parametrize("module", ["perf.tests.test_example", "perf.bench.example"])
def test_an_error_naming_cuda_in_the_suites_own_benchmark_code_still_fails(module, no_gpu):
    # perf/ (the benchmarks and their tests) is the suite's code, not a target's: a benchmark
    # test's assertion, or the harness's own error, that names CUDA is a failure on a machine
    # without a GPU, not the target refusing CPU tensors.
    scope = {"__name__": module}
    exec(compile("def check():\n    assert False, 'the replayed CUDA step differs from the eager one'\n",
                 module.replace(".", "/") + ".py", "exec"), scope)
    with pytest.raises(AssertionError) as failed:
        scope["check"]()
    assert gpu_refusal(failed.value) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip applies only where no GPU is visible")
def test_a_cuda_only_triton_flavour_is_reported_not_run_here(targets, tmp_path):
    """End to end: the spec run reports the Triton rows "not run here", not FAILS."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/spec/test_attention.py", "--target", targets.spec,
         "-k", "triton and cs336_noncausal", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rs"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    ).stdout
    row = next((ln for ln in out.splitlines() if ln.strip().startswith("attention triton backward")), "")
    assert "not run here" in row and "needs a GPU: the target refuses CPU tensors" in row, out[-2000:]


def test_an_unwritten_backward_is_not_offered(targets):
    reason = not_implemented_refusal(_error(spec.cs336_noncausal_forward_backward, targets.obj.NoBackward))
    assert reason is not None and reason.startswith("not offered: backward raises NotImplementedError"), reason
    assert "cuda_only_adapters.py" in reason


def test_a_function_that_defines_no_backward_is_not_offered(targets):
    """torch raises NotImplementedError from its own Function.backward: the part is unwritten."""
    reason = not_implemented_refusal(_error(spec.cs336_noncausal_forward_backward, targets.obj.DefinesNoBackward))
    assert reason is not None and reason.startswith("not offered: the autograd Function defines no backward"), reason


def test_a_module_the_target_imports_and_this_environment_lacks_is_not_run_here(targets):
    """A lazy import of the target's own dependency fails here: the environment, not the
    target's logic; a ModuleNotFoundError from the suite's own code is no such verdict."""
    from conformance.verdicts import EnvironmentRefusal, classify

    verdict = classify(_error(spec.cs336_noncausal_forward_backward, targets.obj.ImportsAMissingModule))
    assert isinstance(verdict, EnvironmentRefusal), verdict
    assert "imports 'cs336_basics_not_installed'" in verdict.reason and "install the target's dependencies" in verdict.reason
    try:
        import conformance.no_such_suite_module  # noqa: F401
    except ModuleNotFoundError as exc:
        assert classify(exc) is None


def test_an_unwritten_forward_is_not_offered(targets):
    reason = not_implemented_refusal(_error(spec.cs336_noncausal_forward_backward, targets.obj.NoForward))
    assert reason is not None and reason.startswith("not offered: apply() raises NotImplementedError"), reason
    assert "forward comes next week" in reason


def test_a_not_implemented_error_from_torch_or_caught_by_the_suite_still_fails(targets):
    torch_error = _error(spec.cs336_noncausal_forward_backward, targets.obj.TorchLacksAnOperator)
    assert isinstance(torch_error, NotImplementedError) and not_implemented_refusal(torch_error) is None
    wrapped = _error(spec.bad_input_errors, targets.obj.NoForward)  # expects ValueError/TypeError
    assert isinstance(wrapped, AssertionError) and not_implemented_refusal(wrapped) is None
    assert not_implemented_refusal(_error(spec.cs336_noncausal_forward_backward, targets.obj.WrongAnswer)) is None


def test_an_unwritten_backward_is_reported_not_offered(targets, tmp_path):
    """End to end: through conftest, the backward row reads "not offered", not FAILS."""
    adapters = tmp_path / "no_backward_adapters.py"
    adapters.write_text(
        f"import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('cuda_only_adapters', {targets.spec!r})\n"
        f"mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"def get_flashattention_autograd_function_pytorch():\n    return mod.NoBackward\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/spec/test_attention.py", "--target", str(adapters),
         "-k", "pytorch and cs336_noncausal", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rs"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    ).stdout
    row = next((ln for ln in out.splitlines() if ln.strip().startswith("attention pytorch backward")), "")
    assert "not offered" in row and "backward raises NotImplementedError" in row, out[-2000:]


def _raise(exc):
    raise exc


@pytest.mark.parametrize(
    "message, words",
    [
        ("0 active drivers ([]). There should only be one.", "autotuner"),
        ("NVTX functions not installed. Are you sure you have a CUDA build?", "torch.cuda.nvtx"),
    ],
)
def test_the_environment_refusing_the_targets_code_is_not_run_here(message, words):
    from conformance.verdicts import EnvironmentRefusal, classify

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU: with one, these errors are the target's")
    try:
        _raise(RuntimeError(message))
    except RuntimeError as exc:
        verdict = classify(exc)
    assert isinstance(verdict, EnvironmentRefusal) and words in verdict.reason
    assert verdict.reason.startswith("not run here")
    assert classify(RuntimeError("0 passed checks, a wrong answer")) is None


# --- not offered, seen without calling the target ------------------------------------------

_STUBS = '''
def get_fsdp(module, compute_dtype=None):
    """Returns: an FSDP-wrapped module."""
    raise NotImplementedError


def get_ddp(module):
    raise NotImplementedError("not done yet")


def get_pipeline_schedule(stages, n_micro):
    if n_micro < 1:
        raise NotImplementedError
    return None
'''


def test_an_absent_or_stub_entry_point_is_not_offered_before_any_rank_starts(tmp_path):
    from conformance.target import load_target

    path = tmp_path / "adapters.py"
    path.write_text(_STUBS)
    target = load_target(str(path))
    assert "get_fsdp() raised NotImplementedError" in target.not_offered_reason("FSDP")
    assert "get_ddp() raised NotImplementedError" in target.not_offered_reason("DDP ddp2026")
    assert target.not_offered_reason("pipeline parallel") is None  # a body that does more is called, not guessed
    assert "has no get_column_parallel_linear()" in target.not_offered_reason("tensor parallel")
    assert target.not_offered_reason("attention pytorch").endswith("has no get_flashattention_autograd_function_pytorch()")
    assert load_target("impl").not_offered_reason("FSDP") is None


def test_nvtx_annotations_in_a_target_do_not_stop_it_on_a_cpu_build(tmp_path):
    """``torch.cuda.nvtx`` ranges only annotate a profile: on a torch build without NVTX a
    target that wraps its hooks in them is still run (they become no-ops), not refused."""
    import torch

    from conformance.target import load_target

    path = tmp_path / "nvtx_target.py"
    path.write_text("import torch\n\ndef annotated(x):\n    with torch.cuda.nvtx.range('hook'):\n"
                    "        torch.cuda.nvtx.mark('here')\n        return x + 1\n")
    assert load_target(str(path)).obj.annotated(torch.ones(1)).item() == 2.0


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="this Python parses 3.12 syntax: nothing to explain")
def test_a_target_in_newer_python_syntax_names_the_python_version(tmp_path):
    """Course code may use Python 3.12 syntax (``type X = ...``); on an older Python the
    load error says that the Python version, not the code, is the cause."""
    from conformance.target import probe_target

    path = tmp_path / "adapters.py"
    path.write_text("type Shape = tuple[int, ...]\n")
    message = probe_target(str(path))
    assert "SyntaxError" in message and "Python >= 3.12" in message, message


def test_in_a_self_check_only_a_verdict_raised_as_such_is_a_skip():
    """A self-check runs the suite's or impl's own code: an ordinary error there that a refusal
    rule would read as "needs a GPU" is a bug of ours and fails (triton_launch.fast_stream once
    read a CUDA-only torch._C function on the CPU, and 17 host-plan tests read "needs a GPU"
    instead of failing); a verdict raised as one (NeedsHardware) still skips; "not offered" in a
    self-check is a defect."""
    import conftest  # the repository's root conftest, which pytest has already imported
    from conformance.verdicts import NeedsHardware, NotOffered

    error = AttributeError("module 'torch._C' has no attribute '_cuda_getDevice'")
    assert conftest._own_defect(error, NeedsHardware("needs a GPU: the target refuses CPU tensors (AttributeError)"))
    raised = NeedsHardware("needs 2 GPUs: this machine has 0")
    assert not conftest._own_defect(raised, raised)
    offered = NotOffered("not offered: backward")
    assert conftest._own_defect(offered, offered)
