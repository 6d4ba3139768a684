"""Do the Gluon attention calls of a GPT training step come back at the same addresses step
after step?  (impl/attention/call_graphs.py replays a call only where they do.)

    PYTHONPATH=. python perf/scripts/gluon_address_recurrence.py CONTEXT on|off [--steps 10]

Records every ``CallGraphs.run`` key (owner, tensor addresses) of a small GPT's AdamW steps
(batch 4, bf16; ``on``: the forward through torch.compile) and prints, per step, how many of
its calls were made at addresses of the previous step, of two steps back, or of any earlier
step, then a few keys relative to the first (in KiB) and ``call_graphs.stats()``.
"""

from __future__ import annotations

import argparse

import torch

from impl.attention import call_graphs
from impl.models import gpt
from perf.bench import model as bench


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("context", type=int)
    p.add_argument("compiled", choices=["on", "off"])
    p.add_argument("--steps", type=int, default=10)
    opts = p.parse_args(argv)
    log: list[list] = []
    run = call_graphs.CallGraphs.run

    def logged(self, key, launch):
        log[-1].append((self.owner, key))
        return run(self, key, launch)

    call_graphs.CallGraphs.run = logged
    device = torch.device("cuda")
    model = gpt.make_gpt("small", device=device, context_length=max(opts.context, gpt.SIZES["small"].context_length))
    bench.set_attention(model, "gluon")
    step = bench.make_step(model, "step", "bf16", 4, opts.context, bench.make_optimizer(model),
                           compiled=opts.compiled == "on")
    for _ in range(opts.steps):
        log.append([])
        step()
    torch.cuda.synchronize()
    print(f"ctx {opts.context} compiled {opts.compiled}: calls per step {[len(s) for s in log]}; "
          f"owners {len({o for s in log for o, _ in s})}")
    for t in range(1, len(log)):
        previous, earlier = set(log[t - 1]), {x for s in log[:t] for x in s}
        two_back = sum(x in set(log[t - 2]) for x in log[t]) if t >= 2 else "-"
        print(f"step {t}: in the previous step {sum(x in previous for x in log[t])}/{len(log[t])}, "
              f"in any earlier {sum(x in earlier for x in log[t])}, two steps back {two_back}")
    base = log[0][0][1][0]
    for pos in (0, len(log[0]) // 2, len(log[0]) - 1):
        for t in range(max(0, len(log) - 5), len(log)):
            owner, key = log[t][pos]
            print(f"call {pos} step {t} owner {owner}: " + " ".join(f"{(a - base) // 1024:+d}K" for a in key))
    print("stats", call_graphs.stats())


if __name__ == "__main__":
    main()
