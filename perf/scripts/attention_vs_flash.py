"""The sweep goal, counted: at every point of an attention sweep (perf.bench.attention's
attention.json), ours against SDPA flash for forward, backward and forward + backward.

    python perf/scripts/attention_vs_flash.py SWEEP_DIR/attention.json [--impl triton] [--peer sdpa_flash] [--paired]
        [--reading time|device|host]

Prints a markdown table (ours / peer ms, ``**`` where ours is at most the peer), the counts
per pass, overall and from N = 8192 on, and the largest ratio ours / peer per pass.  With the
peer against a copy of itself (``--impl sdpa_flash@2``, perf.bench.attention's NAME@TAG) the
counts and ratios are the sweep's noise floor.  ``--paired`` reads each point by the median over
rounds of the round's ratio (both measured in the same round), not by the ratio of medians.
``--reading`` picks what is compared: ``time`` (do_bench's median, the default), ``device``
(device time with the GPU held behind the host, a sweep run with ``--device-time``) or ``host``
(the host's microseconds per call).  Where a call's host time exceeds do_bench's L2 flush,
``time`` reads whichever of the two ends last; ``device`` and ``host`` read each apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

PASSES = ("forward", "backward", "forward_backward")
READINGS = {"time": "ms", "device": "device_ms", "host": "host_us"}  # --reading -> the rows' field


def _times(rows, reading: str = "time") -> dict:
    """(causal, d, N, pass) -> impl -> (the row's value of the reading, its rounds' values)."""
    field = READINGS[reading]
    ms = defaultdict(dict)
    for r in rows:
        if r.get("status") == "ok" and r.get(field) is not None:
            ms[(r["causal"], r["d"], r["seq"], r["pass"])][r["impl"]] = (r[field], r.get(f"{field}_rounds"))
    return ms


def ratio(ours, peer, paired: bool = False) -> float:
    """ours / peer of one point: the medians' ratio; ``paired``, the median over rounds of each
    round's ratio (the two measured in the same round, so a drift of the host over the rounds
    is in both), which needs the rows' rounds (a sweep's ``--rounds`` > 1)."""
    if not paired:
        return ours[0] / peer[0]
    if not ours[1] or not peer[1] or len(ours[1]) != len(peer[1]):
        raise ValueError("a paired ratio needs both rows' rounds, as many of each (a sweep with --rounds > 1)")
    return statistics.median(a / b for a, b in zip(ours[1], peer[1]))


def largest_ratios(rows, impl: str, peer: str, paired: bool = False, reading: str = "time") -> dict:
    """Per pass, the largest ours / peer over the points both have, and its point (mask, d, N)."""
    largest = {}
    for (causal, d, n, p), got in _times(rows, reading).items():
        if impl in got and peer in got:
            r = ratio(got[impl], got[peer], paired)
            if p not in largest or r > largest[p][0]:
                largest[p] = (r, ("causal" if causal else "full", d, n))
    return largest


def compare(rows, impl: str, peer: str, paired: bool = False, reading: str = "time") -> tuple[list[str], dict]:
    """The table's lines and, per pass, [won, compared, won at N >= 8192, compared there]; a
    point is won where ours / peer (``ratio``) is at most 1."""
    ms = _times(rows, reading)
    points = sorted({key[:3] for key in ms}, key=lambda p: (not p[0], p[1], p[2]))
    unit = "us" if reading == "host" else "ms"
    what = ("paired ratio over rounds" if paired else unit) + ("" if reading == "time" else f", {reading}")
    lines = ["| mask | d | N | " + " | ".join(f"{p} ({impl} / {peer}, {what})" for p in PASSES) + " |",
             "|---|---:|---:|" + "---:|" * len(PASSES)]
    counts = {p: [0, 0, 0, 0] for p in PASSES}
    for causal, d, n in points:
        cells = []
        for p in PASSES:
            got = ms.get((causal, d, n, p), {})
            if impl not in got or peer not in got:
                cells.append("-")
                continue
            r = ratio(got[impl], got[peer], paired)
            win = r <= 1
            c = counts[p]
            c[0] += win
            c[1] += 1
            if n >= 8192:
                c[2] += win
                c[3] += 1
            cell = f"{r:.3f}" if paired else f"{got[impl][0]:.3f} / {got[peer][0]:.3f}"
            cells.append(cell + (" **" if win else ""))
        lines.append(f"| {'causal' if causal else 'full'} | {d} | {n} | " + " | ".join(cells) + " |")
    return lines, counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("sweep")
    p.add_argument("--impl", default="triton")
    p.add_argument("--peer", default="sdpa_flash")
    p.add_argument("--paired", action="store_true",
                   help="compare each point by the median over rounds of the round's ratio, not the medians' ratio")
    p.add_argument("--reading", choices=sorted(READINGS), default="time",
                   help="do_bench's time, device time with the GPU held behind (--device-time sweeps), or host time")
    a = p.parse_args()
    rows = json.load(open(a.sweep))["rows"]
    lines, counts = compare(rows, a.impl, a.peer, a.paired, a.reading)
    print("\n".join(lines))
    total = [sum(c[i] for c in counts.values()) for i in range(4)]
    how = ", ".join(([] if a.reading == "time" else [f"{a.reading} reading"]) + (["paired"] if a.paired else []))
    print(f"\nat most {a.peer}{f' ({how})' if how else ''}: {total[0]} of {total[1]} points; "
          + ", ".join(f"{p} {c[0]}/{c[1]}" for p, c in counts.items())
          + f"; at N >= 8192: {total[2]} of {total[3]} ("
          + ", ".join(f"{p} {c[2]}/{c[3]}" for p, c in counts.items()) + ")")
    largest = largest_ratios(rows, a.impl, a.peer, a.paired, a.reading)
    print(f"largest {a.impl} / {a.peer}: " + ", ".join(
        f"{p} {r:.3f} ({mask} d{d} N{n})" for p, (r, (mask, d, n)) in sorted(largest.items())))


if __name__ == "__main__":
    main()
