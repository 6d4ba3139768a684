"""The sweep goal, counted: at every point of an attention sweep (perf.bench.attention's
attention.json), ours against SDPA flash for forward, backward and forward + backward.

    python perf/scripts/attention_vs_flash.py SWEEP_DIR/attention.json [--impl triton] [--peer sdpa_flash]

Prints a markdown table (ours / peer ms, ``**`` where ours is at most the peer), the counts
per pass, overall and from N = 8192 on, and the largest ratio ours / peer per pass.  With the
peer against a copy of itself (``--impl sdpa_flash@2``, perf.bench.attention's NAME@TAG) the
counts and ratios are the sweep's noise floor.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

PASSES = ("forward", "backward", "forward_backward")


def _times(rows) -> dict:
    ms = defaultdict(dict)  # (causal, d, N, pass) -> impl -> ms
    for r in rows:
        if r.get("status") == "ok":
            ms[(r["causal"], r["d"], r["seq"], r["pass"])][r["impl"]] = r["ms"]
    return ms


def largest_ratios(rows, impl: str, peer: str) -> dict:
    """Per pass, the largest ours / peer over the points both have, and its point (mask, d, N)."""
    largest = {}
    for (causal, d, n, p), got in _times(rows).items():
        if impl in got and peer in got and (p not in largest or got[impl] / got[peer] > largest[p][0]):
            largest[p] = (got[impl] / got[peer], ("causal" if causal else "full", d, n))
    return largest


def compare(rows, impl: str, peer: str) -> tuple[list[str], dict]:
    ms = _times(rows)
    points = sorted({key[:3] for key in ms}, key=lambda p: (not p[0], p[1], p[2]))
    lines = ["| mask | d | N | " + " | ".join(f"{p} ({impl} / {peer})" for p in PASSES) + " |",
             "|---|---:|---:|" + "---:|" * len(PASSES)]
    counts = {p: [0, 0, 0, 0] for p in PASSES}  # won, compared, won at N >= 8192, compared there
    for causal, d, n in points:
        cells = []
        for p in PASSES:
            got = ms.get((causal, d, n, p), {})
            if impl not in got or peer not in got:
                cells.append("-")
                continue
            win = got[impl] <= got[peer]
            c = counts[p]
            c[0] += win
            c[1] += 1
            if n >= 8192:
                c[2] += win
                c[3] += 1
            cells.append(f"{got[impl]:.3f} / {got[peer]:.3f}" + (" **" if win else ""))
        lines.append(f"| {'causal' if causal else 'full'} | {d} | {n} | " + " | ".join(cells) + " |")
    return lines, counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("sweep")
    p.add_argument("--impl", default="triton")
    p.add_argument("--peer", default="sdpa_flash")
    a = p.parse_args()
    lines, counts = compare(json.load(open(a.sweep))["rows"], a.impl, a.peer)
    print("\n".join(lines))
    total = [sum(c[i] for c in counts.values()) for i in range(4)]
    print(f"\nat most {a.peer}: {total[0]} of {total[1]} points; "
          + ", ".join(f"{p} {c[0]}/{c[1]}" for p, c in counts.items())
          + f"; at N >= 8192: {total[2]} of {total[3]} ("
          + ", ".join(f"{p} {c[2]}/{c[3]}" for p, c in counts.items()) + ")")
    largest = largest_ratios(json.load(open(a.sweep))["rows"], a.impl, a.peer)
    print(f"largest {a.impl} / {a.peer}: " + ", ".join(
        f"{p} {r:.3f} ({mask} d{d} N{n})" for p, (r, (mask, d, n)) in sorted(largest.items())))


if __name__ == "__main__":
    main()
