"""The benchmark harness's own behaviour, quickly, on any device: tables, plots, OOM
reporting, time budgets, the memory snapshot and the profiler trace, bad input."""

import argparse
import gzip
import json
import pickle
import time

import pytest
import torch

from impl.models import gpt
from perf.bench import attention as bench_attention, model as bench_model
from perf.lib import measure, plots, tables
from perf.bench.attention import AttentionImpl, Case


def _raise_oom(q, k, v, causal=True):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (simulated)")


OOM_IMPL = AttentionImpl("fake_oom", _raise_oom)
TINY = dict(warmup_ms=1, rep_ms=2, log=None)


# --- tables ------------------------------------------------------------------------------


def _rows():
    return [
        dict(impl="a", seq=16, ms=1.25, peak_mib=3.0, status="ok"),
        dict(impl="b", seq=16, ms=None, peak_mib=None, status="OOM"),
        dict(impl="a", seq=32, ms=2.5, peak_mib=None, status="ok"),
    ]


def test_table_writers_produce_files_that_show_oom_where_a_value_is_missing(tmp_path):
    rows = _rows()
    md = tables.write_markdown(tmp_path / "t.md", [("Times", tables.markdown_table(rows, ["impl", "seq", "ms", "peak_mib"]))],
                               title="T")
    csv_path = tables.write_csv(tmp_path / "t.csv", rows)
    json_path = tables.write_json(tmp_path / "t.json", dict(rows=rows, bad=float("nan")))
    text = md.read_text()
    assert "| b | 16 | OOM | OOM |" in text
    assert "| a | 32 | 2.500 |  |" in text  # a missing value of a good row stays empty
    long = dict(impl="c", seq=8, ms=None, status="error: RankFailure: rank 0 raised OutOfMemoryError: CUDA out of memory")
    row = tables.markdown_table([long], ["impl", "ms", "status"]).splitlines()[-1]
    assert row == "| c | OOM | error: RankFailure: rank 0 raised OutOfMemoryError: CUDA out of memory |"
    other = dict(impl="d", ms=None, status="error: ValueError: bad size")
    assert tables.markdown_table([other], ["impl", "ms"]).splitlines()[-1] == "| d | error |"
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "impl,seq,ms,peak_mib,status" and lines[2] == "b,16,,,OOM"
    loaded = json.loads(json_path.read_text())
    assert loaded["rows"][1] == dict(impl="b", seq=16, ms=None, peak_mib=None, status="OOM") and loaded["bad"] is None


def test_pivot_puts_each_value_under_its_column_and_oom_where_it_failed():
    text = tables.pivot_markdown(_rows(), ["seq"], "impl", "ms")
    assert text.splitlines()[0] == "| seq | a | b |"
    assert "| 16 | 1.250 | OOM |" in text and "| 32 | 2.500 |  |" in text


# --- OOM and other failures ----------------------------------------------------------------


@pytest.mark.parametrize("exc, status", [
    (torch.OutOfMemoryError("Tried to allocate 64.00 GiB"), "OOM"),
    (RuntimeError("CUDA error: out of memory"), "OOM"),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "OOM"),
    (RuntimeError("No available kernel. Aborting execution."), "unsupported"),
    (ValueError("bad shape"), "error: ValueError: bad shape"),
])
def test_outcome_classifies_failures(exc, status):
    assert measure.Outcome.of(exc).label == status


def test_attention_oom_is_a_row_and_the_sweep_goes_on(device, tmp_path):
    result = bench_attention.sweep([16], [16], ["fp32"], [OOM_IMPL, "eager"], device=device, heads=1, **TINY)
    by_impl = {}
    for row in result.rows:
        by_impl.setdefault(row["impl"], []).append(row)
    assert [r["status"] for r in by_impl["fake_oom"]] == ["OOM"] * 3
    assert all(r["ms"] is None and "simulated" in r["detail"] for r in by_impl["fake_oom"])
    assert [r["status"] for r in by_impl["eager"]] == ["ok"] * 3
    paths = bench_attention.write_outputs(result, tmp_path, meta={"device": str(device)})
    assert {p.name for p in paths} == {"attention.md", "attention.csv", "attention.json",
                                       "attention_time.png", "attention_memory.png"}
    assert all(p.stat().st_size > 0 for p in paths)
    md = (tmp_path / "attention.md").read_text()
    assert "| fp32 | 16 | 16 | forward_backward | OOM |" in md
    assert json.loads((tmp_path / "attention.json").read_text())["rows"][0]["status"] == "OOM"


def test_sdpa_backend_without_a_kernel_for_the_inputs_is_unsupported(device):
    # cuDNN has no CPU kernel; flash has no float32 kernel on CUDA.
    impl = "sdpa_cudnn" if device.type == "cpu" else "sdpa_flash"
    row = bench_attention.measure_pass(bench_attention.make_impl(impl), Case(16, 16, "fp32"), "forward", device,
                                       warmup_ms=1, rep_ms=2)
    assert row["status"] == "unsupported" and row["ms"] is None, row


def test_time_budget_stops_between_cases_and_still_writes(device, tmp_path):
    result = bench_attention.sweep([16, 32], [16], ["fp32"], ["eager", "sdpa"], device=device, time_budget_s=0, **TINY)
    assert result.rows == [] and len(result.not_run) == 4 and not result.complete
    bench_attention.write_outputs(result, tmp_path)
    assert "not run (time budget)" in (tmp_path / "attention.md").read_text()


def test_each_round_of_a_sweep_measures_its_pairs_in_an_order_of_its_own(monkeypatch):
    """With rounds, no (implementation, pass) pair always follows the same one: the first
    implementation listed no longer always runs right after the last one's measurements (on an
    H200 the measurement after SDPA's read 2-5 % slower whatever code it held).  One round
    measures as listed; the orders are seeded, so a rerun measures in the same ones."""
    ran = []

    def measured(impl, case, pass_, device, **_):
        ran.append((case.seq, impl.name, pass_))
        return dict(impl=impl.name, pass_=pass_, ms=1.0, tflops=1.0, host_us=1.0, peak_mib=1.0, status="ok")

    monkeypatch.setattr(bench_attention, "measure_pass", measured)
    impls = [AttentionImpl(name, None) for name in ("ours", "peer")]
    passes = ["forward", "backward", "forward_backward"]
    rounds = 8
    bench_attention.sweep([16, 32], [16], ["fp32"], impls, passes, rounds=rounds, **TINY)
    pairs = [(i.name, p) for i in impls for p in passes]
    by_round = [ran[r * len(pairs):(r + 1) * len(pairs)] for r in range(2 * rounds)]
    assert all(sorted(p[1:] for p in order) == sorted(pairs) for order in by_round)  # each pair once a round
    firsts = {order[0][1:] for order in by_round}
    after_the_peer = {order[i + 1][1:] for order in by_round for i in range(len(order) - 1) if order[i][1] == "peer"}
    assert len(firsts) > 1 and {"ours", "peer"} <= {name for name, _ in firsts}, firsts
    assert any(name == "peer" for name, _ in after_the_peer) and any(name == "ours" for name, _ in after_the_peer)
    again = list(ran)
    ran.clear()
    bench_attention.sweep([16, 32], [16], ["fp32"], impls, passes, rounds=rounds, **TINY)
    assert ran == again  # seeded
    ran.clear()
    bench_attention.sweep([16], [16], ["fp32"], impls, passes, rounds=1, **TINY)
    assert [p[1:] for p in ran] == pairs  # one round: as listed


def test_model_oom_is_a_row_and_the_run_goes_on(device, monkeypatch):
    real_attention = gpt.attention

    def attention(q, k, v, backend):
        if backend == "eager":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_attention(q, k, v, backend)

    monkeypatch.setattr(gpt, "attention", attention)
    rows = bench_model.run_benchmarks(["tiny"], ["eager", "sdpa"], ["fp32"], ["forward", "step"], [16],
                                      batch=1, warmup=0, steps=1, device=device, log=None)
    assert [(r["attention"], r["mode"], r["status"]) for r in rows] == [
        ("eager", "forward", "OOM"), ("eager", "step", "OOM"), ("sdpa", "forward", "ok"), ("sdpa", "step", "ok")]
    section = bench_model.markdown_sections(rows)[0][1]
    assert section.count("| OOM |") >= 2 and "| tiny | eager | fp32 | forward |" in section


def test_model_that_does_not_fit_is_oom_for_every_case(device, monkeypatch):
    def make_gpt(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(gpt, "make_gpt", make_gpt)
    rows = bench_model.run_benchmarks(["tiny"], ["sdpa"], ["fp32", "bf16"], ["forward"], [16],
                                      batch=1, warmup=0, steps=1, device=device, log=None)
    assert [r["status"] for r in rows] == ["OOM", "OOM"]
    assert all("building the model" in r["detail"] for r in rows)


# --- model benchmark, snapshot, trace --------------------------------------------------------


def test_model_rows_carry_every_timed_step_and_the_first_one(device, tmp_path):
    rows = bench_model.run_benchmarks(["tiny"], ["sdpa", "eager"], ["bf16"], ["forward_backward"], [16, 32],
                                      batch=1, warmup=0, steps=3, device=device, log=None)
    bench_model.relative_to(rows, "eager")
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert len(r["times_ms"]) == 3 and r["first_ms"] == r["times_ms"][0] and r["min_ms"] == min(r["times_ms"])
        assert r["mean_ms"] == pytest.approx(sum(r["times_ms"]) / 3)
        assert r["tokens_per_s"] == pytest.approx(r["context"] / (r["mean_ms"] / 1e3))
    assert {r["speedup_vs_eager"] for r in rows if r["attention"] == "eager"} == {1.0}
    paths = bench_model.write_outputs(rows, tmp_path)
    assert [p.name for p in paths] == ["model.md", "model.csv", "model.json", "model.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def _model_and_optimizer(device):
    torch.manual_seed(0)
    model = gpt.make_gpt("tiny", device=device)
    bench_model.set_attention(model, "sdpa")
    return model, bench_model.make_optimizer(model, capturable=device.type == "cuda")


def _graphed_weights_match_eager(device, compiled: bool, graphed_model_breaks=None) -> None:
    """Two replays of the captured step (after its warm-up) against as many eager steps from the
    same seed: the weights must agree.  ``graphed_model_breaks(model)`` plants a bug first."""
    graphed, graphed_opt = _model_and_optimizer(device)
    if graphed_model_breaks is not None:
        graphed_model_breaks(graphed)
    replay = bench_model.make_graphed_step(graphed, "step", "fp32", 1, 16, graphed_opt,
                                           compiled=compiled)  # 3 eager steps, then capture
    for _ in range(2):
        replay()
    eager, eager_opt = _model_and_optimizer(device)
    step = bench_model.make_step(eager, "step", "fp32", 1, 16, eager_opt, compiled=compiled)
    for _ in range(bench_model.GRAPH_WARMUP + 2):
        step()
    torch.cuda.synchronize()
    for (name, a), b in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cuda_graphed_step_replays_what_the_eager_step_computes(device, compiled):
    """A step replayed from a CUDA graph updates the weights as the same step run without
    the graph does (same kernels, gradients written afresh each replay, not summed across
    replays), the compiled forward's step too; off CUDA it is refused by name before
    anything runs."""
    if device.type != "cuda":
        graphed, graphed_opt = _model_and_optimizer(device)
        with pytest.raises(ValueError) as refused:
            bench_model.make_graphed_step(graphed, "step", "fp32", 1, 16, graphed_opt, compiled=compiled)
        names_the_device = str(refused.value).endswith("needs a CUDA device; the model is on cpu")
        assert names_the_device, "the refusal does not say what the graphed step needs"
        return
    _graphed_weights_match_eager(device, compiled)


def test_the_replay_check_fails_when_gradients_are_summed_across_replays(device):
    """The check above can fail: with the graphed model's gradients never cleared, the captured
    backward adds into the warm-up's gradients and every replay into the last one's."""
    if device.type != "cuda":
        pytest.skip("needs a CUDA device: a graph is captured only there (the refusal is checked above)")

    def keep_gradients(model):
        model.zero_grad = lambda set_to_none=True: None  # the mutant: .grad is never cleared

    with pytest.raises(AssertionError):
        _graphed_weights_match_eager(device, compiled=False, graphed_model_breaks=keep_gradients)


def test_graphed_rows_sit_beside_the_plain_ones_and_fail_by_name_off_cuda(device):
    rows = bench_model.run_benchmarks(["tiny"], ["sdpa"], ["fp32"], ["forward_backward"], [16], batch=1, warmup=0,
                                      steps=1, device=device, log=None, graphed=[False, True])
    assert [r["graphed"] for r in rows] == [False, True] and rows[0]["status"] == "ok"
    if device.type == "cuda":
        assert rows[1]["status"] == "ok"
        return
    refused_by_name = rows[1]["status"] != "ok" and "needs a CUDA device" in rows[1]["detail"]
    assert refused_by_name, "the graphed row here is not the step's refusal"
    try:
        bench_model.main(["--device", "cpu", "--sizes", "tiny", "--cuda-graph", "on", "--no-plots"])
        exited = ""
    except SystemExit as exc:
        exited = str(exc)
    refused_here = "--cuda-graph on needs a CUDA device" in exited
    assert refused_here, "the command line does not refuse a graphed run here"


def test_a_compiled_graphed_row_is_run_not_dropped(device):
    # --compile on with --cuda-graph on: the compiled step is captured (or refused by name off CUDA).
    rows = bench_model.run_benchmarks(["tiny"], ["sdpa"], ["fp32"], ["step"], [16], batch=1, warmup=0, steps=1,
                                      device=device, log=None, compiled=[True], graphed=[True])
    assert [(r["compiled"], r["graphed"]) for r in rows] == [(True, True)]
    if device.type == "cuda":
        assert rows[0]["status"] == "ok" and rows[0]["compile_s"] > 0, rows[0]
    else:
        assert "needs a CUDA device" in rows[0]["detail"], rows[0]


def test_profiler_trace_has_the_forward_backward_and_optimizer_ranges(device, tmp_path):
    path, table = bench_model.profile_trace(tmp_path / "trace.json.gz", size="tiny", attention="sdpa", precision="fp32",
                                            batch=1, context=16, device=device)
    assert path.name == "trace.json.gz"
    trace = json.loads(gzip.decompress(path.read_bytes()))
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"forward", "backward", "optimizer_step"} <= names
    assert "optimizer_step" in table


def test_memory_snapshot_is_a_loadable_pickle_on_cuda(device, tmp_path):
    path, note = bench_model.memory_snapshot(tmp_path / "snap.pickle", size="tiny", attention="sdpa", precision="fp32",
                                             batch=1, context=16, device=device)
    if device.type != "cuda":
        assert path is None and note.startswith("memory snapshot needs a GPU")
        return
    snapshot = pickle.loads(path.read_bytes())
    assert "segments" in snapshot and snapshot["device_traces"] and any(snapshot["device_traces"])


# --- plots, command lines, bad input --------------------------------------------------------


def test_plots_are_written_with_oom_points_and_without_memory_data(tmp_path):
    rows = [dict(impl=i, dtype="bf16", d=64, seq=s, ms=(None if st == "OOM" else 0.1 * s), peak_mib=None, status=st,
                 **{"pass": p})
            for i in ("triton", "eager") for s in (128, 256) for p in ("forward", "backward")
            for st in (["OOM"] if (i, s) == ("eager", 256) else ["ok"])]
    paths = plots.plot_attention(rows, tmp_path)
    assert [p.name for p in paths] == ["attention_time.png", "attention_memory.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_command_lines_write_their_tables(device, tmp_path, capsys):
    bench_attention.main(["--device", device.type, "--seq", "16", "--dims", "16", "--dtypes", "fp32", "--impls", "eager",
                          "--passes", "forward", "--rep-ms", "2", "--warmup-ms", "1", "--out", str(tmp_path / "a")])
    bench_model.main(["--device", device.type, "--sizes", "tiny", "--attention", "sdpa", "--precision", "fp32",
                      "--modes", "forward", "--batch", "1", "--context", "16", "--warmup", "0", "--steps", "1",
                      "--out", str(tmp_path / "m"), "--no-plots"])
    assert "| fp32 | 16 | 16 | forward |" in (tmp_path / "a" / "attention.md").read_text()
    assert "| tiny | sdpa | fp32 | forward | False | False | 1 | 16 | 0 | 1 |" in (tmp_path / "m" / "model.md").read_text()
    assert "Attention time" in capsys.readouterr().out


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown attention implementation 'flash3'"):
        bench_attention.make_impl("flash3")
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        Case(16, 16, "fp8")
    with pytest.raises(ValueError, match="seq must be a positive int"):
        Case(0, 16, "fp32")
    with pytest.raises(ValueError, match="unknown pass 'sideways'"):
        bench_attention.sweep([16], [16], ["fp32"], ["eager"], ["sideways"])
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        bench_model.run_benchmarks(["huge"], ["sdpa"], ["fp32"], ["forward"], [16], batch=1, warmup=0, steps=1)
    with pytest.raises(ValueError, match="unknown attention backend 'flash3'"):
        bench_model.set_attention(gpt.make_gpt("tiny"), "flash3")
    with pytest.raises(ValueError, match="mode 'step' needs an optimizer"):
        bench_model.make_step(gpt.make_gpt("tiny"), "step", "fp32", 1, 16)
    with pytest.raises(ValueError, match="steps >= 1"):
        measure.time_calls(lambda: None, "cpu", warmup=0, steps=0)


def test_length_ranges_are_powers_of_two():
    assert bench_attention.parse_lengths(["128:65536"]) == [2**i for i in range(7, 17)]
    assert bench_attention.parse_lengths(["100:300", "48"]) == [48, 128, 256]
    with pytest.raises(ValueError, match="bad range"):
        bench_attention.parse_lengths(["64:16"])


def test_a_target_without_the_kernel_is_reported_not_offered(device, tmp_path):
    adapters = tmp_path / "adapters.py"
    adapters.write_text("def get_flashattention_autograd_function_triton():\n    raise NotImplementedError\n")
    result = bench_attention.sweep([16], [16], ["fp32"], ["triton"], ["forward"], device=device, target=str(adapters), **TINY)
    assert [(r["status"], r["ms"]) for r in result.rows] == [("not offered", None)]
    assert "NotImplementedError" in result.rows[0]["detail"]


def test_gpu_script_runs_every_stage_and_writes_its_files(tmp_path, monkeypatch, capsys):
    """perf.bench.run_gpu at its smallest: every stage, the files it returns, the report."""
    from perf.bench import run_gpu as script

    plan = dict(script.CPU_PLAN,
                warmup0=dict(script.CPU_PLAN["warmup0"], attention=["sdpa"], steps=1),
                model=dict(script.CPU_PLAN["model"], attention=["sdpa"], modes=["step"], warmup=0, steps=1),
                by_context=dict(script.CPU_PLAN["by_context"], attention=["eager"], contexts=[16, 32], warmup=0, steps=1),
                sweeps=[([16], [16], ["fp32"], ["eager", "sdpa"])])
    monkeypatch.setattr(script, "CPU_PLAN", plan)
    monkeypatch.setattr(script, "GPU_PLAN", plan)
    assert script.main(["--out", str(tmp_path), "--tiny"]) == 0
    files = {p.name for p in tmp_path.iterdir()}
    expected = {"report.md", "results.json", "trace.json.gz", "attention_time.png", "attention_memory.png",
                "model.png", "extras.tar.gz"}
    assert expected <= files and len(files) <= 8
    assert ("memory_snapshot.pickle.gz" in files) == torch.cuda.is_available()  # the script picks its own device
    report = (tmp_path / "report.md").read_text()
    for heading in ("--warmup 0 (fresh process)", "Model benchmark", "Model step by context length",
                    "Memory snapshot", "Profiler", "Attention time", "Attention peak memory"):
        assert heading in report, heading
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["attention"]) == 2 * 3 and {r["part"] for r in results["model"]} == {"warmup0", "model", "by_context"}
    assert "Attention time" in capsys.readouterr().out


def test_a_copy_of_an_implementation_is_timed_under_its_own_name(device):
    copy, original = bench_attention.make_impl("eager@2"), bench_attention.make_impl("eager")
    assert copy.name == "eager@2" and copy.fn is original.fn
    result = bench_attention.sweep([16], [16], ["fp32"], ["eager", "eager@2"], ["forward"], device=device,
                                   warmup_ms=1, rep_ms=2, log=None)
    assert sorted(r["impl"] for r in result.rows) == ["eager", "eager@2"]
    assert all(r["ms"] is not None for r in result.rows)
    for bad in ("flash3@2", "eager@", "eager@2@3"):
        with pytest.raises(ValueError, match="unknown attention implementation|NAME@TAG"):
            bench_attention.make_impl(bad)
    assert bench_attention.impl_name("sdpa_flash@2") == "sdpa_flash@2"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown attention implementation 'flash3@2'"):
        bench_attention.impl_name("flash3@2")


def test_device_time_is_measured_only_when_asked_and_kept_round_by_round(device, tmp_path):
    """``--device-time`` adds each pass's device time with the GPU held behind the host (CUDA
    only: None on the CPU, and no table for it), its rounds kept for a paired reading, as the
    host time's are."""
    asked = bench_attention.main(["--device", device.type, "--seq", "16", "--dims", "16", "--dtypes", "fp32",
                                  "--impls", "eager", "--passes", "forward", "--rep-ms", "2", "--warmup-ms", "1",
                                  "--rounds", "2", "--device-time", "--no-plots", "--out", str(tmp_path / "a")])
    plain = bench_attention.sweep([16], [16], ["fp32"], ["eager"], ["forward"], device=device, **TINY)
    md = (tmp_path / "a" / "attention.md").read_text()
    assert all(r["device_ms"] is None for r in plain.rows)
    (row,) = asked.rows
    if device.type == "cuda":
        assert row["device_ms"] > 0 and len(row["device_ms_rounds"]) == 2 and len(row["host_us_rounds"]) == 2
        assert "Device time per call" in md
    else:
        assert row["device_ms"] is None and "device_ms_rounds" not in row and "Device time per call" not in md
        assert measure.device_ms_held_behind(lambda: None, device, host_us=1.0) is None


def test_a_row_of_rounds_keeps_each_reading_of_every_round_and_their_medians():
    rounds = [dict(impl="ours", ms=ms, tflops=1.0, host_us=host, device_ms=dev, peak_mib=1.0, status="ok")
              for ms, host, dev in ((0.3, 40.0, 0.010), (0.1, 20.0, 0.012), (0.2, 30.0, 0.011))]
    row = bench_attention._median_of_rounds(rounds)
    assert (row["ms"], row["host_us"], row["device_ms"]) == (0.2, 30.0, 0.011)
    assert row["ms_rounds"] == [0.3, 0.1, 0.2] and row["host_us_rounds"] == [40.0, 20.0, 30.0]
    assert row["device_ms_rounds"] == [0.010, 0.012, 0.011]
    without = bench_attention._median_of_rounds([dict(r, device_ms=None) for r in rounds])
    assert without["device_ms"] is None and "device_ms_rounds" not in without


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: device time apart from host time")
def test_device_time_held_behind_reads_the_kernels_not_a_slow_hosts_issue(monkeypatch):
    """A call whose host spends 300 us before launching a tiny kernel: with the GPU held behind,
    its device time is the kernel's (well under 300 us); with no hold, the events would time the
    host's wait too, which is what this reading exists to leave out."""
    x = torch.zeros(1024, device="cuda")

    def slow_host_call():
        end = time.perf_counter() + 300e-6
        while time.perf_counter() < end:
            pass
        x.add_(1)

    host = measure.host_us_per_call(slow_host_call, "cuda")
    assert host >= 300
    held = measure.device_ms_held_behind(slow_host_call, "cuda", host_us=host)
    monkeypatch.setattr(measure, "HOLD_FACTOR", 0.0)
    monkeypatch.setattr(measure, "MIN_HOLD_US", 0.0)
    unheld = measure.device_ms_held_behind(slow_host_call, "cuda", host_us=host)
    assert held < 0.1 and unheld > 0.15, (held, unheld)
