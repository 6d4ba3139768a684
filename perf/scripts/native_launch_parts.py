"""Where the C++ pass's host time goes: per launch of the d64 causal backward plan (B4 H12 N256, bf16),
host us of ext.launch with its grid zeroed (fill + tensor-map encodes, no driver launch) and
with its real grid; the number of maps each encodes."""
import os
os.environ["LLM_SYSTEMS_NATIVE_LAUNCH"] = "1"
os.environ["LLM_SYSTEMS_CALL_GRAPHS"] = "0"
import math, statistics, time
import torch
from impl.attention import flash_gluon as fg, native_launch

ext = native_launch.extension()
B, H, N, D = 4, 12, 256, 64
S = 1 / math.sqrt(D)
x = torch.randn(B, N, 3 * H * D, device="cuda", dtype=torch.bfloat16)
q, k, v = (t.view(B, N, H, D).transpose(1, 2) for t in x.split(H * D, dim=-1))
o, lse = fg.flash_forward(q, k, v, True, S)
do = torch.randn_like(o)
for _ in range(3):
    fg.flash_backward(q, k, v, o, lse, do, True, S)
plan = fg._PLANS.plans[fg._key("bwd", (q, k, v, o, lse, do), True, S, (False, 0))]
print("native pass", plan.native, "plain", plan.plain)
stream = torch.cuda.current_stream().cuda_stream
outs = native_launch.run_pass(plan.native, stream, (q, k, v, o, lse, do))
named = [q, k, v, o, lse, do, *outs] + [torch.empty(s, dtype=dt, device="cuda") for s, dt in plan.scratch]
torch.cuda.synchronize()

def us(fn, n=2000, rounds=7):
    r = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        r.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(r)

for step, where in plan.steps:
    tensors = [named[i] for i in where]
    spec = native_launch.template(step)
    zero = ext.register_launch(spec[0], [0, 1, 1], *spec[2:])
    maps = sum(1 for s in spec[-1] if s[0] == native_launch.DESC)
    print(f"{step.kernel.fn.__name__ if hasattr(step.kernel,'fn') else step.kernel!s:40.40s} maps {maps} "
          f"fill+encode {us(lambda: ext.launch(zero, stream, tensors)):6.2f} us  "
          f"full launch {us(lambda: ext.launch(step.native, stream, tensors), n=300):6.2f} us  "
          f"describe {us(lambda: ext.describe(step.native, tensors)):6.2f} us")
print(f"run_pass {us(lambda: native_launch.run_pass(plan.native, stream, (q, k, v, o, lse, do)), n=300):6.2f} us")
print(f"empty x5 {us(lambda: [torch.empty(8, device='cuda') for _ in range(5)], n=300):6.2f} us")
