"""Carrying out a target split: the live side of the phase-switch protocol.

One attempt (`run_switch`), under the cluster's lock:
1. read the object afresh; nothing to do without a target, or when the tracked nodes already match it;
2. plan the moves (`switch_plan.plan_switch`); a stale target (older generation than some node's) moves
   nothing; a target that cannot be reached counts as a failed attempt;
3. mark the moving nodes `switching`, set `Adapting` (status write), then call every moving node's
   `SwitchPhase(target, generation)` at once (bounded concurrency, each with its deadline);
4. record each node that switched (phase, generation) with a `PhaseSwitched` event carrying its
   durations; when all did, the split follows and `Adapting` turns False (`SplitConverged`).
A failed attempt leaves the switched nodes switched and returns `RETRY` with a delay (doubling, capped);
after the last attempt, or at once when an agent refuses the request, the nodes this target switched are
switched back with generation + 1 (`SwitchRolledBack` events), and `Adapting` False / `Degraded` True
say why. An unreachable agent is never fatal: the node is marked `unreachable` and the attempt fails.

Boundary: calls agents and the API; the decisions are in `switch_plan`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evolving_infra.operator import conditions, summary, switch_plan
from evolving_infra.operator.agents import AgentError, AgentRejected, AgentUnavailable, SwitchResult
from evolving_infra.operator.conditions import Want
from evolving_infra.operator.placement import call_moves
from evolving_infra.operator.reconcile import Runtime, fetch, observe_nodes, parse, parse_status, write_status
from evolving_infra.operator.status import AgentServingClusterStatus, ConditionType, NodeState, NodeStatus
from evolving_infra.operator.switch_plan import Move

log = logging.getLogger(__name__)


class Result(enum.Enum):
    NOTHING = "nothing"
    CONVERGED = "converged"
    STALE = "stale"
    RETRY = "retry"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True, slots=True)
class SwitchOutcome:
    result: Result
    message: str = ""
    delay: float = 0.0


def _fmt_move(move: Move) -> str:
    return f"{move.node} {move.source.value}->{move.target.value}"


def _event_message(move: Move, result: SwitchResult) -> str:
    extra = " (already serving it)" if result.already_serving else ""
    return (
        f"node {move.node}: {move.source.value} -> {move.target.value} in {result.switch_seconds:.3f} s "
        f"(drain {result.drain_seconds:.3f} s, {result.handed_back} queued request(s) handed back), "
        f"generation {move.generation}{extra}"
    )


class _Attempt:
    """Status bookkeeping of one attempt: the tracked nodes, the status to write, the events."""

    def __init__(self, rt: Runtime, body: Mapping[str, Any], status: AgentServingClusterStatus, nodes: list[NodeStatus]) -> None:
        self.rt, self.body, self.before, self.nodes = rt, body, status, nodes
        self.generation = (body.get("metadata") or {}).get("generation")

    async def write(self, adapting: Want, degraded: Want | None = None) -> None:
        status = summary.with_nodes(self.before, self.nodes)
        wanted = [adapting] if degraded is None else [adapting, degraded]
        status = summary.with_conditions(status, wanted, self.rt.clock(), self.generation)
        await write_status(self.rt, self.body, self.before, status)
        self.before = status

    async def run(self, moves: Sequence[Move], reason: str, event_type: str) -> list[tuple[Move, AgentError]]:
        """Call the agents for `moves`; record successes (with events); return the failures."""
        failures = []
        for move, result in zip(moves, await call_moves(self.rt, moves), strict=True):
            if isinstance(result, AgentError):
                state = NodeState.UNREACHABLE if isinstance(result, AgentUnavailable) else NodeState.SERVING
                self.nodes = switch_plan.mark(self.nodes, [move.node], state)
                failures.append((move, result))
                continue
            self.nodes = switch_plan.apply_move(self.nodes, move)
            self.rt.events(self.body, event_type, reason, _event_message(move, result))
        return failures


async def run_switch(rt: Runtime, namespace: str, name: str, attempt: int) -> SwitchOutcome:
    """One attempt at the cluster's target split (`attempt` counts from 0); see the module docstring."""
    async with rt.lock(namespace, name):
        body = await fetch(rt, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return SwitchOutcome(Result.NOTHING, "the cluster is gone")
        status = parse_status(body)
        target = status.target_split
        if target is None:
            return SwitchOutcome(Result.NOTHING, "no target split")
        parsed = parse(body, rt.profile_table())
        if parsed.spec is None or parsed.problems:
            return SwitchOutcome(Result.NOTHING, "the spec is invalid; see the Invalid condition")
        tracked = status.nodes
        if not tracked:
            tracked = await observe_nodes(rt, parsed.cluster, parsed.spec, None, None)
        plan = switch_plan.plan_switch(tracked, target)
        run = _Attempt(rt, body, status, list(tracked))
        if plan.stale:
            log.warning("%s/%s: %s", namespace, name, "; ".join(plan.problems))
            return SwitchOutcome(Result.STALE, "; ".join(plan.problems))
        if plan.done:
            await run.write(Want.false(ConditionType.ADAPTING, summary.SPLIT_CONVERGED, f"serving {target.split}"))
            return SwitchOutcome(Result.CONVERGED, f"serving {target.split}")
        errors: list[AgentError] = []
        messages: list[str] = []
        if plan.moves and not plan.problems:
            moving = ", ".join(_fmt_move(m) for m in plan.moves)
            run.nodes = switch_plan.mark(run.nodes, [m.node for m in plan.moves], NodeState.SWITCHING)
            await run.write(Want.true(ConditionType.ADAPTING, summary.SWITCHING, f"to {target.split}: {moving}"))
            failed = await run.run(plan.moves, "PhaseSwitched", "Normal")
            errors = [err for _, err in failed]
            messages = [f"{move.node}: {err}" for move, err in failed]
            if not errors:
                message = f"serving {target.split} after switching {moving}"
                # An earlier rollback no longer degrades the cluster (the next resync re-checks the rest).
                degraded = conditions.find(run.before.conditions, ConditionType.DEGRADED)
                cleared = Want.false(ConditionType.DEGRADED, "AsRequested") if degraded and degraded.reason == summary.SWITCH_ROLLED_BACK else None
                await run.write(Want.false(ConditionType.ADAPTING, summary.SPLIT_CONVERGED, message), cleared)
                rt.events(body, "Normal", "SplitChanged", f"{status.split or '?'} -> {target.split}: {moving}")
                return SwitchOutcome(Result.CONVERGED, message)
        failures = [*plan.problems, *messages]
        refused = any(isinstance(e, AgentRejected) for e in errors)
        if attempt + 1 < rt.settings.switch_attempts and not refused:
            delay = rt.settings.switch_backoff(attempt)
            message = (
                f"attempt {attempt + 1} of {rt.settings.switch_attempts} at {target.split} failed, "
                f"retrying in {delay:g} s: {'; '.join(failures)}"
            )
            await run.write(Want.true(ConditionType.ADAPTING, "SwitchRetrying", message))
            return SwitchOutcome(Result.RETRY, message, delay)
        return await _roll_back(run, target.split, plan.generation, failures)


async def _roll_back(run: _Attempt, split: str, generation: int, failures: Sequence[str]) -> SwitchOutcome:
    back = switch_plan.plan_rollback(run.nodes, generation)
    undone = await run.run(back, "SwitchRolledBack", "Warning") if back else []
    parts = [f"switch to {split} failed: {'; '.join(failures)}"]
    failed_back = {move.node for move, _ in undone}
    returned = [m.node for m in back if m.node not in failed_back]
    if returned:
        parts.append(f"switched back: {', '.join(returned)}")
    if undone:
        parts.append(f"could not switch back: {'; '.join(f'{m.node}: {e}' for m, e in undone)}")
    message = "; ".join(parts)
    run.rt.events(run.body, "Warning", summary.SWITCH_ROLLED_BACK, message)
    adapting = Want.false(ConditionType.ADAPTING, summary.SWITCH_ROLLED_BACK, message)
    await run.write(adapting, Want.true(ConditionType.DEGRADED, summary.SWITCH_ROLLED_BACK, message))
    return SwitchOutcome(Result.ROLLED_BACK, message)

