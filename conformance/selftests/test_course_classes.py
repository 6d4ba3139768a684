"""FSDP's contract cases are built from the target's own ``cs336_basics.model`` classes.

A course FSDP may shard instances of its own Linear/Embedding only; built from the suite's
twins, its model would have nothing to shard and the contract would fail a correct
submission.  The fixture target (``targets/course_classes``) is such an FSDP, next to a
stand-in ``cs336_basics`` package.  Each run is a main job of its own: rank pools keep
imported packages, so a target with its own ``cs336_basics`` runs in fresh processes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(HERE, "targets", "course_classes")


def _main_job(target_file: str, checks: str = "partition") -> str:
    # CPU ranks on every machine: what this checks (where the model's classes come from) does
    # not depend on the device, and one GPU cannot run FSDP's two ranks ("not run here").
    cmd = [sys.executable, "-m", "conformance", "--target", os.path.join(FIXTURE, target_file), "--device", "cpu",
           "-k", f"test_fsdp and test_cs336_toy_model and {checks}"]  # where the classes matter
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    return done.stdout + done.stderr


def _fsdp_row(out: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith("FSDP "))


def test_an_fsdp_that_shards_only_the_course_classes_conforms():
    out = _main_job("adapters.py")
    assert "conforms" in _fsdp_row(out), out[-3000:]


def test_an_fsdp_that_shards_nothing_is_told_so():
    out = _main_job("shards_nothing.py", checks="partition and fp32")  # the law whose words are asserted
    assert "FAILS" in _fsdp_row(out), out[-3000:]
    assert "no Linear/Embedding weight was sharded" in out and "the target's cs336_basics.model" in out, out[-3000:]
