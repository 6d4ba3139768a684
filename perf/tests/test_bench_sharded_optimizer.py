"""The sharded-optimizer benchmark's --tiny mode runs end to end on the CPU (gloo, two
ranks, a tiny GPT) and writes tables whose memory terms equal their formulas."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perf.bench.sharded_optimizer import VARIANTS
from impl.models.gpt import SIZES, make_gpt
from conformance.accounting import adam_state_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.distributed
def test_tiny_mode_measures_every_variant(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "perf.bench.sharded_optimizer", "--tiny", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    payload = json.loads((tmp_path / "sharded_optimizer.json").read_text())
    assert "| ours_allgather |" in (tmp_path / "sharded_optimizer.md").read_text()
    summary = {row["variant"]: row for row in payload["summary"]}
    assert set(summary) == set(VARIANTS) and all(row["status"] == "ok" for row in summary.values())

    world_size = payload["info"]["world_size"]
    n = payload["per_rank"][0]["parameters"]
    for r in payload["per_rank"]:
        assert r["parameter_bytes"] == r["parameter_bytes_formula"] == 4 * n
        assert r["gradient_bytes"] == r["gradient_bytes_formula"] == 4 * n
        assert r["optimizer_state_bytes"] == r["optimizer_state_bytes_formula"], r["variant"]
        assert r["activation_saved_bytes"] > 0 and r["step_ms"] > 0
    # sharded variants hold about half the state: 2 x 4 B x N / W up to the largest parameter
    n_params = len(list(make_gpt("tiny").parameters()))
    assert summary["adamw"]["optimizer_state_bytes"] == adam_state_bytes(n, n_params)
    largest = SIZES["tiny"].vocab_size * SIZES["tiny"].d_model  # the embedding / the head
    for variant in VARIANTS[1:]:
        per_rank = summary[variant]["optimizer_state_bytes_per_rank"]
        assert sum(per_rank) == summary["adamw"]["optimizer_state_bytes"], variant
        assert max(per_rank) <= 2 * 4 * (n / world_size + largest) + 4 * n_params, variant
