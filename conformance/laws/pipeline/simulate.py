"""A pipeline schedule played out on simulated ranks: the timeline and what went wrong.

Model (the executor's semantics, independent of any implementation):
  - rank r runs its list of actions in order, one at a time; a forward takes
    ``forward_cost`` time units, a backward ``backward_cost`` (integers: exact arithmetic);
  - forward of micro-batch i on stage s > 0 needs the activation message (F, i) from
    stage s - 1, sent when that forward ends; backward of i on stage s < p - 1 needs the
    gradient message (B, i) from stage s + 1, sent when that backward ends;
  - sends never block (buffered, like ``isend``); receives block until the message exists;
    messages are matched by (kind, micro-batch), so arrival order does not matter;
  - every action starts as soon as its rank is free and its message has arrived.

If some rank still has actions left when no rank can move, the schedule deadlocks: the
result lists what each stuck rank waits for.  Nothing here checks counts or order beyond
what blocks; the laws do.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    rank: int
    kind: str
    microbatch: int
    stage: int
    start: int
    end: int


@dataclass
class Timeline:
    n_ranks: int
    steps: list[Step] = field(default_factory=list)
    stuck: dict[int, tuple] = field(default_factory=dict)  # rank -> (action it waits at, the message it needs)

    @property
    def deadlocked(self) -> bool:
        return bool(self.stuck)

    @property
    def makespan(self) -> int:
        return max((s.end for s in self.steps), default=0)

    def busy(self, rank: int) -> int:
        return sum(s.end - s.start for s in self.steps if s.rank == rank)

    def idle_fraction(self):
        """1 - (time spent computing) / (ranks x makespan), as an exact Fraction."""
        from fractions import Fraction

        total = self.n_ranks * self.makespan
        if total == 0:
            return Fraction(0)
        return 1 - Fraction(sum(self.busy(r) for r in range(self.n_ranks)), total)

    def of(self, kind: str, microbatch: int, stage: int) -> list[Step]:
        return [s for s in self.steps if (s.kind, s.microbatch, s.stage) == (kind, microbatch, stage)]


def needed_message(kind: str, microbatch: int, stage: int, n_stages: int):
    """The message an action waits for: (kind, micro-batch, sending stage), or None."""
    if kind == "F" and stage > 0:
        return ("F", microbatch, stage - 1)
    if kind == "B" and stage < n_stages - 1:
        return ("B", microbatch, stage + 1)
    return None


def simulate(plan, n_stages: int, forward_cost: int = 1, backward_cost: int = 1) -> Timeline:
    """Play ``plan`` (per rank, a list of (kind, micro-batch, stage)) on ``len(plan)`` ranks."""
    n_ranks = len(plan)
    cost = {"F": forward_cost, "B": backward_cost}
    sent: dict[tuple, int] = {}  # (kind, micro-batch, sending stage) -> time it is available
    cursor = [0] * n_ranks
    clock = [0] * n_ranks
    timeline = Timeline(n_ranks)
    moved = True
    while moved:
        moved = False
        for r in range(n_ranks):
            while cursor[r] < len(plan[r]):
                kind, mb, stage = plan[r][cursor[r]]
                need = needed_message(kind, mb, stage, n_stages)
                if need is not None and need not in sent:
                    break
                start = max(clock[r], sent[need] if need is not None else 0)
                end = start + cost.get(kind, 1)
                timeline.steps.append(Step(r, kind, mb, stage, start, end))
                sent.setdefault((kind, mb, stage), end)
                clock[r] = end
                cursor[r] += 1
                moved = True
    for r in range(n_ranks):
        if cursor[r] < len(plan[r]):
            kind, mb, stage = plan[r][cursor[r]]
            timeline.stuck[r] = ((kind, mb, stage), needed_message(kind, mb, stage, n_stages))
    return timeline


def in_flight_peak(actions) -> int:
    """The most micro-batches whose forward has run and whose backward has not, on one rank."""
    live, peak = set(), 0
    for kind, mb, _stage in actions:
        if kind == "F":
            live.add(mb)
        elif kind == "B":
            live.discard(mb)
        peak = max(peak, len(live))
    return peak
