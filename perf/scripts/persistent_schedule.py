"""How evenly the persistent Gluon forward's static rounds share causal work out, against the
hardware's greedy hand-out of one program an item (no GPU; a model, not a measurement).

    python perf/scripts/persistent_schedule.py

An item is a 128-row query tile of a batch-head in _tile_and_head_at's order (groups of heads,
longest tiles first in a group when causal); its cost is its key tiles plus one for its
prologue and epilogue.  Printed: the busiest program's work over the average, for the snake
rounds (_round_item), plain round-robin, and greedy (each item to the program that frees first).
"""

import heapq

PROGRAMS = 132  # an H100's or H200's SMs


def item_costs(n_m: int, n_bh: int, group: int, causal: bool = True) -> list[int]:
    costs = []
    for t in range(n_m * n_bh):
        per_group = group * n_m
        first = (t // per_group) * group
        heads = min(group, n_bh - first)
        m = (t % per_group) // heads
        if causal:
            m = n_m - 1 - m
        costs.append((m + 1 if causal else n_m) + 1)
    return costs


def static_rounds(costs: list[int], snake: bool) -> int:
    load = [0] * PROGRAMS
    for i, c in enumerate(costs):
        r, x = divmod(i, PROGRAMS)
        load[PROGRAMS - 1 - x if snake and r % 2 else x] += c
    return max(load)


def greedy(costs: list[int]) -> int:
    heap = [(0, p) for p in range(PROGRAMS)]
    for c in costs:
        t, p = heapq.heappop(heap)
        heapq.heappush(heap, (t + c, p))
    return max(t for t, _ in heap)


SHAPES = {  # name: (query tiles, batch-heads, heads a group as _group_heads picks on an H200)
    "B1 H16 N16384 d64 causal (leaderboard)": (128, 16, 3),
    "the same, every head one group": (128, 16, 16),
    "B2 H16 N8192 d128 causal": (64, 32, 3),
    "B8 H16 N1024 d64 causal": (8, 128, 128),
}

if __name__ == "__main__":
    for name, (n_m, n_bh, group) in SHAPES.items():
        costs = item_costs(n_m, n_bh, group)
        mean = sum(costs) / PROGRAMS
        print(f"{name}: busiest / average: snake {static_rounds(costs, True) / mean:.3f}, "
              f"round-robin {static_rounds(costs, False) / mean:.3f}, greedy {greedy(costs) / mean:.3f}")
