"""The data-parallel benchmarks run end to end in --tiny mode (CPU, gloo, two ranks), and
the overhead model's arithmetic gives the answers worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perf.bench.ddp import MIB, bucket_mb, exposed_seconds, optimal_bucket_mb, predict

ROOT = Path(__file__).resolve().parents[2]
SMOKE_VARIANTS = ["local", "naive", "flat", "individual", "bucketed_1", "bucketed_1_side", "bucketed_none", "torch_ddp_25", "local_again"]


def _run(args, tmp_path):
    run = subprocess.run([sys.executable, *args, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.distributed
def test_allreduce_benchmark_tiny_mode_writes_its_tables(tmp_path):
    _run(["-m", "perf.bench.allreduce", "--tiny"], tmp_path)
    payload = json.loads((tmp_path / "allreduce.json").read_text())
    rows = payload["rows"]
    assert rows and all(r["status"] == "ok" and r["backend"] == "gloo" and r["world_size"] == 2 for r in rows)
    for r in rows:  # busbw = 2(n-1)/n * bytes / t, and n = 2 makes it bytes / t
        assert r["busbw_gbps"] == pytest.approx(r["bytes"] / (r["time_ms"] / 1e3) / 1e9)
    assert (tmp_path / "allreduce.csv").exists() and "bus bandwidth" in (tmp_path / "allreduce.md").read_text()


@pytest.mark.distributed
def test_ddp_benchmark_tiny_mode_measures_the_variants_and_fits_the_model(tmp_path):
    _run(["-m", "perf.bench.ddp", "--tiny", "--variants", *SMOKE_VARIANTS], tmp_path)
    payload = json.loads((tmp_path / "ddp.json").read_text())
    rows = {r["variant"]: r for r in payload["rows"]}
    assert list(rows) == SMOKE_VARIANTS and all(r["status"] == "ok" for r in rows.values())
    for name, row in rows.items():
        assert row["median_ms"] > 0 and row["vs_local"] > 0
        if not name.startswith("local"):
            assert row["replicas_identical"] is True, name
    assert rows["bucketed_none"]["buckets"] == 1
    assert rows["bucketed_1"]["launch_host_ms"] > 0 and rows["torch_ddp_25"]["launch_host_ms"] is None
    model = payload["model"]
    assert model["alpha_s"] >= 0 and 0 < model["beta_bytes_per_s"] < float("inf") and model["timeline"]["backward_ms"] > 0
    assert payload["summary"]["predicted_best_bucket_mb"] >= 1
    assert "| bucketed_1 |" in (tmp_path / "ddp.md").read_text()


def test_alpha_beta_fit_recovers_a_line_and_survives_noise():
    from perf.bench.allreduce import fit_alpha_beta

    rows = [{"bytes": b, "time_ms": (2e-5 + b / 1e10) * 1e3, "status": "ok"} for b in (MIB, 4 * MIB, 16 * MIB)]
    alpha, beta = fit_alpha_beta(rows)
    assert alpha == pytest.approx(2e-5, rel=1e-6) and beta == pytest.approx(1e10, rel=1e-6)
    noisy = [{"bytes": MIB, "time_ms": 5.0, "status": "ok"}, {"bytes": 2 * MIB, "time_ms": 4.0, "status": "ok"}]
    alpha, beta = fit_alpha_beta(noisy)  # time falls with size: no slope to fit
    assert alpha >= 0 and beta == pytest.approx(2 * MIB / 4e-3)


def test_variant_names_carry_their_bucket_size():
    assert bucket_mb("bucketed_25") == 25.0 and bucket_mb("bucketed_none") is None
    assert bucket_mb("torch_ddp_100") == 100.0 and bucket_mb("torch_ddp_25_gav") == 25.0
    assert bucket_mb("bucketed_25_cur") == 25.0 and bucket_mb("bucketed_none_cur") is None
    assert bucket_mb("bucketed_25_side") == 25.0 and bucket_mb("bucketed_none_side") is None


@pytest.mark.distributed
def test_weak_scaling_tiny_mode_gives_efficiency_against_local_at_one_rank(tmp_path):
    _run(["-m", "perf.bench.scaling", "--tiny", "--worlds", "1", "2", "--variants", "bucketed_1", "torch_ddp_25"], tmp_path)
    payload = json.loads((tmp_path / "scaling.json").read_text())
    rows = payload["rows"]
    assert [(r["world_size"], r["variant"]) for r in rows] == [
        (1, "local"), (1, "bucketed_1"), (1, "torch_ddp_25"), (2, "bucketed_1"), (2, "torch_ddp_25"), (1, "local_again")]
    assert all(r["status"] == "ok" for r in rows)
    base = max(r["tokens_per_s"] for r in rows if r["variant"].startswith("local"))
    for r in rows:  # efficiency = tokens/s / (W x tokens/s of the faster local run)
        assert r["efficiency"] == pytest.approx(r["tokens_per_s"] / (r["world_size"] * base))
    assert [v["world_size"] for v in payload["verdicts"]] == [2]


def test_exposed_communication_follows_the_stream_recurrence():
    # alpha 1 s, beta 1 byte/s: bucket i costs 1 + bytes_i seconds, one after another
    buckets = [(2, 0.0), (1, 1.0), (3, 10.0)]  # (bytes, ready s)
    # ends: 0 + 3 = 3; max(1, 3) + 2 = 5; max(10, 5) + 4 = 14 -> 14 - backward 12 = 2 s exposed
    assert exposed_seconds(buckets, 1.0, 1.0, 12.0) == pytest.approx(2.0)
    assert exposed_seconds(buckets, 1.0, 1.0, 20.0) == 0.0  # all hidden behind backward


def _timeline(sizes_mib, ready_ms, backward_ms):
    names = [f"p{i}" for i in range(len(sizes_mib))]  # registration order; ready in reverse
    return {
        "registration": [(n, int(s * MIB)) for n, s in zip(names, sizes_mib)],
        "ready": [(n, t) for n, t in zip(names[::-1], ready_ms)],
        "backward_ms": backward_ms,
    }


def test_the_model_prefers_buckets_that_hide_behind_backward():
    # ten 10 MiB gradients ready every 10 ms; an all-reduce of 10 MiB takes 1 ms + 5 ms
    tl = _timeline([10] * 10, [10 * (i + 1) for i in range(10)], 100.0)
    alpha, beta = 1e-3, 10 * MIB / 5e-3
    one_bucket = predict("bucketed_none", tl, alpha, beta)
    per_param = predict("individual", tl, alpha, beta)
    assert one_bucket == pytest.approx(alpha + 100 * MIB / beta)  # everything after the last gradient
    assert per_param == pytest.approx(alpha + 10 * MIB / beta)  # only the last gradient's all-reduce
    assert predict("flat", tl, alpha, beta) == pytest.approx(one_bucket)
    assert predict("naive", tl, alpha, beta) == pytest.approx(10 * alpha + 100 * MIB / beta)
    best_mb, best_s = optimal_bucket_mb(tl, alpha, beta)
    assert best_mb < 20 and best_s == pytest.approx(per_param)
