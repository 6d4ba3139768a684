"""Does the GPU's power limit decide the d 128 forward against cuDNN's?  Short do_bench blocks
(perf/scripts/forward_wave_tail.py) read our forward 6-9 % faster than cuDNN's at N 4096 d 128
full; the tables' long blocks (100 ms a median, a second an implementation) read it 3 % slower;
under ncu at one clock the two were level.  So: each implementation's pass run back to back for
a few seconds, its steady time per call read by CUDA events, beside the SM clock and board power
that ``nvidia-smi`` samples every 20 ms over the same window, and the energy a call takes.

    PYTHONPATH=. python perf/scripts/attention_power.py [--seconds 3] [--repeats 2] [--variant NAME=SOURCE ...]

--variant adds a copy of flash_gluon.py (a path, or a module name) as implementation NAME, its
FlashAttentionGluon called as the flavour is (perf/scripts/gluon_ab.py's loader), so that a
schedule change is read at the cap beside the module now and cuDNN's, in one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time

import torch
import triton

from perf.bench.attention import AttentionImpl, make_impl, pass_fn
from perf.lib.workloads import cuda_attention_inputs

QUERY = "power.draw,clocks.sm,temperature.gpu,{reasons}.active"


def query() -> str:
    """QUERY with the field name this driver knows for why the clocks are held down."""
    for reasons in ("clocks_event_reasons", "clocks_throttle_reasons"):
        fields = QUERY.format(reasons=reasons)
        if subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={fields}", "--format=csv"],
                          capture_output=True).returncode == 0:
            return fields
    return QUERY.format(reasons="clocks_throttle_reasons")


class Sampler:
    """nvidia-smi's readings, each stamped with this process's monotonic clock on arrival."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, list[str]]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "-i", "0", f"--query-gpu={query()}",
                                      "--format=csv,noheader,nounits", "-lms", "20"],
                                     stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.samples.append((time.monotonic(), [f.strip() for f in line.split(",")]))

    def window(self, start: float, end: float) -> dict:
        return window_means(self.samples, start, end)

    def stop(self) -> None:
        self.proc.terminate()


def window_means(samples: list[tuple[float, list[str]]], start: float, end: float) -> dict:
    """The readings stamped within [start, end]: how many, mean watts, SM MHz and degrees C (a
    field nvidia-smi could not read, such as "[N/A]", left out of its mean; nan if none could be),
    and every distinct clock-event bit mask seen."""
    rows = [fields for stamp, fields in samples if start <= stamp <= end]

    def mean(i: int) -> float:
        values = []
        for fields in rows:
            try:
                values.append(float(fields[i]))
            except (ValueError, IndexError):
                pass
        return statistics.fmean(values) if values else float("nan")

    reasons = sorted({fields[3] for fields in rows if len(fields) > 3})
    return dict(n=len(rows), watts=mean(0), mhz=mean(1), celsius=mean(2), reasons=" ".join(reasons))


def steady(fn, seconds: float, grads) -> tuple[float, float, float, float]:
    """Runs fn back to back for ``seconds``; returns (us per call over the last two thirds, us per
    call over the first 20 calls, the window's start and end on the monotonic clock)."""
    marks = []  # (calls so far, an event recorded there) every 10 calls
    first = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    torch.cuda.synchronize()
    first[0].record()
    for _ in range(20):
        fn()
        for t in grads:
            t.grad = None
    first[1].record()
    t0 = time.monotonic()
    calls = 0
    while time.monotonic() - t0 < seconds:
        if calls % 10 == 0:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            marks.append((calls, e))
        fn()
        for t in grads:
            t.grad = None
        calls += 1
        if calls % 50 == 0:
            marks[-1][1].synchronize()  # keep the host within a few calls of the GPU
    torch.cuda.synchronize()
    t_end = time.monotonic()
    cut = marks[len(marks) // 3]
    last = marks[-1]
    us = cut[1].elapsed_time(last[1]) * 1e3 / (last[0] - cut[0])
    window_start = t0 + (t_end - t0) / 3
    return us, first[0].elapsed_time(first[1]) * 1e3 / 20, window_start, t_end


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--impls", nargs="+", default=["gluon", "sdpa_cudnn"])
    parser.add_argument("--passes", nargs="+", default=["forward", "forward_backward"])
    parser.add_argument("--shape", type=int, nargs=4, default=[4, 16, 4096, 128], metavar=("B", "H", "N", "D"))
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=SOURCE")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    print(subprocess.run(["nvidia-smi", "--query-gpu=power.limit,clocks.max.sm", "--format=csv"],
                         capture_output=True, text=True).stdout.strip())
    sampler = Sampler()
    q, k, v, do = cuda_attention_inputs(*args.shape)
    impls = {name: make_impl(name) for name in args.impls}
    for text in args.variant:
        from perf.scripts.gluon_ab import variant

        name, module = variant(text)
        impls[name] = AttentionImpl(name, lambda q, k, v, causal=True, m=module: m.FlashAttentionGluon.apply(q, k, v, causal))
        args.impls.append(name)
    print(f"B H N d = {args.shape}, causal {args.causal}; {args.seconds} s a block, steady = its last two thirds")
    print("| pass | impl | block | steady us/call | first 20 us/call | SM MHz | board W | mJ/call | C "
          "| nvidia-smi samples | event reasons |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for pass_ in args.passes:
        for r in range(args.repeats):
            for name in (args.impls if r % 2 == 0 else args.impls[::-1]):
                with impls[name].context():
                    fn = pass_fn(impls[name], pass_, q, k, v, do, args.causal)
                    fn()
                    us, first_us, start, end = steady(fn, args.seconds, [q, k, v])
                w = sampler.window(start, end)
                print(f"| {pass_} | {name} | {r} | {us:.1f} | {first_us:.1f} | {w['mhz']:.0f} | {w['watts']:.0f} "
                      f"| {w['watts'] * us * 1e-3:.1f} | {w['celsius']:.0f} | {w['n']} | {w['reasons']} |", flush=True)
                time.sleep(1.0)  # let the clocks settle between blocks
    sampler.stop()


if __name__ == "__main__":
    main()
