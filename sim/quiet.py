"""Quiet decode runs: the iterations of a decode node in which nothing happens but the running requests' progress
(nothing finishes, nothing waits for admission: `EngineCore.quiet_ahead`) run as one event at the end of the last
of them, instead of two events each (an iteration's end and the next step).

Most decode iterations are quiet: a request's pages are written when it finishes (docs/engine.md, "Iterations"), so
only its last iteration acts. A quiet iteration's only effects are the engine's own counters, its noise draws (kept in
order by the engine), the node's busy time and report, and the kernel's event counts; `settle` carries them out exactly as the stepped run would have, up to the time something else touches the
node. Whatever touches a node's engine in a run (a transfer landing, a switch or relaunch beginning, the end of the
run) settles it first; the iteration running then ends by its own event, as in the stepped run. Reads that quiet
iterations cannot change (the pool's gauges, the node's mode, count pushes to its pool) need no settling.

A run is taken only where an iteration's record would change nothing: the node serves decode alone, its model
fitter is frozen or absent (records feed only a fitter during warmup; decode records carry no prefill usage), and
the kernel lets handlers carry out events at once (no observer, no event budget: `Kernel.may_skip`).

Equivalence: the same simulation, byte for byte, with the same kernel event counts, as with every step through the
queue (`ClusterState.inline_steps = False`, which also turns runs off): tests/sim/test_sim_inline_steps.py. Busy
spans closed while settling are put in their place by end time (the stepped run appends them in time order).

Boundary: the run bookkeeping of `SimNode.quiet`; stepping is `stepping`, the engine's side is
`EngineCore.quiet_ahead` / `skip_quiet`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

from evolving_infra.core.types import NodeMode
from evolving_infra.node_agent.engine import EngineCore, StepOutput
from evolving_infra.sim.kernel import Cancel, Command, Event, Priority
from evolving_infra.sim.records import NodeSpan
from evolving_infra.sim.spans import account_busy
from evolving_infra.sim.state import ClusterState, SimNode
from evolving_infra.sim.views import engine_report

LIMIT = 256
"""Most quiet iterations one run covers (those of a run settled early are worked out again)."""


@dataclass(eq=False, slots=True)
class QuietRun:
    """The quiet iterations of one node after the iteration it was stepping when the run began (`first_*`)."""

    engine: EngineCore
    first_start: float
    first_duration: float
    starts: list[float]
    durations: list[float]
    ends: list[float]


def begin(state: ClusterState, node: SimNode, out: StepOutput) -> Event | None:
    """After `out`, a quiet decode iteration `stepping` just started on `node`: the event ending it and the quiet
    iterations after it as one run, or None where no run may be taken (then its end event is the usual one)."""
    engine = node.engine
    kernel = state.kernel
    if engine is None or kernel is None or not state.quiet_runs or not kernel.may_skip():
        return None
    fitter = node.fitter
    if engine.mode is not NodeMode.DECODE or (fitter is not None and not fitter.frozen):
        return None
    durations = engine.quiet_ahead(out.end, LIMIT)
    if not durations:
        return None
    starts: list[float] = []
    ends: list[float] = []
    t = out.end
    for d in durations:  # (each step starts at the previous end, and ends at its start plus its duration)
        starts.append(t)
        t = t + d
        ends.append(t)
    handler = state.on_quiet_end
    assert handler is not None  # (made with the iteration-end handler, by the first step)
    run = node.quiet = QuietRun(engine, out.now, out.duration, starts, durations, ends)
    return Event(t, Priority.COMPLETION, handler, node.end_label, node.quiet_token, (node.id, run))


def settle(state: ClusterState, node: SimNode, now: float, *, last: bool = False) -> list[Command]:
    """Carry out `node`'s quiet iterations started before `now` (at or before it with `last`, at the end of a run),
    and end the quiet run: the iteration running at `now` ends by its own event (returned, with the run's event
    cancelled). Nothing to do (and no command) when the node runs none."""
    run = node.quiet
    if run is None:
        return []
    node.quiet = None
    started = (bisect_right if last else bisect_left)(run.starts, now)
    _carry_out(state, node, run, started)
    if started:
        start, duration, end = run.starts[started - 1], run.durations[started - 1], run.ends[started - 1]
    else:
        start, duration, end = run.first_start, run.first_duration, run.starts[0]
    assert state.on_iteration_end is not None  # (made by the first step)
    out = run.engine.quiet_output(start, duration)
    return [Cancel(node.quiet_token),
            Event(end, Priority.COMPLETION, state.on_iteration_end, node.end_label, None, (node.id, run.engine, out))]


def finish(state: ClusterState, node: SimNode, run: QuietRun) -> bool:
    """The run's last iteration ended (its event): carry out every iteration of it; False if the run is stale (the
    node was relaunched or settled since)."""
    if node.quiet is not run or node.engine is not run.engine:
        return False
    node.quiet = None
    _carry_out(state, node, run, len(run.starts))
    return True


def _carry_out(state: ClusterState, node: SimNode, run: QuietRun, count: int) -> None:
    """The first `count` quiet iterations of `run` started (and so every iteration before them ended), as their
    steps and end events would have: the engine's state, the node's busy time and report, the event counts."""
    if not count:
        return
    starts, durations = run.starts[:count], run.durations[:count]
    run.engine.skip_quiet(starts, run.ends[:count])
    spans = state.spans
    closed = len(spans)
    for start, duration in zip(starts, durations):
        account_busy(state, node, start, duration)
    if len(spans) > closed:  # spans closed now, by time among those other nodes closed since
        late = spans[closed:]
        del spans[closed:]
        for span in late:
            insort(spans, span, key=_end)
    engine_report(node, starts[-1])  # (the report of the last step; each step's replaces the one before)
    state.stats.events += count
    assert state.kernel is not None
    state.kernel.count_skipped(2 * count, count)  # `count` ends, each with the next step run at once


def _end(span: NodeSpan) -> float:
    return span.end


__all__ = ["LIMIT", "QuietRun", "begin", "finish", "settle"]
