"""Host cost of recording a Gluon backward's CUDA graph (capture and instantiation) against a direct call of
its three launches and a replay (B1 H1 N128 d64 causal bf16; a Hopper GPU).

    PYTHONPATH=. python perf/scripts/gluon_record_cost.py
"""
import time, torch, json
from impl.attention import call_graphs, flash_gluon as fg
fg.ONE_LAUNCH_CONFIGS = {}  # the three launches of the Gluon backward (written before the one-launch backward)
q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v): t.requires_grad_(True)
o = fg.FlashAttentionGluon.apply(q, k, v, True); o.backward(do, retain_graph=True)
lse = o.grad_fn.saved_tensors[4]
plan = [p for p in fg._PLANS.plans.values() if isinstance(p, fg._BackwardPlan)][0]
qd, kd, vd, od = (t.detach() for t in (q, k, v, o))
dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
def launch(delta, dq_acc):
    plan.pre(od, do, delta, dq_acc); plan.dkdv(kd, vd, qd, do, dq_acc, dk, dv, lse, delta); plan.convert(dq_acc, dq)
out = {}
for name, fn in (("record", lambda: plan.graphs._record(launch)), ("direct", lambda: launch(*plan.graphs._buffers()))):
    fn(); torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(50): fn()
    torch.cuda.synchronize(); out[name + "_us"] = (time.perf_counter() - t0) / 50 * 1e6
e = plan.graphs._record(launch); torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(200): e.graph.replay()
torch.cuda.synchronize(); out["replay_us"] = (time.perf_counter() - t0) / 200 * 1e6
print("record_cost", json.dumps({k: round(v, 1) for k, v in out.items()}))
