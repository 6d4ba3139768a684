"""What an autograd node costs the host: a Python ``autograd.Function`` against a C++ one.

    PYTHONPATH=. python perf/scripts/attention_node_floor.py [--out DIR] [--n 128] [--calls 400] [--rounds 9]

The short-sequence points of the attention sweep are decided by the host (see
perf/notes/ATTENTION_NOTES.md, "The backward's host time taken apart"): a Python node that
does no work at all already costs three quarters of SDPA's whole backward.  Before writing
a C++ host path, this measures the floor it would stand on.  Each variant does no GPU work
of its own (the gradients are ready, the output is an allocation), so the differences are
the nodes themselves:

    sdpa_flash      o.backward(dO) through SDPA's flash backward (the peer, with its kernels)
    python_node     a Python autograd.Function: forward saves q, k, v and returns an empty
                    tensor; backward returns ready gradients
    cpp_node        the same Function written in C++ (torch::autograd::Function), built here
                    with torch.utils.cpp_extension.load_inline
    cpp_node_allocs the C++ backward allocating dQ, dK, dV and D as the real one would

and the forwards (fwd_*) the same way.  Host microseconds a call, ``calls`` calls with no
synchronisation inside, rounds interleaving the variants, medians.
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

from perf.lib.measure import host_and_wall_us_per_call

_CPP = r"""
#include <torch/extension.h>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

static std::vector<at::Tensor> ready;

template <bool Allocate>
struct NoWork : public torch::autograd::Function<NoWork<Allocate>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    ctx->save_for_backward({q, k, v});
    return at::empty_like(q);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    if (!Allocate) return {ready[0], ready[1], ready[2]};
    auto delta = at::empty(  // D: allocated as the real backward does, then dropped
        saved[0].sizes().slice(0, saved[0].dim() - 1), saved[0].options().dtype(at::kFloat));
    (void)delta;
    return {at::empty_like(saved[0]), at::empty_like(saved[1]), at::empty_like(saved[2])};
  }
};

void set_ready(at::Tensor a, at::Tensor b, at::Tensor c) { ready = {a, b, c}; }
at::Tensor apply(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return NoWork<false>::apply(q, k, v); }
at::Tensor apply_allocs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return NoWork<true>::apply(q, k, v);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_ready", &set_ready);
  m.def("apply", &apply);
  m.def("apply_allocs", &apply_allocs);
}
"""


def build():
    from torch.utils.cpp_extension import load_inline

    t0 = time.perf_counter()
    mod = load_inline("attention_node_floor", cpp_sources=_CPP, extra_cflags=["-O2"])
    return mod, time.perf_counter() - t0


class _PyNoWork(torch.autograd.Function):
    ready = None

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad_o):
        ctx.saved_tensors
        return _PyNoWork.ready


def variants(mod, n: int, device: str):
    shape = (1, 1, n, 64)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device=device, dtype=dtype)
    ready = tuple(torch.empty_like(t) for t in (q, k, v))
    _PyNoWork.ready = ready
    mod.set_ready(*ready)
    out = {}
    if device == "cuda":
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out["sdpa_flash"] = lambda: o_sdpa.backward(do, retain_graph=True)
    o_py, o_cpp, o_cpp_alloc = _PyNoWork.apply(q, k, v), mod.apply(q, k, v), mod.apply_allocs(q, k, v)
    out["python_node"] = lambda: o_py.backward(do, retain_graph=True)
    out["cpp_node"] = lambda: o_cpp.backward(do, retain_graph=True)
    out["cpp_node_allocs"] = lambda: o_cpp_alloc.backward(do, retain_graph=True)
    if device == "cuda":
        def sdpa_fwd():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out["fwd_sdpa_flash"] = sdpa_fwd
    out["fwd_python_node"] = lambda: _PyNoWork.apply(q, k, v)
    out["fwd_cpp_node"] = lambda: mod.apply(q, k, v)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--n", type=int, nargs="+", default=[128])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mod, build_s = build()
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "build_s": round(build_s, 1)}
    print(f"built in {build_s:.1f} s", flush=True)
    for n in args.n:
        vs = variants(mod, n, device)
        rows = {name: [] for name in vs}
        for _ in range(args.rounds):
            for name, fn in vs.items():
                rows[name].append(host_and_wall_us_per_call(fn, args.calls)[0])
        med = {name: round(statistics.median(v), 1) for name, v in rows.items()}
        result[f"N{n}"] = {"median_us": med, "rounds_us": {k: [round(x, 1) for x in v] for k, v in rows.items()}}
        print(f"N={n}", json.dumps(med), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "node_floor.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
