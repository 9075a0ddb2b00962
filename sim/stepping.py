"""The node step loop on the kernel: each node runs `EngineCore.step` at `now` and its next step at the end of
the iteration; an idle node sleeps until new work arrives (`state.kick`) or a load finishes (`wake_at`).

An iteration is two events: the step at its start (the node reports its queue, fetches start, prefills start
and their decode nodes are bound) and its end (KV events reach the directory, the iteration record reaches
the model fitter, finished prefills transfer their KV, finished decodes complete their requests, a phase
switch may complete), because the engine stamps an iteration's results with its end time. When an end
event leaves nothing else to do and no other event is due before the next step would run (`Kernel.run_inline`),
that step runs within the end event: the same actions in the same order, without a round trip through the
queue (counted as the event it stands for). A decode iteration that changes nothing but its requests' progress
may start a quiet run (`sim.quiet`): its end and those of the quiet iterations after it become one event.

Invariant: at most one iteration per node is in flight; the end event of an engine that was relaunched in
the meantime changes nothing.

Boundary: iteration bookkeeping; the request path is `flow`, switches are `phases`.
"""

from __future__ import annotations

from functools import partial

from evolving_infra.node_agent.engine import IterationKind, StepOutput
from evolving_infra.sim import flow, phases, quiet
from evolving_infra.sim.kernel import Command, Event, Priority
from evolving_infra.sim.spans import account_busy
from evolving_infra.sim.state import ClusterState, SimNode, absorb, kick, wake_at
from evolving_infra.sim.views import engine_report


def on_step(state: ClusterState, event: Event) -> list[Command]:
    node = state.nodes[event.payload]
    node.step_at = None
    return _step(state, node, event.time)


def _step(state: ClusterState, node: SimNode, now: float) -> list[Command]:
    engine = node.engine
    if engine is None or node.iterating:
        return []
    state.stats.events += 1
    engine_report(node, now)
    out = engine.step(now)
    commands: list[Command] = flow.start_fetches(state, node, out.fetches_started, now) if out.fetches_started else []
    for started in out.prefills_started:
        commands += flow.on_prefill_started(state, node, started, now)
    if out.kind is IterationKind.IDLE:
        absorb(state, node.id, out.events)
        if out.switch_completed is not None:
            commands += phases.on_switch_completed(state, node, now)
        if out.wake_at is not None and node.step_at is None:
            commands += wake_at(state, node, max(out.wake_at, now))
        return commands
    node.iterating = True
    account_busy(state, node, now, out.duration)
    handler = state.on_iteration_end
    if handler is None:
        handler = state.on_iteration_end = partial(on_iteration_end, state)
        state.on_quiet_end = partial(on_quiet_end, state)
    if (out.kind is IterationKind.DECODE and out.record is not None and not out.decodes_finished and not out.events
            and out.switch_completed is None):
        run = quiet.begin(state, node, out)  # (a decode iteration that changes nothing but progress: maybe a run)
        if run is not None:
            commands.append(run)
            return commands
    # (positional: once per iteration) label, no token, payload
    commands.append(Event(out.end, Priority.COMPLETION, handler, node.end_label, None, (node.id, engine, out)))
    return commands


def on_iteration_end(state: ClusterState, event: Event) -> list[Command]:
    node_id, engine, out = event.payload
    node = state.nodes[node_id]
    if node.engine is not engine:
        return []  # the node was relaunched while this iteration ran
    assert isinstance(out, StepOutput)
    now = event.time
    node.iterating = False
    absorb(state, node.id, out.events)
    if out.record is not None:
        state.core.iteration(node.id, out.record)
    commands: list[Command] = []
    for finished in out.prefills_finished:
        commands += flow.on_prefill_finished(state, node, finished, now)
    for done in out.decodes_finished:
        commands += flow.on_decode_finished(state, node, done, now)
    if out.switch_completed is not None:
        commands += phases.on_switch_completed(state, node, now)
    return _next(state, node, now, commands)


def on_quiet_end(state: ClusterState, event: Event) -> list[Command]:
    """The last iteration of a quiet run ended (`sim.quiet`): the run's iterations are carried out, then as at
    any iteration's end that changed nothing."""
    node_id, run = event.payload
    node = state.nodes[node_id]
    if not quiet.finish(state, node, run):
        return []  # the node was relaunched while the run lasted
    node.iterating = False
    return _next(state, node, event.time, [])


def _next(state: ClusterState, node: SimNode, now: float, commands: list[Command]) -> list[Command]:
    """After an iteration's end: the node's next step, at once where nothing else is due first."""
    if commands or node.step_at is not None or node.engine is None or state.on_step is None:
        return commands + kick(state, node, now)
    kernel = state.kernel
    if kernel is not None and kernel.run_inline(now, Priority.SCHEDULE):
        return _step(state, node, now)  # the step `kick` would schedule, and the kernel would process next
    return kick(state, node, now)
