"""Host microseconds of one Gluon attention call and of its parts, beside torch's own ops,
at the GPT-small shape (B4 H12 N256 d64, causal, bf16; q, k, v transposed views of one
projection, as the model makes them).

    PYTHONPATH=. python perf/scripts/gluon_host_breakdown.py

The inputs cycle through 48 sets, so a call's input addresses recur only every 48 calls.
Rows: the custom ops a compiled model calls (``custom_ops.flash_forward/backward``: the
dispatcher, then our Python), ``flash_gluon.flash_backward`` without the dispatcher, the
plan's key, the plan's call, its three launches alone, its five allocations alone, and
torch's flash and cuDNN ops on the same tensors.  Each row: the median over 7 rounds of 600
calls of the host's time per call (nothing waits for the GPU inside a round).  Once with the
call graphs on and once off; then cProfile of 3000 backward ops.  With
``LLM_SYSTEMS_NATIVE_LAUNCH=1`` every launch goes through the C++ launcher, with the
graphs off a plan's whole call is one C++ pass (a row of its own), and the ops' CUDA kernels
are C++ (``custom_ops.enable_native_ops``): a repeated signature runs its pass with no Python
but the stream check (the op rows; the C++ kernels' counts are printed after each section).
"""

from __future__ import annotations

import cProfile
import io
import itertools
import math
import pstats
import statistics

import torch

from impl.attention import call_graphs, custom_ops, native_launch
from impl.attention import flash_gluon as fg
from impl.attention.host_plans import as_4d
from perf.lib.measure import host_and_wall_us_per_call

B, H, N, D = 4, 12, 256, 64
POOL = 48
SCALE = 1 / math.sqrt(D)


def input_sets():
    sets = []
    for _ in range(POOL):
        x = torch.randn(B, N, 3 * H * D, device="cuda", dtype=torch.bfloat16)
        q, k, v = (t.view(B, N, H, D).transpose(1, 2) for t in x.split(H * D, dim=-1))
        o, lse = fg.flash_forward(q, k, v, True, SCALE)
        sets.append((q, k, v, o, lse, torch.randn_like(o)))
    torch.cuda.synchronize()
    return sets


def per_call_us(fn, sets, calls=600, rounds=7):
    """The median over rounds of the host's microseconds a call (``host_and_wall_us_per_call``),
    the inputs cycling through the sets."""
    cycle = itertools.cycle(sets)
    return statistics.median(host_and_wall_us_per_call(lambda: fn(next(cycle)), calls)[0] for _ in range(rounds))


def rows(sets):
    out = {"op bwd (compiled path)": lambda s: custom_ops.flash_backward(*s, True, SCALE, "gluon"),
           "op fwd (compiled path)": lambda s: custom_ops.flash_forward(s[0], s[1], s[2], True, SCALE, "gluon"),
           "fn bwd (no dispatcher)": lambda s: fg.flash_backward(*s, True, SCALE),
           "key bwd (6 signatures)": lambda s: fg._key("bwd", s, True, SCALE, (False, 0))}
    fg.flash_backward(*sets[0], True, SCALE)
    plan = fg._PLANS.plans[fg._key("bwd", sets[0], True, SCALE, (False, 0))]
    out["plan bwd call"] = lambda s: plan(*s)
    if plan.native is not None:  # call graphs off, LLM_SYSTEMS_NATIVE_LAUNCH=1: the whole call in C++
        stream = torch.cuda.current_stream().cuda_stream
        out["C++ pass alone"] = lambda s: native_launch.run_pass(plan.native, stream, s)
    delta = torch.empty(B, H, N, device="cuda")
    acc = torch.empty(B, H, N, D, device="cuda")
    dq, dk, dv = (torch.empty_strided(t.shape, st, dtype=t.dtype, device="cuda") for t, st in zip(sets[0][:3], plan.strides))

    def launches(s):
        q4, k4, v4, o4, do4 = (as_4d(t) for t in (s[0], s[1], s[2], s[3], s[5]))
        plan.pre(o4, do4, delta, acc)
        plan.dkdv(k4, v4, q4, do4, acc, as_4d(dk), as_4d(dv), s[4], delta)
        plan.convert(acc, as_4d(dq))

    out["3 launches only"] = launches
    out["empty_strided x3 + empty x2"] = lambda s: (
        [torch.empty_strided(t.shape, st, dtype=t.dtype, device="cuda") for t, st in zip(s[:3], plan.strides)]
        + [torch.empty(B, H, N, device="cuda"), torch.empty(B, H, N, D, device="cuda")])
    aten = torch.ops.aten
    flash = [aten._scaled_dot_product_flash_attention(s[0], s[1], s[2], 0.0, True, False, scale=SCALE) for s in sets]
    cudnn = [aten._scaled_dot_product_cudnn_attention(s[0], s[1], s[2], None, True, 0.0, True, False, scale=SCALE)
             for s in sets]
    by_set = {id(s[0]): i for i, s in enumerate(sets)}

    def flash_bwd(s):
        r = flash[by_set[id(s[0])]]
        aten._scaled_dot_product_flash_attention_backward(s[5], s[0], s[1], s[2], r[0], r[1], r[2], r[3], r[4], r[5],
                                                          0.0, True, r[6], r[7], scale=SCALE)

    def cudnn_bwd(s):
        r = cudnn[by_set[id(s[0])]]
        aten._scaled_dot_product_cudnn_attention_backward(s[5], s[0], s[1], s[2], r[0], r[1], r[6], r[7], None, r[2],
                                                          r[3], r[4], r[5], 0.0, True, scale=SCALE)

    out["aten flash bwd op"] = flash_bwd
    out["aten flash fwd op"] = lambda s: aten._scaled_dot_product_flash_attention(s[0], s[1], s[2], 0.0, True, False,
                                                                                  scale=SCALE)
    out["aten cudnn bwd op"] = cudnn_bwd
    out["aten cudnn fwd op"] = lambda s: aten._scaled_dot_product_cudnn_attention(s[0], s[1], s[2], None, True, 0.0,
                                                                                  True, False, scale=SCALE)
    return out


def main():
    sets = input_sets()
    for enabled in (True, False):
        call_graphs.ENABLED = enabled
        call_graphs.clear()
        fg._PLANS.clear()  # plans built afresh: with graphs off (and the C++ launcher on) they take a C++ pass
        # the ops' C++ kernels where a plan can have a pass (graphs off), as custom_ops enables them at import
        if enabled:
            custom_ops.disable_native_ops()
        else:
            custom_ops.enable_native_ops()
        table = rows(sets)
        print(f"--- call graphs ENABLED={enabled}, C++ launcher {'on' if native_launch.enabled() else 'off'}")
        for name, fn in table.items():
            fn(sets[0])
            fn(sets[1])
            print(f"{name:32s} {per_call_us(fn, sets):8.1f} us", flush=True)
        if native_launch.built() is not None:
            print("C++ op kernels (from C++, through Python, keys bound):", native_launch.built().op_counts())
    call_graphs.ENABLED = True
    call_graphs.clear()
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(3000):
        custom_ops.flash_backward(*sets[i % POOL], True, SCALE, "gluon")
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue())
    print("stats", call_graphs.stats())


if __name__ == "__main__":
    main()
