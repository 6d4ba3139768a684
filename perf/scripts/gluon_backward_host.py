"""Where a short backward's host time goes: the Gluon flavour's autograd node against SDPA
flash's, at the sweep's short points (batch 1, one head, bf16).

    PYTHONPATH=. python perf/scripts/gluon_backward_host.py [--n 128 512] [--dims 64 128] [--rounds 14] [--no-profile]

Each row is host microseconds per ``o.backward(dO, retain_graph=True)`` (the sweep's
backward column), issued 300 times with nothing waiting, rounds interleaving the rows in an
order shuffled each round (a rotation kept each row behind the same one, and the row after
SDPA's read 2-5 % slower whatever its code), medians (and the median over rounds of the row over SDPA's):
    sdpa                 SDPA flash's C++ node
    ours                 the flavour's Function (C++ pass bound to the call's key)
    floor: 3 empties     a Python Function whose backward returns three new empty gradients
    floor + saved        the same, after unpacking five saved tensors as ours does
    floor + saved + key  the same, after the stream check and the key's scalar check (no look-up)
    ours, one frame      ours with every check in its backward's frame (the stream's too)
    ours, pass only      a Function whose backward only calls our bound pass: the least Python
                         a node can hold (not the contract: L alone saved, O kept on ctx, no checks)
Then the same work on the main thread, no engine: our C++ pass (``run_bound``) and aten's
flash backward op.  Then ours and the last floor split by timers at the backward's entry and
exit (the engine before the node, the node, the engine after it), with a count of the calls
whose dQ became q.grad without a copy.  Then torch.profiler's CPU events (grads cleared
before each call, as in the timed rows).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention import flash_gluon as fg
from impl.attention import native_launch
from impl.attention.triton_launch import fast_stream
from perf.lib.measure import host_us_per_call
from perf.lib.workloads import cuda_attention_inputs

CALLS = 300


def floor_function(unpack: bool, key: bool):
    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, o, lse):
            ctx.save_for_backward(q, k, v, o, lse)
            return o.clone()

        @staticmethod
        def backward(ctx, grad_o):
            if unpack:
                q, k, v, o, lse = ctx.saved_tensors
            else:
                q = k = v = grad_o
            if key:
                stream = fast_stream(q.get_device())
                fg._keyed_scalars(True, None)
                assert stream is not None
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None

    return Floor


def one_frame_function():
    """Ours with the backward's Python in one frame: the same checks, no helper calls."""
    from impl.attention import call_graphs
    from impl.attention.triton_launch import _knobs

    class OneFrame(fg.FlashAttentionGluon):
        @staticmethod
        def backward(ctx, grad_o):
            q, k, v, o, lse = ctx.saved_tensors
            run_bound = native_launch.run_bound
            if grad_o.dtype == q.dtype and run_bound is not None and not call_graphs.ENABLED:
                runtime = _knobs.runtime
                enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
                if not getattr(enter, "calls", enter is not None) and not getattr(leave, "calls", leave is not None):
                    device = q.get_device()
                    if torch._C._cuda_getDevice() == device:
                        out = run_bound(1, torch._C._cuda_getCurrentRawStream(device), (q, k, v, o, lse, grad_o),
                                        ctx.is_causal, 0.0 if ctx.scale is None else ctx.scale)
                        if out is not None:
                            dq, dk, dv = out
                            return dq, dk, dv, None, None
            raise RuntimeError("probe: the one-frame backward found no bound pass")

    return OneFrame


def pass_only_function(causal: bool):
    """The least Python a backward can hold: the pass's call, its tensors kept on the context."""
    stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())

    class PassOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = fg.flash_forward(q, k, v, causal)
            ctx.save_for_backward(lse)
            ctx.args = (q, k, v, o.detach(), lse)
            return o

        @staticmethod
        def backward(ctx, grad_o):
            q, k, v, o, lse = ctx.args
            dq, dk, dv = native_launch.run_bound(1, stream, (q, k, v, o, lse, grad_o), causal, 0.0)
            return dq, dk, dv

    return PassOnly


def variants(q, k, v, do, causal):
    o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o_ours = fg.FlashAttentionGluon.apply(q, k, v, causal)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    o_plain, lse = fg.flash_forward(qd, kd, vd, causal)
    functions = {name: floor_function(*flags) for name, flags in (
        ("floor: 3 empties", (False, False)), ("floor + saved", (True, False)), ("floor + saved + key", (True, True)))}
    floors = {name: f.apply(q, k, v, o_plain, lse) for name, f in functions.items()}
    o_one = one_frame_function().apply(q, k, v, causal)
    o_pass = pass_only_function(causal).apply(q, k, v)
    table = {"sdpa": lambda: o_sdpa.backward(do, retain_graph=True),
             "ours": lambda: o_ours.backward(do, retain_graph=True),
             "ours, one frame": lambda: o_one.backward(do, retain_graph=True),
             "ours, pass only": lambda: o_pass.backward(do, retain_graph=True)}
    for name, o in floors.items():
        table[name] = (lambda o=o: o.backward(do, retain_graph=True))
    tensors = (qd, kd, vd, o_plain, lse, do)
    table["main thread: our pass"] = lambda: native_launch.run_bound(1, fast_stream(0), tensors, causal, 0.0)
    aten = torch.ops.aten._scaled_dot_product_flash_attention(qd, kd, vd, 0.0, causal, False)
    out, a_lse, cq, ck, mq, mk, seed, offset, _ = aten
    table["main thread: aten op"] = lambda: torch.ops.aten._scaled_dot_product_flash_attention_backward(
        do, qd, kd, vd, out, a_lse, cq, ck, mq, mk, 0.0, causal, seed, offset)
    nodes = {"ours": (fg.FlashAttentionGluon, o_ours),
             "floor + saved + key": (functions["floor + saved + key"], floors["floor + saved + key"])}
    return table, nodes


def split_node(function, o, do, grads, calls: int):
    """Medians (us) of: engine before the node's backward is entered, the backward, engine after
    it returned; and how many calls' gradients reached q.grad without a copy (stolen)."""
    marks = []
    inner = function.backward

    def timed(ctx, grad_o):
        entered = time.perf_counter()
        out = inner(ctx, grad_o)
        marks.append((entered, time.perf_counter(), out[0].data_ptr()))
        return out

    function.backward = staticmethod(timed)
    parts, stolen = [], 0
    try:
        for _ in range(calls):
            for t in grads:
                t.grad = None
            called = time.perf_counter()
            o.backward(do, retain_graph=True)
            returned = time.perf_counter()
            entered, left, dq_ptr = marks.pop()
            stolen += grads[0].grad.data_ptr() == dq_ptr
            parts.append(((entered - called) * 1e6, (left - entered) * 1e6, (returned - left) * 1e6))
    finally:
        function.backward = staticmethod(inner)
    torch.cuda.synchronize()
    return [statistics.median(p[i] for p in parts) for i in range(3)] + [stolen]


def profile_cpu(fn, grads, calls: int = 200) -> str:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            for t in grads:
                t.grad = None
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:14]:
        rows.append(f"    {e.key[:70]:70s} calls {e.count // calls:3d}  total {e.cpu_time_total / calls:7.1f} us"
                    f"  self {e.self_cpu_time_total / calls:7.1f} us")
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[128, 512])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--rounds", type=int, default=14)
    p.add_argument("--no-profile", action="store_true")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for n in args.n:
            for d in args.dims:
                run_shape(n, d, True, args)


def run_shape(n, d, causal, args):
    q, k, v, do = cuda_attention_inputs(1, 1, n, d)
    grads = (q, k, v)
    table, nodes = variants(q, k, v, do, causal)
    for fn in table.values():  # first calls: plans built and bound
        fn()
        fn()
    torch.cuda.synchronize()
    host = {name: [] for name in table}
    names = list(table)
    shuffle = random.Random(n * 1000 + d)
    for _ in range(args.rounds):  # a new order each round: no row always follows the same one
        shuffle.shuffle(names)
        for name in names:
            host[name].append(host_us_per_call(table[name], "cuda", calls=CALLS, grad_to_none=grads))
    print(f"--- B1 H1 N{n} d{d} {'causal' if causal else 'full'}: host us per call (median of {args.rounds}"
          f" rounds of {CALLS}, order shuffled; spread min-max; median over rounds of the row / sdpa)")
    for name, values in host.items():
        ratio = statistics.median(x / y for x, y in zip(values, host["sdpa"]))
        print(f"  {name:24s} {statistics.median(values):7.1f}   ({min(values):.1f}-{max(values):.1f})  {ratio:.3f}")
    for name, (function, o) in nodes.items():
        splits = [split_node(function, o, do, grads, CALLS) for _ in range(args.rounds)]
        before, inside, after = (statistics.median(s[i] for s in splits) for i in range(3))
        stolen = sum(s[3] for s in splits)
        print(f"  {name} split: engine before the node {before:.1f}, its backward {inside:.1f}, engine after "
              f"{after:.1f}; dQ reached q.grad uncopied in {stolen} of {CALLS * args.rounds} calls")
    if args.no_profile or n != args.n[0]:
        return
    for name in ("sdpa", "ours", "floor + saved + key"):
        print(f"  profiler CPU events per call, {name} (grads cleared before each):")
        print(profile_cpu(table[name], grads), flush=True)


if __name__ == "__main__":
    main()
