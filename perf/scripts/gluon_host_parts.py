"""Host microseconds to issue one Gluon pass against SDPA's, and its parts (B1 H1 d64 causal
bf16, N 128 and 1024; a Hopper GPU).

    PYTHONPATH=. python perf/scripts/gluon_host_parts.py

Each variant issues 300 calls with no synchronisation inside the loop; 7 rounds interleave
the variants (the host's speed drifts) and the median is printed with the rounds' range.
"no launch" variants replace every Launch.__call__ with a no-op; "launch alone" times one
launch of a plan with its tensors; "do_bench" is what the sweep measures (cache cleared per
repetition, so the GPU runs behind the host by the clearing memset)."""
import json, statistics, sys, time
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import impl.attention.flash_gluon as fg
from impl.attention import triton_launch
fg.ONE_LAUNCH_CONFIGS = {}  # the three launches of the Gluon backward (written before the one-launch backward)

def host_us(fn, calls=300):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    h = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return h

class NoLaunch:
    def __enter__(self):
        self.saved = triton_launch.Launch.__call__; triton_launch.Launch.__call__ = lambda self, *t: None
    def __exit__(self, *e):
        triton_launch.Launch.__call__ = self.saved

out = {}
for n in (128, 1024):
    q, k, v, do = (torch.randn(1, 1, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    og = fg.FlashAttentionGluon.apply(qg, kg, vg, True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        os_ = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    o, lse = fg.flash_forward(q, k, v, True)
    plan_f = fg._plan(fg._key("fwd", (q, k, v), True, None, 0), None)
    bkey = fg._key("bwd", (q, k, v, o, lse, do), True, None, (torch.are_deterministic_algorithms_enabled(), 0))
    plan_b = fg._plan(bkey, lambda: fg._BackwardPlan(q, k, v, o, lse, do, True, None))
    # outputs of the launches timed alone, allocated once (so the inputs are never written)
    dq_acc = torch.zeros(plan_b.dq_acc_shape, device="cuda")
    dk_out, dv_out, delta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)

    def sdpa_fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    variants = {
        "fwd sdpa flash (ctx)": (None, sdpa_fwd),
        "fwd sdpa default": (None, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "fwd sdpa flash, grad": (None, lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)),
        "fwd gluon apply (grad)": (None, lambda: fg.FlashAttentionGluon.apply(qg, kg, vg, True)),
        "fwd gluon apply, no launch": (NoLaunch, lambda: fg.FlashAttentionGluon.apply(qg, kg, vg, True)),
        "fwd gluon flash_forward": (None, lambda: fg.flash_forward(q, k, v, True)),
        "fwd plan call": (None, lambda: plan_f(q, k, v)),
        "fwd plan call, no launch": (NoLaunch, lambda: plan_f(q, k, v)),
        "fwd launch alone": (None, lambda: plan_f.launch(q, k, v, o, lse)),
        "fwd key": (None, lambda: fg._key("fwd", (q, k, v), True, None, 0)),
        "2 allocs": (None, lambda: (torch.empty_strided(q.shape, plan_f.o_strides, dtype=q.dtype, device=q.device),
                                    torch.empty(plan_f.lse_shape, dtype=torch.float32, device=q.device))),
        "bwd sdpa": (None, lambda: os_.backward(do, retain_graph=True)),
        "bwd gluon": (None, lambda: og.backward(do, retain_graph=True)),
        "bwd gluon, no launch": (NoLaunch, lambda: og.backward(do, retain_graph=True)),
        "bwd plan call": (None, lambda: plan_b(q, k, v, o, lse, do)),
        "bwd dkdv launch alone": (None, lambda: plan_b.dkdv(k, v, q, do, dq_acc, dk_out, dv_out, lse, delta)),
        "bwd pre launch alone": (None, lambda: plan_b.pre(o, do, delta, dq_acc)),
    }
    rounds = {name: [] for name in variants}
    for r in range(7):
        for name, (ctx, fn) in variants.items():
            if ctx is None:
                rounds[name].append(host_us(fn))
            else:
                with ctx():
                    rounds[name].append(host_us(fn))
    for name in variants:
        out[f"N{n} {name}"] = round(statistics.median(rounds[name]), 1)
        print(f"N{n} {name}: {out[f'N{n} {name}']} us (rounds {min(rounds[name]):.1f}-{max(rounds[name]):.1f})", flush=True)
    # what the sweep sees: do_bench (cache cleared per rep)
    import triton
    for name in ("fwd sdpa flash (ctx)", "fwd gluon apply (grad)", "bwd sdpa", "bwd gluon"):
        out[f"N{n} do_bench {name}"] = triton.testing.do_bench(variants[name][1]) * 1e3
        print(f"N{n} do_bench {name}: {out[f'N{n} do_bench {name}']:.1f} us", flush=True)
print(json.dumps(out))
