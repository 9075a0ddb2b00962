"""The operator's part of `status`, computed from what it observed; and what the operator owns there.

The operator owns `observedGeneration`, `split`, `prefill`, `decode`, `readyNodes`, `adapting`, `nodes`
and the conditions; the router owns `targetSplit` and `fittedModels`. The split always counts what the
tracked nodes serve now, never what was asked for.

Conditions:
- `Invalid`: the spec cannot be applied (then nothing is created, and `Ready` is False);
- `RouterReady`: the router Deployment has an available replica;
- `NodeAgentsReady`: every expected node agent answers and serves;
- `Adapting`: a switch is in progress (True), or how the last one ended (False: `SplitConverged`,
  `SwitchRolledBack`); only the switch protocol sets it;
- `Degraded`: serving with less than asked: unreachable agents, nodes claimed by an earlier cluster or
  missing, children the operator cannot own, a switch rolled back;
- `Ready`: the router is available and every phase of the split has a serving node (requests can be
  served); stays True during a routine re-split and with some agents down (then `Degraded` says so);
- `Progressing`: the spec is being rolled out: children were written in this pass, or the cluster is not
  yet Ready. False (`RolloutComplete`) once Ready with nothing left to write; False
  (`ProgressDeadlineExceeded`) when it has been True for longer than the deadline, until a new rollout
  (children written) or readiness. A re-split is `Adapting`, not `Progressing`.

Boundary: pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from evolving_infra.operator import conditions, nodes
from evolving_infra.operator.conditions import Want
from evolving_infra.operator.status import (
    AgentServingClusterStatus, Condition, ConditionStatus, ConditionType, NodeState, NodeStatus, format_split,
)  # fmt: skip

OPERATOR_FIELDS = ("observed_generation", "split", "prefill", "decode", "ready_nodes", "adapting", "nodes", "conditions")
"""Fields of `AgentServingClusterStatus` the operator writes (with its own field manager)."""

SWITCH_ROLLED_BACK = "SwitchRolledBack"
ROLLOUT = "RollingOut"
ROLLOUT_COMPLETE = "RolloutComplete"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
SWITCHING = "Switching"
SPLIT_CONVERGED = "SplitConverged"


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason the cluster is degraded."""

    reason: str
    message: str


def owned(status: AgentServingClusterStatus) -> dict[str, Any]:
    """The operator's fields of `status`, as the API server stores them."""
    data = status.to_kube()
    keep = {AgentServingClusterStatus.model_fields[f].alias or f for f in OPERATOR_FIELDS}
    return {k: v for k, v in data.items() if k in keep}


def same_owned(a: AgentServingClusterStatus, b: AgentServingClusterStatus) -> bool:
    def key(s: AgentServingClusterStatus) -> tuple[Any, ...]:
        conds = {c.type: c for c in s.conditions or ()}
        by_name = {n.name: n for n in s.nodes or ()}
        return (s.observed_generation, s.split, s.prefill, s.decode, s.ready_nodes, s.adapting, by_name, conds)

    return key(a) == key(b)


def with_nodes(status: AgentServingClusterStatus, tracked: Sequence[NodeStatus]) -> AgentServingClusterStatus:
    """`status` with `nodes` and the counts derived from them."""
    if not tracked:
        return status.model_copy(update={"nodes": None, "split": None, "prefill": None, "decode": None, "ready_nodes": 0})
    prefill, decode = nodes.count(tracked)
    return status.model_copy(
        update={
            "nodes": list(tracked),
            "split": format_split(prefill, decode),
            "prefill": prefill,
            "decode": decode,
            "ready_nodes": nodes.serving(tracked),
        }
    )


def with_conditions(
    status: AgentServingClusterStatus, wanted: Sequence[Want], now: datetime, generation: int | None
) -> AgentServingClusterStatus:
    merged = conditions.merge(status.conditions, wanted, now, generation)
    adapting = conditions.is_true(merged, ConditionType.ADAPTING)
    return status.model_copy(update={"conditions": merged, "adapting": adapting})


def invalid(status: AgentServingClusterStatus, problems: Sequence[str], now: datetime, generation: int | None) -> AgentServingClusterStatus:
    """Status of a spec that cannot be applied."""
    message = "; ".join(problems)
    wanted = [
        Want.true(ConditionType.INVALID, "InvalidSpec", message),
        Want.false(ConditionType.READY, "InvalidSpec", "the spec cannot be applied; see the Invalid condition"),
        Want.false(ConditionType.PROGRESSING, "InvalidSpec", "nothing is rolled out while the spec cannot be applied"),
    ]
    out = with_conditions(status, wanted, now, generation)
    return out.model_copy(update={"observed_generation": generation})


def node_problems(tracked: Sequence[NodeStatus]) -> list[Problem]:
    down = [n.name for n in tracked if n.state is NodeState.UNREACHABLE]
    if not down:
        return []
    shown = ", ".join(down[:5]) + (f" and {len(down) - 5} more" if len(down) > 5 else "")
    return [Problem("NodeAgentsUnreachable", f"{len(down)} node agent(s) do not answer: {shown}")]


def serves_every_phase(tracked: Sequence[NodeStatus]) -> bool:
    """At least one node serves, and so does at least one node of every phase the split has."""
    phases = {n.phase for n in tracked}
    up = {n.phase for n in tracked if n.state is NodeState.SERVING}
    return bool(tracked) and phases <= up


def progressing(
    previous: Condition | None, *, ready: bool, rolled_out: bool, waiting_for: str, now: datetime, deadline_seconds: float
) -> Want:
    """The `Progressing` condition (see the module docstring); `waiting_for` says what is not ready yet."""
    if ready and not rolled_out:
        return Want.false(ConditionType.PROGRESSING, ROLLOUT_COMPLETE, "the cluster is Ready")
    was_exceeded = previous is not None and previous.status is ConditionStatus.FALSE and previous.reason == PROGRESS_DEADLINE_EXCEEDED
    if was_exceeded and not rolled_out and previous is not None:
        return Want.false(ConditionType.PROGRESSING, PROGRESS_DEADLINE_EXCEEDED, previous.message)
    since = previous.last_transition_time if previous is not None and previous.status is ConditionStatus.TRUE else now
    waited = (now - since).total_seconds()
    what = "children were updated" if ready else f"waiting for the {waiting_for}"
    if waited > deadline_seconds:
        return Want.false(
            ConditionType.PROGRESSING,
            PROGRESS_DEADLINE_EXCEEDED,
            f"not Ready {waited:.0f} s after the rollout began (deadline {deadline_seconds:g} s): {what}",
        )
    return Want.true(ConditionType.PROGRESSING, ROLLOUT, what)


def summarize(
    status: AgentServingClusterStatus,
    *,
    tracked: Sequence[NodeStatus],
    expected_nodes: int,
    router_ready: bool,
    problems: Sequence[Problem],
    now: datetime,
    generation: int | None,
    rolled_out: bool = False,
    progress_deadline_seconds: float = 600.0,
) -> AgentServingClusterStatus:
    """The operator's status of a valid cluster from the nodes it tracked and the problems it found."""
    out = with_nodes(status, tracked)
    serving = nodes.serving(tracked)
    all_problems = list(problems) + node_problems(tracked)
    adapting = conditions.find(status.conditions, ConditionType.ADAPTING)
    target = status.target_split
    if (
        adapting is not None
        and adapting.reason == SWITCH_ROLLED_BACK
        and target is not None
        and out.split != target.split
    ):
        all_problems.insert(0, Problem(SWITCH_ROLLED_BACK, adapting.message))
    agents_ready = expected_nodes > 0 and serving >= expected_nodes
    wanted = [
        Want.false(ConditionType.INVALID, "ValidSpec"),
        Want.true(ConditionType.ROUTER_READY, "RouterAvailable")
        if router_ready
        else Want.false(ConditionType.ROUTER_READY, "RouterUnavailable", "the router Deployment has no available replica"),
        Want.true(ConditionType.NODE_AGENTS_READY, "NodeAgentsServing", f"{serving} of {expected_nodes} node agents serving")
        if agents_ready
        else Want.false(ConditionType.NODE_AGENTS_READY, "NodeAgentsNotReady", f"{serving} of {expected_nodes} node agents serving"),
        Want.true(ConditionType.DEGRADED, all_problems[0].reason, "; ".join(p.message for p in all_problems))
        if all_problems
        else Want.false(ConditionType.DEGRADED, "AsRequested"),
    ]
    phases_served = serves_every_phase(tracked)
    missing = [name for name, ok in (("router", router_ready), ("node agents", phases_served)) if not ok]
    if router_ready and phases_served:
        wanted.append(Want.true(ConditionType.READY, "Serving", f"split {out.split}"))
    else:
        wanted.append(Want.false(ConditionType.READY, "NotServing", f"waiting for the {' and '.join(missing)}"))
    wanted.append(
        progressing(
            conditions.find(status.conditions, ConditionType.PROGRESSING),
            ready=router_ready and phases_served,
            rolled_out=rolled_out,
            waiting_for=" and ".join(missing),
            now=now,
            deadline_seconds=progress_deadline_seconds,
        )
    )
    if adapting is None:
        wanted.append(Want.false(ConditionType.ADAPTING, SPLIT_CONVERGED, "no switch has run"))
    out = with_conditions(out, wanted, now, generation)
    return out.model_copy(update={"observed_generation": generation})
