"""The host time of one Gluon attention backward and forward, taken apart, and what a CUDA
graph of a call's launches would leave of it.

    PYTHONPATH=. python perf/scripts/gluon_host_graphs.py [--out DIR] [--n 128 1024] [--calls 400] [--rounds 7]

As perf/scripts/gluon_host_parts.py does (same method: ``calls``
passes with no synchronisation inside the loop, rounds interleaving the variants, medians):

    sdpa_flash          o.backward(dO) through torch's C++ node (the peer)
    ours                o.backward(dO) through FlashAttentionGluon
    ours_no_launch      every launch a no-op: our Python and allocations
    ours_no_work        the Function's backward returns ready gradients: engine and node alone
    ours_graphed        a call's launches replayed from a CUDA graph captured for its addresses
                        (a probe: the plan's launches recorded once per set of input and output
                        addresses, replayed when the set recurs, as in a training loop)
    ours_graphed_owned  the same, D and dQ's float32 sums kept with the graph (allocated once
                        at capture), so the key is the inputs' and outputs' addresses

and the same for the forward (fwd_*).  ``parts`` times each piece of the plans alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention import flash_gluon as fg
from impl.attention import triton_launch
from impl.attention.host_plans import as_4d
from perf.lib.measure import host_and_wall_us_per_call
from perf.lib.workloads import cuda_attention_inputs


class _Patch:
    """obj.name replaced by value while active."""

    def __init__(self, obj, name, value):
        self.obj, self.name, self.value = obj, name, value

    def __enter__(self):
        self.saved = self.obj.__dict__[self.name]
        setattr(self.obj, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.obj, self.name, self.saved)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


_GRAPHS: dict = {}
_SEEN: set = set()
_SIDE = None


def _replay_or_capture(key, launch_all):
    """Replay the graph of this address set; capture it on its second sighting."""
    global _SIDE
    g = _GRAPHS.get(key)
    if g is not None:
        g.replay()
        return
    if key not in _SEEN or torch.cuda.is_current_stream_capturing():
        _SEEN.add(key)
        launch_all()
        return
    if _SIDE is None:
        _SIDE = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    _SIDE.wait_stream(cur)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(_SIDE):
        g.capture_begin(capture_error_mode="thread_local")
        launch_all()
        g.capture_end()
    cur.wait_stream(_SIDE)
    _GRAPHS[key] = g
    g.replay()


_OWNED: dict = {}


def _graphed_backward(self, q, k, v, o, lse, grad_o, owned=False):
    if not self.fused or any(self.copy):
        raise RuntimeError("probe: fused backward over aligned inputs only")
    q4, k4, v4, do4 = as_4d(q), as_4d(k), as_4d(v), as_4d(grad_o)
    dq, dk, dv = (torch.empty_strided(t.shape, s, dtype=t.dtype, device=t.device)
                  for t, s in zip((q, k, v), self.strides))
    o4 = as_4d(o)
    if owned:
        key = ("owned", id(self), *(t.data_ptr() for t in (q, k, v, o, lse, grad_o, dq, dk, dv)))
        bufs = _OWNED.get(key)
        if bufs is None:
            bufs = _OWNED[key] = (torch.empty_like(lse),
                                  torch.empty(self.dq_acc_shape, dtype=torch.float32, device=q.device))
        delta, dq_acc = bufs
    else:
        delta = torch.empty_like(lse)
        dq_acc = torch.empty(self.dq_acc_shape, dtype=torch.float32, device=q.device)

    def launch_all():
        self.pre(o4, do4, delta, dq_acc)
        self.dkdv(k4, v4, q4, do4, dq_acc, as_4d(dk), as_4d(dv), lse, delta)
        self.convert(dq_acc, as_4d(dq))

    if not owned:
        key = (id(self), *(t.data_ptr() for t in (q, k, v, o, lse, grad_o, dq, dk, dv, delta, dq_acc)))
    _replay_or_capture(key, launch_all)
    return dq, dk, dv


def _graphed_forward(self, q, k, v):
    if self.combine is not None or any(self.copy):
        raise RuntimeError("probe: unsplit forward over aligned inputs only")
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    o = torch.empty_strided(q.shape, self.o_strides, dtype=q.dtype, device=q.device)
    lse = torch.empty(self.lse_shape, dtype=torch.float32, device=q.device)
    key = (id(self), *(t.data_ptr() for t in (q, k, v, o, lse)))
    _replay_or_capture(key, lambda: self.launch(q4, k4, v4, o, lse))
    return o, lse


def _timed(ctx, fn):
    def measure(calls):
        with ctx:
            return host_and_wall_us_per_call(fn, calls)[0]
    return measure


def variants(n, d=64, causal=True):
    q, k, v, do = cuda_attention_inputs(1, 1, n, d)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o_ours = fg.FlashAttentionGluon.apply(q, k, v, causal)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    no_launch = _Patch(triton_launch.Launch, "__call__", lambda self, *tensors: None)
    no_work = _Patch(fg.FlashAttentionGluon, "backward", staticmethod(lambda ctx, grad_o: (*grads, None, None)))
    graphed_bwd = _Patch(fg._BackwardPlan, "__call__", _graphed_backward)
    graphed_owned = _Patch(fg._BackwardPlan, "__call__",
                           lambda self, *a: _graphed_backward(self, *a, owned=True))
    graphed_fwd = _Patch(fg._ForwardPlan, "__call__", _graphed_forward)
    bwd_sdpa = lambda: o_sdpa.backward(do, retain_graph=True)  # noqa: E731
    bwd_ours = lambda: o_ours.backward(do, retain_graph=True)  # noqa: E731

    def fwd_sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    fwd_ours = lambda: fg.FlashAttentionGluon.apply(q, k, v, causal)  # noqa: E731
    out = {
        "sdpa_flash": _timed(_Null(), bwd_sdpa),
        "ours": _timed(_Null(), bwd_ours),
        "ours_no_launch": _timed(no_launch, bwd_ours),
        "ours_no_work": _timed(no_work, bwd_ours),
        "fwd_sdpa_flash": _timed(_Null(), fwd_sdpa),
        "fwd_ours": _timed(_Null(), fwd_ours),
        "fwd_ours_no_launch": _timed(no_launch, fwd_ours),
    }
    bwd_ours()  # builds the backward's plan
    plan = fg._PLANS.plans[fg._key("bwd", (q, k, v, o_ours, o_ours.grad_fn.saved_tensors[4], do), causal, None,
                                   (torch.are_deterministic_algorithms_enabled(), 0))]
    if plan.fused and not any(plan.copy):
        out["ours_graphed"] = _timed(graphed_bwd, bwd_ours)
        out["ours_graphed_owned"] = _timed(graphed_owned, bwd_ours)
    fplan = fg._PLANS.plans[fg._key("fwd", (q, k, v), causal, None, 0)]
    if fplan.combine is None and not any(fplan.copy):
        out["fwd_ours_graphed"] = _timed(graphed_fwd, fwd_ours)
    return out, (q, k, v, do, o_ours, plan, graphed_bwd, graphed_owned)


def check_graphed(q, k, v, do, graphed, causal=True):
    """The probe's replayed backward gives the direct path's gradients (bitwise for dK, dV)."""
    def grads():
        for t in (q, k, v):
            t.grad = None
        fg.FlashAttentionGluon.apply(q, k, v, causal).backward(do)
        return tuple(t.grad.clone() for t in (q, k, v))

    ref = grads()
    with graphed:
        got = [grads() for _ in range(3)][-1]
    return {name: float((a.float() - b.float()).abs().max()) for name, a, b in zip("qkv", ref, got)}


def parts(q, k, v, do, o, plan, calls=2000):
    qd, kd, vd, od = (t.detach() for t in (q, k, v, o))
    lse = o.grad_fn.saved_tensors[4]
    out = {}

    def t(name, fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out[name] = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()

    det = torch.are_deterministic_algorithms_enabled()
    t("key (6 tensors)", lambda: fg._key("bwd", (qd, kd, vd, od, lse, do), True, None, (det, 0)))
    key = fg._key("bwd", (qd, kd, vd, od, lse, do), True, None, (det, 0))
    t("plan get, key prebuilt", lambda: fg._PLANS.get(key, None))
    t("5 allocations", lambda: (torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd),
                                torch.empty_like(lse), torch.empty(plan.dq_acc_shape, dtype=torch.float32,
                                                                   device="cuda")))
    t("plan call", lambda: plan(qd, kd, vd, od, lse, do))
    delta, dq_acc = torch.empty_like(lse), torch.empty(plan.dq_acc_shape, dtype=torch.float32, device="cuda")
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
    q4, k4, v4, do4, o4 = (as_4d(x) for x in (qd, kd, vd, do, od))
    t("launch pre", lambda: plan.pre(o4, do4, delta, dq_acc))
    t("launch dkdv (5 descriptors)", lambda: plan.dkdv(k4, v4, q4, do4, dq_acc, as_4d(dk), as_4d(dv), lse, delta))
    t("launch convert", lambda: plan.convert(dq_acc, as_4d(dq)))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin(capture_error_mode="thread_local")
        plan.pre(o4, do4, delta, dq_acc)
        plan.dkdv(k4, v4, q4, do4, dq_acc, as_4d(dk), as_4d(dv), lse, delta)
        plan.convert(dq_acc, as_4d(dq))
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    t("graph replay (3 kernels)", g.replay)
    t("saved_tensors unpack", lambda: o.grad_fn.saved_tensors)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--n", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for n in args.n:
        measures, held = variants(n)
        q, k, v, do, o, plan, graphed_bwd, graphed_owned = held
        rows = {name: [] for name in measures}
        for _ in range(args.rounds):
            for name, measure in measures.items():
                rows[name].append(measure(args.calls))
        med = {name: round(statistics.median(x), 1) for name, x in rows.items()}
        result[f"N{n}"] = {"median_us": med, "rounds_us": {k_: [round(x, 1) for x in v_] for k_, v_ in rows.items()},
                           "parts_us": {k_: round(x, 2) for k_, x in parts(q, k, v, do, o, plan).items()},
                           "graphed_vs_direct_max_abs": check_graphed(q, k, v, do, graphed_bwd),
                           "graphed_owned_vs_direct_max_abs": check_graphed(q, k, v, do, graphed_owned)}
        print(f"N={n}", json.dumps(med), flush=True)
        print("  parts", json.dumps(result[f"N{n}"]["parts_us"]), flush=True)
        print("  graphed vs direct", json.dumps(result[f"N{n}"]["graphed_vs_direct_max_abs"]),
              json.dumps(result[f"N{n}"]["graphed_owned_vs_direct_max_abs"]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gluon_host_graphs.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
