"""A cheap closed-loop timeline of a trace: when each request would be issued if every request took a fixed
latency, so that a scored window's statistics can be read without a simulation.

The paper scores minutes 30-85 of a closed loop (tables D.1, D.4): agents start in file order, `agents` of them
at once, and a finished agent is replaced by the next. Which requests fall into that window (old agents with
long contexts, compactions, how many sub-agent requests) is what the trace-wide figures of `shape` cannot say.
Here a request is issued `delay_s` after the last request it waits for finishes (its agent's start for the
first), and finishes `Latency.of(request)` later: no queueing, no contention; the latency defaults are table
D.1's CC figures under SGLang, so the timeline is the paper's baseline's, not ours.

Boundary: pure computation over records already generated (trusted to be valid, in file order).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from evolving_infra.workloads.shape import Shape, format_shape, shapes


@dataclass(frozen=True)
class Latency:
    """A request's latency: a fixed time to first token plus a time per output token."""

    ttft_s: float = 4.8
    """Table D.1: mean TTFT of CC under SGLang at 4P5D, 90 agents."""
    tpot_s: float = 0.0058
    """Table D.1: E2E minus TTFT is 4.4 s at ~760 output tokens per request (the CC generator's mean)."""

    def __post_init__(self) -> None:
        if not (self.ttft_s >= 0 and self.tpot_s >= 0):
            raise ValueError(f"latency must be >= 0, got ttft_s={self.ttft_s}, tpot_s={self.tpot_s}")

    def of(self, output_tokens: int) -> float:
        return self.ttft_s + self.tpot_s * output_tokens


@dataclass(frozen=True)
class Timeline:
    """Issue and finish time of every request that started before `horizon_s`, and the agents' spans."""

    issue: dict[str, float]
    finish: dict[str, float]
    branch_span: dict[str, tuple[float, float]]
    """Per branch: its first request's issue and its last request's finish."""
    agents_started: int
    ran_out: bool
    """The trace had no agent left to start before `horizon_s`."""


def closed_loop(records: Iterable[Mapping[str, object]], agents: int, horizon_s: float,
                latency: Latency | None = None) -> Timeline:  # fmt: skip
    """Replay `records` in a closed loop of `agents` concurrent agents until `horizon_s`, at fixed latencies."""
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    lat = latency or Latency()
    by_agent: dict[str, list[Mapping[str, object]]] = {}
    order: list[str] = []
    for rec in records:
        if rec.get("kind") == "agent":
            order.append(str(rec["agent"]))
            by_agent[str(rec["agent"])] = []
        elif rec.get("kind") == "request":
            by_agent[str(rec["agent"])].append(rec)
    free = [0.0] * agents  # when each slot frees
    issue: dict[str, float] = {}
    finish: dict[str, float] = {}
    span: dict[str, tuple[float, float]] = {}
    started = 0
    for agent in order:
        start = heapq.heappop(free)
        if start >= horizon_s:
            heapq.heappush(free, start)
            break
        started += 1
        end = start
        for rec in by_agent[agent]:
            after = [str(a) for a in rec.get("after") or []]  # type: ignore[attr-defined]  # record values are typed object
            ready = max((finish[a] for a in after), default=start)
            t = ready + float(rec.get("delay_s") or 0.0)  # type: ignore[arg-type]  # record values are typed object
            rid, branch = str(rec["id"]), str(rec["branch"])
            issue[rid] = t
            finish[rid] = t + lat.of(int(rec["output_tokens"]))  # type: ignore[call-overload]  # record values are typed object
            first = span.get(branch, (t, t))[0]
            span[branch] = (first, max(finish[rid], span.get(branch, (t, t))[1]))
            end = max(end, finish[rid])
        heapq.heappush(free, end)
    ran_out = started == len(order) and min(free) < horizon_s
    return Timeline(issue, finish, span, started, ran_out)


@dataclass(frozen=True)
class WindowShape:
    """The shape of the requests issued in `[start_s, end_s)` of a closed loop, per workload label."""

    start_s: float
    end_s: float
    shapes: dict[str, Shape]
    alive_branches: float
    """Mean number of branches alive in the window (first issue to last finish; a parent waiting for its
    sub-agents counts)."""
    little_branches: float
    """Table C.3's Little's-law figure X x (E2E + pause): the window's requests per second times their mean
    latency plus mean `delay_s` (a parent's wait for its sub-agents is not a pause)."""
    requests_per_s: float
    timeline: Timeline


def window_shape(records: Sequence[Mapping[str, object]], agents: int, start_s: float, end_s: float,
                 latency: Latency | None = None) -> WindowShape:  # fmt: skip
    """Shapes of the requests a closed loop of `agents` issues in `[start_s, end_s)` at fixed latencies."""
    if not 0 <= start_s < end_s:
        raise ValueError(f"window must satisfy 0 <= start < end, got [{start_s}, {end_s})")
    tl = closed_loop(records, agents, end_s, latency)
    counted = {rid for rid, t in tl.issue.items() if start_s <= t < end_s}
    alive = sum(max(0.0, min(b, end_s) - max(a, start_s)) for a, b in tl.branch_span.values())
    span = end_s - start_s
    found = shapes(records, only=counted)
    cycle = sum(tl.finish[r] - tl.issue[r] for r in counted) + sum(s.pause_s for s in found.values())
    return WindowShape(start_s, end_s, found, alive / span, cycle / span, len(counted) / span, tl)


def format_window(w: WindowShape) -> str:
    head = (f"closed loop, requests issued in [{w.start_s:g}, {w.end_s:g}) s at fixed latencies: "
            f"{w.requests_per_s:.2f} req/s, {w.little_branches:.1f} busy branches X x (E2E + pause) "
            f"({w.alive_branches:.1f} alive), "
            f"{w.timeline.agents_started} agents started{' (trace ran out)' if w.timeline.ran_out else ''}")  # fmt: skip
    return "\n".join([head, *(format_shape(label, s) for label, s in w.shapes.items())])
