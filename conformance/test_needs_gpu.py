"""A target that refuses CPU tensors is "not run here: needs a GPU" on a machine without one.

Only that situation: the same refusal with a GPU visible, an error about something else,
and a wrong answer all still fail.  The targets are written to a temporary file, since
the rule looks at where the error was raised (the target's code, not the suite's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conformance import attention_spec as spec
from conformance.needs_gpu import gpu_refusal
from conformance.target import load_target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip applies only where no GPU is visible")
def test_a_cuda_only_triton_flavour_is_reported_not_run_here(targets, tmp_path):
    """End to end: the spec run reports the Triton rows "not run here", not FAILS."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/test_attention_spec.py", "--target", targets.spec,
         "-k", "triton and cs336_noncausal", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rs"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    ).stdout
    row = next((ln for ln in out.splitlines() if ln.strip().startswith("attention triton backward")), "")
    assert "not run here" in row and "needs a GPU: the target refuses CPU tensors" in row, out[-2000:]
