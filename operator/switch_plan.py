"""The phase-switch protocol's decisions: which nodes to switch, with which generation, and how to undo it.

The router writes `status.targetSplit` with a switch generation `g` (the epoch) and, optionally, the nodes
that move. The operator switches each moving node through its agent's `SwitchPhase(target, g)`; a node
that has done so records `switchGeneration == g`, which is how a retried attempt knows which nodes are
already done (their current phase is the wanted one) and never switches a node twice. A switch that
cannot complete is undone with generation `g + 1` on exactly the nodes that recorded `g`.

Invariants:
- every plan reaches the target's counts (or names the problem and moves nothing);
- a target whose generation is older than some node's (or 0, which no target may use) is stale and
  moves nothing;
- without a `moving` list, the nodes that move are the fewest that reach the counts, reachable nodes
  first, then by name (deterministic);
- a rollback returns precisely the nodes this target switched to their phase before it.

Boundary: pure; `reconcile` calls the agents and writes status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from evolving_infra.core.types import Phase, SwitchMode
from evolving_infra.operator.status import NodeState, NodeStatus, TargetSplit, format_split


def flip(phase: Phase) -> Phase:
    return Phase.DECODE if phase is Phase.PREFILL else Phase.PREFILL


@dataclass(frozen=True, slots=True)
class Move:
    """One node to switch: from `source` to `target` with `generation`, the way `mode` says (the target split's
    mode and relaunch downtime; placements and rollbacks switch in place)."""

    node: str
    address: str | None
    source: Phase
    target: Phase
    generation: int
    mode: SwitchMode = SwitchMode.IN_PLACE
    relaunch_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SwitchPlan:
    """What to do for one target: `moves` still to make; `problems` when the target cannot be reached."""

    split: str
    generation: int
    moves: tuple[Move, ...] = ()
    problems: tuple[str, ...] = ()
    stale: bool = False
    switched: tuple[str, ...] = field(default=())
    """Nodes that already applied this target (earlier attempts)."""

    @property
    def done(self) -> bool:
        return not self.moves and not self.problems and not self.stale


def _choose(nodes: Sequence[NodeStatus], target: TargetSplit, generation: int) -> dict[str, Phase]:
    wanted = {n.name: n.phase for n in nodes}
    prefill = sum(1 for p in wanted.values() if p is Phase.PREFILL)
    need = target.prefill - prefill
    source = Phase.DECODE if need > 0 else Phase.PREFILL
    candidates = sorted(
        (n for n in nodes if n.phase is source and n.switch_generation != generation),
        key=lambda n: (n.state is NodeState.UNREACHABLE, n.name),
    )
    for node in candidates[: abs(need)]:
        wanted[node.name] = flip(source)
    return wanted


def plan_switch(nodes: Sequence[NodeStatus], target: TargetSplit) -> SwitchPlan:
    """The moves that take `nodes` to `target` (see the module docstring)."""
    g = target.switch_generation
    base = SwitchPlan(split=target.split, generation=g)
    if g < 1:
        reason = f"target {target.split} has switch generation {g}; 0 means never switched, targets start at 1"
        return SwitchPlan(split=target.split, generation=g, stale=True, problems=(reason,))
    newer = sorted(n.name for n in nodes if n.switch_generation > g)
    if newer:
        return SwitchPlan(
            split=target.split,
            generation=g,
            stale=True,
            problems=(f"target {target.split} has switch generation {g}, older than node(s) {', '.join(newer[:5])}",),
        )
    if target.prefill + target.decode != len(nodes):
        return SwitchPlan(
            split=target.split,
            generation=g,
            problems=(f"target {target.split} has {target.prefill + target.decode} nodes, the cluster tracks {len(nodes)}",),
        )
    if target.split != format_split(target.prefill, target.decode):
        return SwitchPlan(split=target.split, generation=g, problems=(f"target split {target.split} disagrees with its counts",))
    by_name = {n.name: n for n in nodes}
    if target.moving:
        unknown = sorted(set(target.moving) - set(by_name))
        if unknown:
            return SwitchPlan(split=target.split, generation=g, problems=(f"target moves unknown node(s): {', '.join(unknown[:5])}",))
        wanted = {n.name: n.phase for n in nodes}
        for name in target.moving:
            node = by_name[name]
            wanted[name] = node.phase if node.switch_generation == g else flip(node.phase)
    else:
        wanted = _choose(nodes, target, g)
    reached = sum(1 for p in wanted.values() if p is Phase.PREFILL)
    if reached != target.prefill:
        return SwitchPlan(
            split=target.split,
            generation=g,
            problems=(f"moving {', '.join(target.moving[:5])} gives {format_split(reached, len(nodes) - reached)}, not {target.split}",),
        )
    moves = tuple(
        Move(name, by_name[name].address, by_name[name].phase, phase, g, target.mode, target.relaunch_seconds)
        for name, phase in sorted(wanted.items())
        if phase is not by_name[name].phase
    )
    switched = tuple(sorted(n.name for n in nodes if n.switch_generation == g))
    return SwitchPlan(split=base.split, generation=g, moves=moves, switched=switched)


def plan_rollback(nodes: Sequence[NodeStatus], generation: int) -> tuple[Move, ...]:
    """Switch every node that applied `generation` back, with `generation + 1`."""
    return tuple(
        Move(n.name, n.address, n.phase, flip(n.phase), generation + 1)
        for n in sorted(nodes, key=lambda n: n.name)
        if n.switch_generation == generation
    )


def apply_move(nodes: Sequence[NodeStatus], move: Move, state: NodeState = NodeState.SERVING) -> list[NodeStatus]:
    """`nodes` with `move` done: the node serves its target phase and records the move's generation."""
    return [
        n.model_copy(update={"phase": move.target, "state": state, "switch_generation": move.generation})
        if n.name == move.node
        else n
        for n in nodes
    ]


def mark(nodes: Sequence[NodeStatus], names: Sequence[str], state: NodeState) -> list[NodeStatus]:
    chosen = set(names)
    return [n.model_copy(update={"state": state}) if n.name in chosen else n for n in nodes]
