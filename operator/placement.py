"""Placing collocated node agents into a phase: the initial split, and nodes that join later.

Node agents start collocated (serving both phases, as during warmup), and the live router routes only to
prefill and decode nodes, so the operator gives each collocated node one phase through the same
`SwitchPhase(target, generation)` the phase switch uses:
- no node placed yet (every answering agent collocated, no `status.targetSplit`): `spec.initialSplit`,
  the first `prefill` nodes by name serve prefill, the rest decode;
- some nodes placed (a later DaemonSet pod, or an earlier attempt that placed only some): each unplaced
  node, by name, takes prefill while fewer nodes serve prefill than the split asks for (the router's
  `targetSplit` when there is one, else `initialSplit`), else decode.
A node is placed when its agent reports a phase, or when it does not answer but status records a switch
(`switchGeneration` > 0). Placement runs when some reachable agent reports collocated, or while a failed
placement is being retried (`Adapting` True, `PlacementRetrying`); unreachable unplaced nodes are then
planned too (their calls fail and the attempt is retried), so the assignment stays the one by name.
Each attempt uses generation max(every node's) + 1.

Invariants: agents that serve a phase are never moved here (re-splitting is the router's, through
`targetSplit`); with no node placed, the plan is exactly `initialSplit` by name order.

Boundary: `plan_placement` is pure; `place` calls the agents and posts one event per switch; the caller
(`reconcile`) writes status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evolving_infra.core.types import Phase, SwitchMode
from evolving_infra.operator import switch_plan
from evolving_infra.operator.agents import AgentError, AgentState, AgentUnavailable, SwitchResult
from evolving_infra.operator.spec import InitialSplit
from evolving_infra.operator.status import NodeState, NodeStatus, TargetSplit, format_split
from evolving_infra.operator.switch_plan import Move

if TYPE_CHECKING:
    from evolving_infra.operator.reconcile import Runtime

INITIAL_SPLIT = "InitialSplit"
NODE_PLACED = "NodePlaced"
PLACEMENT_FAILED = "PlacementFailed"
PLACEMENT_RETRYING = "PlacementRetrying"
PHASE_SWITCHED = "PhaseSwitched"


@dataclass(frozen=True, slots=True)
class Placement:
    """The moves that place the unplaced nodes; `initial` when no node was placed before."""

    moves: tuple[Move, ...]
    split: str
    initial: bool


def unplaced(nodes: Sequence[NodeStatus], answers: Mapping[str, AgentState | AgentError]) -> list[str]:
    """Nodes with no phase yet: collocated agents, and silent ones no switch ever placed."""
    out = []
    for node in nodes:
        answer = answers.get(node.name)
        if isinstance(answer, AgentState):
            if answer.phase is None:
                out.append(node.name)
        elif node.switch_generation == 0:
            out.append(node.name)
    return sorted(out)


def plan_placement(
    nodes: Sequence[NodeStatus],
    answers: Mapping[str, AgentState | AgentError],
    initial: InitialSplit,
    target: TargetSplit | None,
    retrying: bool = False,
) -> Placement | None:
    """The placement moves (see the module docstring), or None when no reachable agent is collocated
    (nor, when `retrying` an earlier failed placement, any node unplaced)."""
    free = set(unplaced(nodes, answers))
    collocated = any(isinstance(a, AgentState) and a.phase is None for a in answers.values())
    if not collocated and not (retrying and free):
        return None
    placed = [n for n in nodes if n.name not in free]
    want_prefill = target.prefill if target is not None else initial.prefill
    have_prefill = sum(1 for n in placed if n.phase is Phase.PREFILL)
    generation = max([n.switch_generation for n in nodes] + [a.generation for a in answers.values() if isinstance(a, AgentState)]) + 1
    moves = []
    for node in sorted((n for n in nodes if n.name in free), key=lambda n: n.name):
        phase = Phase.PREFILL if have_prefill < want_prefill else Phase.DECODE
        have_prefill += phase is Phase.PREFILL
        moves.append(Move(node.name, node.address, node.phase, phase, generation))
    prefill = sum(1 for n in placed if n.phase is Phase.PREFILL) + sum(1 for m in moves if m.target is Phase.PREFILL)
    return Placement(tuple(moves), format_split(prefill, len(nodes) - prefill), initial=not placed)


@dataclass(frozen=True, slots=True)
class PlaceResult:
    """What one placement attempt did: the nodes after it, and the failures (move, error)."""

    nodes: list[NodeStatus]
    placement: Placement
    failures: tuple[tuple[Move, AgentError], ...]

    @property
    def summary(self) -> str:
        done = [m for m in self.placement.moves if m.node not in {f.node for f, _ in self.failures}]
        what = "initial split" if self.placement.initial else "placing joined node(s)"
        return f"{what} {self.placement.split}: " + ", ".join(f"{m.node} {m.target.value}" for m in done)


def _message(move: Move, result: SwitchResult) -> str:
    return (
        f"node {move.node}: collocated -> {move.target.value} in {result.switch_seconds:.3f} s "
        f"(drain {result.drain_seconds:.3f} s, {result.handed_back} queued request(s) handed back), "
        f"generation {move.generation}"
    )


async def call_moves(rt: Runtime, moves: Sequence[Move]) -> list[SwitchResult | AgentError]:
    """Call `SwitchPhase` for every move at once (at most `agent_concurrency` in flight); each result is the
    agent's answer or the `AgentError` it raised, in the order of `moves`."""
    gate = asyncio.Semaphore(rt.settings.agent_concurrency)

    async def one(move: Move) -> SwitchResult | AgentError:
        if move.address is None:
            return AgentUnavailable(move.node, "NO_ADDRESS", "the node agent pod has no IP")
        async with gate:
            try:
                if move.mode is SwitchMode.IN_PLACE:
                    return await rt.agents.switch_phase(move.address, move.target, move.generation)
                return await rt.agents.switch_phase(
                    move.address, move.target, move.generation, mode=move.mode, relaunch_s=move.relaunch_s
                )
            except AgentError as exc:
                return exc

    return list(await asyncio.gather(*(one(m) for m in moves)))


async def place(rt: Runtime, body: Mapping[str, Any], nodes: Sequence[NodeStatus], placement: Placement) -> PlaceResult:
    """Call `SwitchPhase` for every move at once; record the switched nodes, one event each."""
    out = list(nodes)
    failures = []
    results = await call_moves(rt, placement.moves)
    for move, result in zip(placement.moves, results, strict=True):
        if isinstance(result, AgentError):
            state = NodeState.UNREACHABLE if isinstance(result, AgentUnavailable) else NodeState.SERVING
            out = switch_plan.mark(out, [move.node], state)
            failures.append((move, result))
            continue
        out = switch_plan.apply_move(out, move)
        rt.events(body, "Normal", PHASE_SWITCHED, _message(move, result))
    return PlaceResult(out, placement, tuple(failures))
