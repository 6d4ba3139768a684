"""Tune the Triton FlashAttention-2 (impl/attention/flash_triton.py) on one GPU: check each candidate, time it, compare.

    PYTHONUNBUFFERED=1 python3 -m perf.tune.tune_attention [--phase sweep|confirm] [--budget 380] [--out DIR]
    python3 -m perf.tune.tune_attention --dry-run        # the same flow on the CPU interpreter, tiny shapes

One call does everything below inside a time budget; a step it does not reach is marked
"skipped: out of time", and the JSON and markdown are rewritten after every step.

1. Correctness of every candidate config, in a pool of processes (so the kernels compile in
   parallel): O, L, dQ, dK, dV against float64 through conformance.oracle, fresh inputs per
   check, outputs poisoned; B=1, H=2, the candidate's head dim, bf16 and fp16, causal and
   not, N=1000 (partial tiles) and N=1024 (full tiles, the code path the anchors time);
   plus the single-key probe (a causal row that sees only key 0: O_0 == V_0 and
   dV_0 == dO_0 bit for bit, which holds only if every kernel rounds scale * s alike).
2. Timing (triton.testing.do_bench, median) of the candidates that passed, at their anchor:
   a forward candidate times the forward, a backward candidate the backward alone (from a
   saved O and L).  The current default is timed first and last: their spread is the noise.
   Then the best tiles and the best switches found are combined, checked and timed.
3. Comparison at the anchors: the defaults, the best configs, torch SDPA flash and cuDNN,
   and eager attention where it fits; forward and forward+backward.
4. Peak memory of forward+backward over N = 2048 .. 32768 (d64 anchor otherwise).
5. (--phase confirm, if time is left) the Triton attention checks under pytest --device cuda.

Anchors:  d64   B=1, H=16, N=16384, d=64,  bfloat16, causal (step 3 adds non-causal)
          d128  B=4, H=16, N=4096,  d=128, bfloat16, non-causal
Output: OUT/tune_attention.json and OUT/tune_attention.md (OUT: --out, else $OUT, else
perf-out/); the markdown table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from perf.lib import workloads  # noqa: E402
from perf.lib.measure import median_ms  # noqa: E402
from perf.tune.checks import (compare_with_reference, configured_attention, fwd_bwd, probe_checks,  # noqa: E402
                              probe_inputs)

ROOT = Path(__file__).resolve().parents[2]  # the repository: pytest runs there
BF16, F16 = torch.bfloat16, torch.float16
DTYPES = {"bf16": BF16, "fp16": F16}


# ---------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    name: str
    batch: int
    heads: int
    n: int
    d: int
    causal: bool  # what the sweep times; the comparison adds the other where asked
    compare_both: bool = False


ANCHORS = {
    "d64": Anchor("d64", 1, 16, 16384, 64, True, compare_both=True),
    "d128": Anchor("d128", 4, 16, 4096, 128, False),
}
DRY_ANCHORS = {
    "d64": Anchor("d64", 1, 2, 128, 64, True, compare_both=True),
    "d128": Anchor("d128", 1, 2, 128, 128, False),
}
MEMORY_SEQS = [2048, 4096, 8192, 16384, 32768]
DRY_MEMORY_SEQS = [64, 128]


PASS_OF_KIND = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward_backward"}


def attention_flops(a: Anchor, causal: bool, kind: str) -> float:
    """Useful FLOPs at the anchor (``workloads.attention_flops``); kind: fwd, bwd (alone), fwd+bwd."""
    return workloads.attention_flops(a.batch, a.heads, a.n, a.d, causal, PASS_OF_KIND[kind])


# ---------------------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    name: str
    anchor: str  # key of ANCHORS
    kind: str  # "fwd" or "bwd"
    config: tuple  # sorted (field, value) pairs of ForwardConfig / BackwardConfig
    group: str  # "tiles-fwd", "tiles-dkdv", "tiles-dq", "switches", "default", "combined"

    @property
    def config_dict(self) -> dict:
        return dict(self.config)


def _fwd(anchor, group, bm, bn, w, s, lpt=True, tma=False, fuse=False) -> Candidate:
    tag = f"fwd {bm}x{bn} w{w} s{s}" + (" lpt" if lpt else "") + (" tma" if tma else "") + (" fuse" if fuse else "")
    cfg = dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s, longest_first=lpt, tma=tma, fp_fusion=fuse)
    return Candidate(f"{anchor} {tag}", anchor, "fwd", tuple(sorted(cfg.items())), group)


def _bwd(anchor, group, dkdv, dq, lpt=True, tma=False, pre=128) -> Candidate:
    """dkdv = (block_n, block_m, warps, stages) of the dK/dV kernel; dq = (block_m, block_n, warps, stages)."""
    tag = (f"bwd dkdv {dkdv[0]}x{dkdv[1]} w{dkdv[2]} s{dkdv[3]} | dq {dq[0]}x{dq[1]} w{dq[2]} s{dq[3]}"
           + (" lpt" if lpt else "") + (" tma" if tma else ""))
    cfg = dict(dkdv_block_n=dkdv[0], dkdv_block_m=dkdv[1], num_warps=dkdv[2], num_stages=dkdv[3],
               dq_block_m=dq[0], dq_block_n=dq[1], dq_num_warps=dq[2], dq_num_stages=dq[3],
               preprocess_block_m=pre, longest_first=lpt, tma=tma)
    return Candidate(f"{anchor} {tag}", anchor, "bwd", tuple(sorted(cfg.items())), group)


def default_candidates(anchors) -> list[Candidate]:
    """The tables' current entries, as candidates (the baseline every other is timed against)."""
    from impl.attention import flash_triton as ft

    out = []
    for name, a in anchors.items():
        device = torch.device("cuda")
        f = ft.default_forward_config(BF16, a.d, device)
        b = ft.default_backward_config(BF16, a.d, device, a.causal)
        fd = {k: v for k, v in asdict(f).items()}
        bd = {k: v for k, v in asdict(b).items()}
        bd["dq_num_warps"] = bd["dq_num_warps"] or bd["num_warps"]
        bd["dq_num_stages"] = bd["dq_num_stages"] or bd["num_stages"]
        out.append(Candidate(f"{name} fwd default", name, "fwd", tuple(sorted(fd.items())), "default"))
        out.append(Candidate(f"{name} bwd default", name, "bwd", tuple(sorted(bd.items())), "default"))
    return out


def sweep_candidates() -> list[Candidate]:
    """Tile shapes, warps and stages per kernel, and the switches (longest-first order, TMA,
    forward FMA fusion), chosen from the sm_90 resource report (perf/tune/attention_sm90_report.py:
    no heavy spills, shared memory that fits).  Kept short: on the GPU machine each candidate
    costs some 4-8 kernel compilations of a few seconds for its correctness checks."""
    c = []
    # d=64 forward (causal): 8 warps = two warpgroups of 64 query rows for BLOCK_M=128.
    for bm, bn, w, s, tma, fuse in [(128, 64, 8, 3, True, False),
                                    (128, 64, 8, 3, False, True), (128, 64, 8, 4, False, False),
                                    (128, 128, 8, 2, False, False), (128, 128, 8, 2, True, False),
                                    (64, 64, 4, 3, False, False), (256, 64, 16, 2, False, False)]:
        c.append(_fwd("d64", "switches" if (tma or fuse) else "tiles-fwd", bm, bn, w, s, tma=tma, fuse=fuse))
    c.append(_fwd("d64", "switches", 128, 64, 8, 3, lpt=False))  # the previous default (the new: lpt)
    # d=64 backward: (dK/dV tiles, dQ tiles, switches)
    for dkdv, dq, group, lpt, tma in [
        ((64, 64, 4, 2), (64, 64, 4, 2), "switches", False, False),  # the previous default
        ((64, 64, 4, 2), (64, 64, 4, 2), "switches", True, False),
        ((64, 64, 4, 2), (64, 64, 4, 2), "switches", True, True),
        ((128, 32, 4, 3), (64, 64, 4, 3), "switches", True, True),
        ((128, 64, 8, 3), (64, 64, 4, 3), "tiles-dkdv", True, False),
        ((128, 32, 8, 3), (64, 64, 4, 3), "tiles-dkdv", True, False),
        ((128, 32, 4, 3), (128, 64, 8, 2), "tiles-dq", True, False),
        ((128, 32, 4, 3), (128, 32, 8, 3), "tiles-dq", True, False),
        ((128, 64, 8, 3), (128, 64, 8, 2), "tiles-dq", True, True),
    ]:
        c.append(_bwd("d64", group, dkdv, dq, lpt=lpt, tma=tma))
    # d=128 (non-causal: the order switch changes nothing there; TMA may)
    c.append(_fwd("d128", "switches", 128, 64, 8, 3, tma=True))
    c.append(_fwd("d128", "tiles-fwd", 128, 128, 8, 2, tma=True))
    c.append(_fwd("d128", "tiles-fwd", 64, 64, 4, 3, tma=True))
    c.append(_bwd("d128", "switches", (64, 32, 4, 2), (64, 32, 4, 2), tma=True))
    c.append(_bwd("d128", "tiles-dkdv", (128, 32, 8, 2), (128, 32, 8, 2), tma=True))
    c.append(_bwd("d128", "tiles-dq", (64, 32, 4, 3), (64, 32, 4, 3)))
    return c


def dry_candidates() -> list[Candidate]:
    return [_fwd("d64", "tiles-fwd", 32, 32, 4, 1), _fwd("d64", "switches", 32, 32, 4, 1, tma=True),
            _bwd("d64", "tiles-dkdv", (32, 16, 4, 1), (32, 32, 4, 1)),
            _bwd("d64", "tiles-dq", (64, 64, 4, 1), (32, 16, 4, 1), tma=True),
            _fwd("d128", "tiles-fwd", 32, 32, 4, 1)]


# ---------------------------------------------------------------------------------------
# Correctness (runs in pool processes)
# ---------------------------------------------------------------------------------------

# (dtype, causal, N) per anchor: the anchor's timed combination at N=1024 (full tiles, the
# code path the timing runs), the others mixed between N=1024 and N=1000 (partial tiles), so
# that each candidate compiles each kernel once per (dtype, causal) and no more.
CHECKS = {
    "d64": [("bf16", True, 1024), ("bf16", False, 1000), ("fp16", True, 1024), ("fp16", False, 1000)],
    "d128": [("bf16", False, 1024), ("bf16", True, 1000), ("fp16", False, 1024), ("fp16", True, 1000)],
}
DRY_CHECKS = {"d64": [("fp16", True, 70), ("bf16", False, 64)], "d128": [("fp16", False, 64)]}
PROBES = [("bf16", 256), ("fp16", 256), ("bf16", 50)]  # (dtype, n_k) for a single causal query row


def _device() -> torch.device:
    return torch.device("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")


def _configs(cand: dict):
    """(forward config or None, backward config or None) for a candidate given as a dict."""
    cfg = dict(cand["config"])
    return (cfg, None) if cand["kind"] == "fwd" else (None, cfg)


def _ours(q, k, v, do, causal, fwd_cfg, bwd_cfg):
    from impl.attention import flash_triton as ft

    o, lse = ft.flash_forward(q, k, v, causal, config=fwd_cfg)
    dq, dk, dv = ft.flash_backward(q, k, v, o, lse, do, causal, config=bwd_cfg)
    return {"O": o, "L": lse, "dQ": dq, "dK": dk, "dV": dv}


def _eager(q, k, v, do, causal):
    from impl.attention.reference import attention_reference

    return fwd_bwd(attention_reference, q, k, v, do, causal)


def check_one(cand: dict, dtype_name: str, causal: bool, n: int, d: int) -> dict:
    from conformance import oracle
    from conformance.laws.attention.magnitudes import attention_magnitudes
    from impl.attention.reference import default_scale

    device, dtype = _device(), DTYPES[dtype_name]
    label = f"{dtype_name} {'causal' if causal else 'full'} N={n} d={d}"
    g = torch.Generator(device=device).manual_seed(zlib.crc32(f"{cand['name']} {label} {time.time()}".encode()))
    q, k, v, do = (torch.randn(1, 2, n, d, generator=g, device=device).to(dtype) for _ in range(4))
    fwd_cfg, bwd_cfg = _configs(cand)
    with oracle.poisoned_allocations(device):
        got = _ours(q, k, v, do, causal, fwd_cfg, bwd_cfg)
    ref = _eager(*(t.double() for t in (q, k, v, do)), causal)
    eager = _eager(q, k, v, do, causal)
    mags = attention_magnitudes(q, k, v, do, causal, default_scale(d), dtype)
    ratios, failures = compare_with_reference(got, ref, eager, dtype, mags, digits=3)
    failures = [f"{label}: {f}" for f in failures]
    return dict(check=label, ok=not failures, worst_error_over_bound=ratios, failures=failures)


def probe_one(cand: dict, dtype_name: str, n_k: int, d: int) -> dict:
    """N_q = 1 under causal masking: P_00 = 1, so O_0 = V_0 and dV_0 = dO_0 exactly."""
    q, k, v, do = probe_inputs(DTYPES[dtype_name], d, n_k, _device())
    got = _ours(q, k, v, do, True, *_configs(cand))
    checks = probe_checks(got["O"], got["dK"], got["dV"], v, do)
    label = f"probe {dtype_name} n_k={n_k} d={d}"
    failed = [name for name, ok in checks.items() if not ok]
    return dict(check=label, ok=not failed, failures=[f"{label}: {', '.join(failed)} false"] if failed else [])


def check_candidate(cand: dict, d: int, checks, probes, verbose: bool = False) -> dict:
    """Every check and probe for one candidate; an exception is a failed candidate, not a crash."""
    t0 = time.time()
    results = []
    try:
        for dtype_name, causal, n in checks:
            results.append(check_one(cand, dtype_name, causal, n, d))
            if verbose:
                print(f"    ({os.getpid()}) {cand['name']}: {results[-1]['check']} "
                      f"{'ok' if results[-1]['ok'] else 'FAIL'} at {time.time() - t0:.0f}s", flush=True)
        for dtype_name, n_k in probes:
            results.append(probe_one(cand, dtype_name, n_k, d))
        if _device().type == "cuda":
            torch.cuda.synchronize()
        failures = [f for r in results for f in r["failures"]]
        status = "ok" if not failures else "FAIL"
    except Exception as exc:
        failures = [f"{type(exc).__name__}: {exc}", traceback.format_exc()[-1500:]]
        status = "ERROR"
    worst = {}
    for r in results:
        for key, ratio in r.get("worst_error_over_bound", {}).items():
            worst[key] = max(worst.get(key, 0.0), ratio)
    return dict(name=cand["name"], status=status, failures=failures, worst_error_over_bound=worst,
                seconds=round(time.time() - t0, 1))


def _pool_check(args):
    cand, d, checks, probes = args
    torch.set_num_threads(2)  # many workers share the machine's cores; the CPU work here is small
    return check_candidate(cand, d, checks, probes, verbose=True)


# ---------------------------------------------------------------------------------------
# Timing (main process, after the pool is gone)
# ---------------------------------------------------------------------------------------


def bench_ms(fn, rep_ms: int = 100) -> float:
    if _device().type != "cuda":  # dry run: a wall clock is enough to exercise the flow
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return median_ms(fn, "cuda", warmup_ms=25, rep_ms=rep_ms)  # triton.testing.do_bench, median


def make_inputs(a: Anchor, n: int | None = None, seed: int = 0, grad=False):
    """bf16 inputs at the anchor's shape (sequence length ``n`` if given)."""
    return workloads.make_inputs((a.batch, a.heads, a.n if n is None else n, a.d), BF16, _device(), seed, grad)


def time_candidate(cand: Candidate, a: Anchor, inputs, saved) -> float:
    from impl.attention import flash_triton as ft

    q, k, v, do = inputs
    cfg = cand.config_dict
    if cand.kind == "fwd":
        def run():
            ft.flash_forward(q, k, v, a.causal, config=cfg)
    else:
        o, lse = saved

        def run():
            ft.flash_backward(q, k, v, o, lse, do, a.causal, config=cfg)
    with torch.no_grad():
        return bench_ms(run)


def sdpa(backend_name):
    """torch SDPA forced to one backend (flash, cudnn), as ``fn(q, k, v, causal)``."""
    return lambda q, k, v, causal: workloads.sdpa_attention(q, k, v, causal, backend=backend_name)


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


@dataclass
class Report:
    out: Path
    data: dict = field(default_factory=dict)

    def save(self):
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "tune_attention.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "tune_attention.md").write_text(render_markdown(self.data))


def environment() -> dict:
    import triton

    env = dict(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
               time=time.strftime("%Y-%m-%d %H:%M:%S %Z"), command=" ".join(sys.argv))
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["capability"] = torch.cuda.get_device_capability(0)
        env["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        try:  # read-only query of the card's state, for the notes
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as exc:
            env["nvidia_smi"] = f"unavailable: {exc}"
    else:
        env["device"] = "cpu (Triton interpreter)"
    return env


def run_correctness(cands: list[Candidate], anchors, checks, probes, workers: int, deadline: float) -> dict:
    import multiprocessing as mp

    results = {}
    jobs = [(dict(name=c.name, kind=c.kind, config=c.config), anchors[c.anchor].d, checks[c.anchor], probes)
            for c in cands]
    # A few candidates per process: a kernel that corrupts its CUDA context (an illegal
    # address is sticky) can then fail only its neighbours, not a whole worker's share.
    pool = mp.get_context("spawn").Pool(workers, maxtasksperchild=4)
    try:
        it = pool.imap_unordered(_pool_check, jobs)
        for _ in jobs:
            r = it.next(timeout=max(1.0, deadline - time.time()))
            results[r["name"]] = r
            worst = max(r["worst_error_over_bound"].values(), default=float("nan"))
            print(f"  [{r['status']:5s}] {r['name']}  worst err/bound {worst:.3f}  {r['seconds']}s", flush=True)
            for msg in r["failures"][:3]:
                print(f"          {msg}", flush=True)
    except mp.TimeoutError:
        print("  correctness: out of time; unchecked candidates are not timed", flush=True)
    finally:
        pool.terminate()  # a worker stuck in a compile must not outlive the step
        pool.join()
        for job in jobs:
            name = job[0]["name"]
            if name not in results:
                results[name] = dict(name=name, status="skipped: out of time", failures=[], worst_error_over_bound={})
    return results


def run_timing(cands, anchors, status, deadline, report) -> dict:
    """Time the passing candidates per anchor; the defaults first and last (noise)."""
    timings = report.data.setdefault("timings", {})
    for aname, a in anchors.items():
        mine = [c for c in cands if c.anchor == aname and status.get(c.name, {}).get("status") == "ok"]
        if not mine:
            continue
        inputs = make_inputs(a, seed=1)
        saved = None
        if any(c.kind == "bwd" for c in mine):
            from impl.attention import flash_triton as ft

            with torch.no_grad():
                saved = ft.flash_forward(*inputs[:3], a.causal)
        defaults = [c for c in mine if c.group == "default"]
        order = defaults + [c for c in mine if c.group != "default"] + [
            Candidate(c.name + " (again)", c.anchor, c.kind, c.config, "default-again") for c in defaults]
        for c in order:
            if time.time() > deadline:
                timings[c.name] = dict(status="skipped: out of time")
                continue
            try:
                ms = time_candidate(c, a, inputs, saved)
                tflops = attention_flops(a, a.causal, c.kind) / (ms * 1e-3) / 1e12
                timings[c.name] = dict(anchor=aname, kind=c.kind, group=c.group, ms=round(ms, 4),
                                       tflops=round(tflops, 1), config=c.config_dict)
                print(f"  {c.name:75s} {ms:8.3f} ms  {tflops:6.1f} TFLOP/s", flush=True)
            except Exception as exc:
                timings[c.name] = dict(status=f"error: {type(exc).__name__}: {exc}"[:400])
                print(f"  {c.name:75s} error: {type(exc).__name__}: {exc}"[:300], flush=True)
        del inputs, saved
        if _device().type == "cuda":
            torch.cuda.empty_cache()
        report.save()
    return timings


def best_of(timings: dict, anchor: str, kind: str, groups) -> dict | None:
    rows = [(t["ms"], name, t) for name, t in timings.items()
            if "ms" in t and t["anchor"] == anchor and t["kind"] == kind and t["group"] in groups]
    return min(rows, key=lambda r: r[0])[2] if rows else None


def combined_candidates(timings: dict, anchors) -> list[Candidate]:
    """Best tiles per kernel with the best switches, where that combination was not timed yet."""
    combos = []
    taken = {tuple(sorted(t["config"].items())) for t in timings.values() if "config" in t}
    for aname in anchors:
        proposed = []  # (kind, config), forward first
        best_f = best_of(timings, aname, "fwd", ("tiles-fwd", "switches", "default"))
        if best_f:
            cfg = dict(best_f["config"])
            sw = best_of(timings, aname, "fwd", ("switches",))
            if sw:
                cfg.update(tma=sw["config"]["tma"], fp_fusion=sw["config"]["fp_fusion"])
            proposed.append(("fwd", cfg))
        best_dkdv = best_of(timings, aname, "bwd", ("tiles-dkdv", "default"))
        best_dq = best_of(timings, aname, "bwd", ("tiles-dq", "default"))
        sw = best_of(timings, aname, "bwd", ("switches", "default"))
        if best_dkdv and best_dq:
            cfg = dict(best_dkdv["config"])
            for f in ("dq_block_m", "dq_block_n", "dq_num_warps", "dq_num_stages"):
                cfg[f] = best_dq["config"][f]
            if sw:
                cfg.update(tma=sw["config"]["tma"], longest_first=sw["config"]["longest_first"])
            proposed.append(("bwd", cfg))
        for kind, cfg in proposed:
            key = tuple(sorted(cfg.items()))
            if key not in taken:
                taken.add(key)
                combos.append(Candidate(f"{aname} {kind} combined {_short(cfg)}", aname, kind, key, "combined"))
    return combos


def _short(cfg: dict) -> str:
    if "block_m" in cfg:
        s = f"{cfg['block_m']}x{cfg['block_n']} w{cfg['num_warps']} s{cfg['num_stages']}"
    else:
        s = (f"dkdv {cfg['dkdv_block_n']}x{cfg['dkdv_block_m']} w{cfg['num_warps']} s{cfg['num_stages']}"
             f" | dq {cfg['dq_block_m']}x{cfg['dq_block_n']} w{cfg['dq_num_warps']} s{cfg['dq_num_stages']}")
    return s + "".join(f" {flag}" for flag, on in (("lpt", cfg.get("longest_first")), ("tma", cfg.get("tma")),
                                                   ("fuse", cfg.get("fp_fusion"))) if on)


def run_comparison(anchors, timings, deadline, report) -> dict:
    """Defaults, best configs, SDPA flash/cuDNN, eager: fwd and fwd+bwd at each anchor."""
    comp = report.data.setdefault("comparison", {})
    for aname, a in anchors.items():
        best_f = best_of(timings, aname, "fwd", ("tiles-fwd", "switches", "default", "combined"))
        best_b = best_of(timings, aname, "bwd", ("tiles-dkdv", "tiles-dq", "switches", "default", "combined"))
        impls = {"ours (defaults)": configured_attention()}
        if best_f or best_b:
            impls["ours (best of sweep)"] = configured_attention(best_f and best_f["config"], best_b and best_b["config"])
            comp[f"{aname} best configs"] = dict(fwd=best_f and best_f["config"], bwd=best_b and best_b["config"])
        impls.update({"sdpa flash": sdpa("flash"), "sdpa cudnn": sdpa("cudnn"), "eager": workloads.eager_attention})
        q, k, v, do = make_inputs(a, seed=2, grad=True)
        for causal in ((True, False) if a.compare_both else (a.causal,)):
            tag = f"{aname} {'causal' if causal else 'full'}"
            for name, fn in impls.items():
                for kind in ("fwd", "fwd+bwd"):
                    key = f"{tag} | {name} | {kind}"
                    if time.time() > deadline:
                        comp[key] = dict(status="skipped: out of time")
                        continue
                    if name == "eager" and not causal and a.compare_both:
                        comp[key] = dict(status="not run: eager timed under causal only")
                        continue
                    try:
                        if kind == "fwd":
                            def run(fn=fn, causal=causal):
                                with torch.no_grad():
                                    fn(q, k, v, causal)
                        else:
                            def run(fn=fn, causal=causal):
                                fn(q, k, v, causal).backward(do)
                                q.grad = k.grad = v.grad = None
                        ms = bench_ms(run, rep_ms=200)
                        tflops = attention_flops(a, causal, kind) / (ms * 1e-3) / 1e12
                        comp[key] = dict(ms=round(ms, 4), tflops=round(tflops, 1))
                        print(f"  {key:60s} {ms:9.3f} ms  {tflops:6.1f} TFLOP/s", flush=True)
                    except torch.OutOfMemoryError:
                        comp[key] = dict(status="OOM")
                        print(f"  {key:60s} OOM", flush=True)
                    except Exception as exc:
                        comp[key] = dict(status=f"error: {type(exc).__name__}: {exc}"[:300])
                        print(f"  {key:60s} error: {type(exc).__name__}: {exc}"[:200], flush=True)
                    finally:
                        q.grad = k.grad = v.grad = None
                        if _device().type == "cuda":
                            torch.cuda.empty_cache()
        report.save()
        del q, k, v, do
    return comp


def run_memory(anchor: Anchor, seqs, deadline, report, best_cfgs) -> dict:
    """Peak memory above the inputs of one forward+backward (grads included), per N."""
    mem = report.data.setdefault("memory", {})
    impls = {"ours (defaults)": configured_attention(), "sdpa flash": sdpa("flash"), "sdpa cudnn": sdpa("cudnn"),
             "eager": workloads.eager_attention}
    if best_cfgs:
        impls["ours (best of sweep)"] = configured_attention(*best_cfgs)
    cuda = _device().type == "cuda"
    for n in seqs:
        q, k, v, do = make_inputs(anchor, n=n, seed=3, grad=True)
        for name, fn in impls.items():
            key = f"N={n} | {name}"
            if time.time() > deadline:
                mem[key] = dict(status="skipped: out of time")
                continue
            if name == "eager" and n > 16384:
                mem[key] = dict(status="not run: the N x N scores need more than the card has")
                continue
            try:
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                fn(q, k, v, anchor.causal).backward(do)
                if cuda:
                    torch.cuda.synchronize()
                    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                    mem[key] = dict(peak_mib=round(peak, 1), inputs_mib=round(4 * q.numel() * 2 / 2**20, 1))
                    print(f"  {key:40s} peak above inputs {peak:10.1f} MiB", flush=True)
                else:
                    mem[key] = dict(status="no CUDA memory statistics on the CPU")
            except torch.OutOfMemoryError:
                mem[key] = dict(status="OOM")
                print(f"  {key:40s} OOM", flush=True)
            except Exception as exc:
                mem[key] = dict(status=f"error: {type(exc).__name__}: {exc}"[:300])
            finally:
                q.grad = k.grad = v.grad = None
        del q, k, v, do
        report.save()
    return mem


def run_pytest(deadline, report):
    left = deadline - time.time()
    if left < 40:
        report.data["pytest"] = dict(status=f"skipped: {left:.0f}s left")
        return
    cmd = [sys.executable, "-m", "pytest", "conformance/spec/test_attention.py", "properties/test_triton_configs.py",
           "properties/test_attention.py", "-k", "triton", "--device", "cuda", "--hypothesis-profile", "ci", "-q", "-p", "no:cacheprovider"]
    print(f"\n== {' '.join(cmd[2:])}  ({left:.0f}s left)", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=left)
        report.data["pytest"] = dict(rc=proc.returncode, tail=(proc.stdout + proc.stderr)[-3000:])
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        report.data["pytest"] = dict(rc="timeout", tail=out[-3000:])
    print(report.data["pytest"]["tail"][-1500:], flush=True)
    report.save()


# ---------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------


def _ms(entry) -> str:
    if not entry:
        return "-"
    return f"{entry['ms']:.3f}" if "ms" in entry else str(entry.get("status", "-"))[:60]


def _table_head(title: str, columns, align) -> list[str]:
    """A section heading and a Markdown table's header and alignment rows."""
    return [f"## {title}", "", "| " + " | ".join(columns) + " |", "| " + " | ".join(align) + " |"]


def _correctness_lines(data: dict) -> list[str]:
    corr = data.get("correctness", {})
    if not corr:
        return []
    ok = sum(r["status"] == "ok" for r in corr.values())
    lines = [f"Correctness: {ok} of {len(corr)} candidates passed every check and probe.", ""]
    for r in corr.values():
        if r["status"] != "ok":
            lines.append(f"- {r['name']}: {r['status']} {'; '.join(r['failures'][:2])[:300]}")
    return lines + [""]


def _sweep_lines(data: dict, compact: bool) -> list[str]:
    timings = data.get("timings", {})
    if not timings:
        return []
    lines = _table_head("Sweep (median ms at the anchor; fwd = forward, bwd = backward alone)",
                        ("candidate", "ms", "TFLOP/s", "vs default"), ("---", "---:", "---:", "---:"))
    base = {(t["anchor"], t["kind"]): t["ms"] for n, t in timings.items() if "ms" in t and t["group"] == "default"}
    shown: dict = {}
    for name, t in sorted(timings.items(), key=lambda kv: (kv[1].get("anchor", ""), kv[1].get("kind", ""),
                                                             kv[1].get("ms", 1e9))):
        if "ms" in t:
            group = (t["anchor"], t["kind"])
            shown[group] = shown.get(group, 0) + 1
            if compact and shown[group] > 6 and not t["group"].startswith("default"):
                continue
            b = base.get(group)
            rel = f"{t['ms'] / b:.3f}" if b else "-"
            lines.append(f"| {name} | {t['ms']:.3f} | {t['tflops']} | {rel} |")
        elif not compact:
            lines.append(f"| {name} | {str(t.get('status'))[:80]} | | |")
    return lines + [""]


def _comparison_lines(data: dict) -> list[str]:
    comp = data.get("comparison", {})
    if not comp:
        return []
    lines = _table_head("Comparison at the anchors (median ms; TFLOP/s in brackets)",
                        ("anchor", "implementation", "fwd", "fwd+bwd"), ("---", "---", "---:", "---:"))
    rows = {}
    for key, entry in comp.items():
        if " | " not in key:
            continue
        tag, name, kind = key.split(" | ")
        rows.setdefault((tag, name), {})[kind] = entry
    for (tag, name), kinds in rows.items():
        cells = []
        for kind in ("fwd", "fwd+bwd"):
            e = kinds.get(kind)
            cells.append(f"{_ms(e)} ({e['tflops']})" if e and "ms" in e else _ms(e))
        lines.append(f"| {tag} | {name} | {cells[0]} | {cells[1]} |")
    for key, entry in comp.items():
        if key.endswith("best configs"):
            lines += ["", f"{key}: fwd `{entry['fwd']}`, bwd `{entry['bwd']}`"]
    return lines + [""]


def _memory_lines(data: dict) -> list[str]:
    mem = data.get("memory", {})
    if not mem:
        return []
    names = sorted({k.split(" | ")[1] for k in mem})
    seqs = sorted({int(k.split(" | ")[0][2:]) for k in mem})
    a = data.get("anchors", {}).get("d64", {})
    lines = _table_head(f"Peak memory of forward+backward above the inputs (MiB; B={a.get('batch')}, "
                        f"H={a.get('heads')}, d={a.get('d')}, bf16, causal)", ("N", *names),
                        ("---:",) * (1 + len(names)))
    for n in seqs:
        cells = []
        for name in names:
            e = mem.get(f"N={n} | {name}", {})
            cells.append(f"{e['peak_mib']:.0f}" if "peak_mib" in e else str(e.get("status", "-"))[:40])
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines + [""]


def render_markdown(data: dict, compact: bool = False) -> str:
    """The report as markdown; compact keeps the 6 fastest sweep rows per anchor and kind."""
    env = data.get("environment", {})
    lines = [f"# Triton FlashAttention-2 tuning ({data.get('phase', '?')})", "",
             f"{env.get('device', '?')}, torch {env.get('torch', '?')}, Triton {env.get('triton', '?')}, "
             f"CUDA {env.get('cuda', '?')}, {env.get('time', '')}", "",
             f"Command: `{env.get('command', '')}`", ""]
    lines += _correctness_lines(data) + _sweep_lines(data, compact) + _comparison_lines(data) + _memory_lines(data)
    if "pytest" in data:
        p = data["pytest"]
        lines += ["## GPU checks (pytest)", "", f"rc={p.get('rc', p.get('status'))}", "",
                  "```", p.get("tail", "")[-1200:], "```", ""]
    for step, secs in data.get("step_seconds", {}).items():
        lines.append(f"- {step}: {secs:.0f} s")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=("sweep", "confirm"), default="sweep",
                        help="sweep: every candidate; confirm: the defaults and the comparison, then pytest")
    parser.add_argument("--budget", type=float, default=380.0, help="seconds for the whole call")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "perf-out"))
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes, a few candidates")
    parser.add_argument("--pytest", action="store_true", help="run the GPU attention checks last in the sweep phase too")
    parser.add_argument("--extra", default="", help="JSON list of extra candidates [name, anchor, kind, {config}]")
    args = parser.parse_args()
    start = time.time()
    deadline = start + args.budget
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("needs a GPU: no CUDA device is visible (use --dry-run to exercise the flow on the CPU)")
        return 2
    anchors = DRY_ANCHORS if dry else ANCHORS
    report = Report(Path(args.out))
    report.data.update(phase=args.phase + (" (dry run)" if dry else ""), environment=environment(),
                       anchors={k: asdict(v) for k, v in anchors.items()}, step_seconds={})
    print(json.dumps(report.data["environment"]), flush=True)
    steps = report.data["step_seconds"]

    cands = default_candidates(anchors)
    if args.phase == "sweep":
        cands += dry_candidates() if dry else sweep_candidates()
    for name, aname, kind, cfg in json.loads(args.extra or "[]"):
        cands.append(Candidate(name, aname, kind, tuple(sorted(cfg.items())), "extra"))

    # 1. correctness: the defaults here first (their kernels, which every other candidate's
    # checks also run, then sit in Triton's disk cache), the rest in parallel processes
    t = time.time()
    checks, probes = (DRY_CHECKS, PROBES[:1]) if dry else (CHECKS, PROBES)
    workers = 2 if dry else args.workers
    print(f"\n== correctness: {len(cands)} candidates x (4 checks + {len(probes)} probes), "
          f"defaults here, the rest in {workers} processes", flush=True)
    status = {}
    for c in [c for c in cands if c.group == "default"]:
        status[c.name] = r = check_candidate(dict(name=c.name, kind=c.kind, config=c.config), anchors[c.anchor].d,
                                             checks[c.anchor], probes, verbose=True)
        print(f"  [{r['status']:5s}] {c.name}  {r['seconds']}s  {'; '.join(r['failures'][:2])[:300]}", flush=True)
    share = 0.45 if args.phase == "sweep" else 0.3
    status.update(run_correctness([c for c in cands if c.group != "default"], anchors, checks, probes, workers,
                                  start + share * args.budget))
    report.data["correctness"] = status
    steps["correctness"] = time.time() - t
    report.save()

    # 2. timing, then (d64 only) the best tiles combined with the best switches
    t = time.time()
    print("\n== timing (do_bench median)", flush=True)
    timing_end = deadline - (110 if args.phase == "sweep" else 200)
    timings = run_timing(cands, anchors, status, timing_end, report)
    if args.phase == "sweep" and time.time() < timing_end - 40:
        combos = [c for c in combined_candidates(timings, anchors) if c.anchor == "d64"]
        if combos:
            print(f"\n== combined candidates: {len(combos)}", flush=True)
            for c in combos:
                if time.time() > timing_end - 30:
                    break
                status[c.name] = check_candidate(dict(name=c.name, kind=c.kind, config=c.config),
                                                 anchors[c.anchor].d, checks[c.anchor], probes)
                print(f"  [{status[c.name]['status']:5s}] {c.name}", flush=True)
            run_timing(combos, anchors, status, timing_end, report)
    steps["timing"] = time.time() - t
    report.save()

    # 3. comparison at the anchors
    t = time.time()
    print("\n== comparison", flush=True)
    run_comparison(anchors, timings, deadline - (60 if args.phase == "sweep" else 150), report)
    steps["comparison"] = time.time() - t

    # 4. memory
    t = time.time()
    print("\n== peak memory, forward+backward", flush=True)
    best_f = best_of(timings, "d64", "fwd", ("tiles-fwd", "switches", "default", "combined"))
    best_b = best_of(timings, "d64", "bwd", ("tiles-dkdv", "tiles-dq", "switches", "default", "combined"))
    best = (best_f and best_f["config"], best_b and best_b["config"]) if args.phase == "sweep" else None
    run_memory(anchors["d64"], DRY_MEMORY_SEQS if dry else MEMORY_SEQS, deadline - (15 if args.phase == "sweep" else 110),
               report, best)
    steps["memory"] = time.time() - t
    report.save()

    # 5. the GPU checks
    if (args.phase == "confirm" or args.pytest) and not dry:
        t = time.time()
        run_pytest(deadline - 5, report)
        steps["pytest"] = time.time() - t
    steps["total"] = time.time() - start
    report.save()
    print("\n" + render_markdown(report.data, compact=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
