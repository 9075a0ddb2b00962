"""What a `SwitchPhase(target, generation)` call does, decided from the node's switch generation.

The generation is the operator's switch epoch. Rules, in order:
0. `generation` > MAX_GENERATION (2^53 - 1), or more than MAX_GENERATION_STEP above the node's generation:
   INVALID (refused, INVALID_ARGUMENT). So no caller can push a node to a generation from which the next
   one (max + 1, as the router and the operator compute it) overflows, or far enough that honest switches
   could never catch up.
1. `generation` < the node's generation: STALE (refused, FAILED_PRECONDITION).
2. A switch is draining: the same (target, generation) JOINs it (waits for it, hands nothing back
   twice); anything else is BUSY (ABORTED: retry once it completes).
3. `generation` == the node's generation, set by an earlier switch call: if the node serves exactly
   `target`, ALREADY (a repeat: nothing changes); otherwise CONFLICT (that generation already named
   another phase; FAILED_PRECONDITION).
4. Otherwise (a newer generation, or the node's initial generation 0 never used by a call): if the node
   already serves exactly `target`, ADOPT (record the generation, nothing to switch); else SWITCH.

Invariant: a generation, once used, names one phase on this node; generations never decrease, never exceed
MAX_GENERATION, and one call raises them by at most MAX_GENERATION_STEP.

Boundary: a pure decision over plain values; the servicer carries it out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.node_agent.api.limits import MAX_GENERATION


MAX_GENERATION_STEP = 1_000_000
"""Most one switch call may raise a node's generation (a node left behind by a million switches of other
nodes still catches up in one call; a forged huge generation is refused)."""


class SwitchAction(enum.Enum):
    INVALID = "invalid"
    SWITCH = "switch"
    ADOPT = "adopt"
    ALREADY = "already"
    JOIN = "join"
    STALE = "stale"
    CONFLICT = "conflict"
    BUSY = "busy"


@dataclass(frozen=True, slots=True)
class Generation:
    """The node's switch generation and whether a switch call set it (False: the initial 0)."""

    value: int = 0
    used: bool = False


@dataclass(frozen=True, slots=True)
class SwitchDecision:
    action: SwitchAction
    message: str = ""


def decide_switch(
    gen: Generation,
    mode: NodeMode,
    draining: tuple[Phase, int] | None,
    target: Phase,
    generation: int,
    node: str = "node",
) -> SwitchDecision:
    """The action for `SwitchPhase(target, generation)` (rules in the module docstring)."""
    if generation > MAX_GENERATION:
        return SwitchDecision(SwitchAction.INVALID, f"node {node}: switch generation {generation} exceeds {MAX_GENERATION}")
    if generation > gen.value + MAX_GENERATION_STEP:
        return SwitchDecision(
            SwitchAction.INVALID,
            f"node {node}: switch generation {generation} is more than {MAX_GENERATION_STEP} above the node's "
            f"generation {gen.value}",
        )
    if generation < gen.value:
        return SwitchDecision(
            SwitchAction.STALE,
            f"node {node}: switch generation {generation} is older than the node's generation {gen.value}",
        )
    if draining is not None:
        if draining == (target, generation):
            return SwitchDecision(SwitchAction.JOIN)
        phase, g = draining
        return SwitchDecision(
            SwitchAction.BUSY,
            f"node {node} is draining its switch to {phase.value} (generation {g}); retry once it completes",
        )
    serves_exactly = mode is NodeMode.of(target)
    if generation == gen.value and gen.used:
        if serves_exactly:
            return SwitchDecision(SwitchAction.ALREADY)
        return SwitchDecision(
            SwitchAction.CONFLICT,
            f"node {node}: generation {generation} already switched it to {mode.value}; "
            f"a switch to {target.value} needs a newer generation",
        )
    return SwitchDecision(SwitchAction.ADOPT if serves_exactly else SwitchAction.SWITCH)
