"""The phase-switch state machine of one node.

    SERVING --begin--> DRAINING --(no old-phase work runs)--> SWITCHED --begin--> DRAINING ...

- `begin`: the node stops taking work of the phases its new mode does not serve (refused with
  `WrongPhase`), hands its queued work of those phases back to the caller, and refuses work of the new
  phase (`SwitchInProgress`) until the switch completes. Work of a phase both modes serve (a collocated
  node switching to one phase keeps that phase) is still accepted.
- Running work of the old phases finishes in place; when none is left (the drain) the node runs nothing
  for the profile's `switch_latency` (`ready_at`), then the switch completes: the node serves its new mode. The engine then releases L1 to L2 (write-through means nothing is lost) and
  leaves L2 untouched.

Boundary: states, the refusal rules and the report; what counts as "old-phase work" is the engine's.
"""

from __future__ import annotations

from evolving_infra.core.types import NodeId, NodeMode, Phase
from evolving_infra.node_agent.engine.errors import SwitchInProgress, WrongPhase
from evolving_infra.node_agent.engine.outputs import SwitchReport, SwitchState


def serves(mode: NodeMode, phase: Phase) -> bool:
    """Whether a node in `mode` serves `phase` (collocated serves both)."""
    return mode is NodeMode.COLLOCATED or mode.value == phase.value


class PhaseSwitch:
    """Mode and switch state of one node."""

    def __init__(self, node: NodeId, mode: NodeMode) -> None:
        self.node = node
        self.mode = mode
        self.state = SwitchState.SERVING
        self.target: NodeMode | None = None
        self.began = 0.0
        self.handed_back = 0
        self.last: SwitchReport | None = None
        self.ready_at: float | None = None  # drained: the switch completes at this time

    @property
    def draining(self) -> bool:
        return self.state is SwitchState.DRAINING

    def old_phases(self) -> tuple[Phase, ...]:
        """Phases being drained (served now, not by the target); empty when not draining."""
        if self.target is None or not self.draining:
            return ()
        return tuple(p for p in Phase if serves(self.mode, p) and not serves(self.target, p))

    def local_decode_ok(self) -> bool:
        """Whether a prefill finished now may decode on this node (collocated, not switching to prefill)."""
        if self.mode is not NodeMode.COLLOCATED:
            return False
        return not self.draining or self.target is NodeMode.DECODE

    def check_accepts(self, phase: Phase) -> None:
        """Raise unless work of `phase` may be submitted now."""
        if self.draining and self.target is not None:
            if not serves(self.target, phase):
                raise WrongPhase(
                    f"node {self.node} is switching from {self.mode.value} to {self.target.value}: "
                    f"{phase.value} work is refused; send it to another {phase.value} node"
                )
            if not serves(self.mode, phase):
                raise SwitchInProgress(
                    f"node {self.node} is still draining its switch to {self.target.value}: "
                    f"{phase.value} work is accepted once the switch completes"
                )
            return
        if not serves(self.mode, phase):
            raise WrongPhase(f"node {self.node} serves {self.mode.value}: {phase.value} work is refused")

    def begin(self, target: Phase, now: float) -> NodeMode:
        if self.draining:
            raise SwitchInProgress(
                f"node {self.node} is already switching to {self.target.value if self.target else '?'}; "
                "wait for that switch to complete"
            )
        new = NodeMode.of(target)
        if new is self.mode:
            raise ValueError(f"node {self.node} already serves {new.value}; nothing to switch")
        self.target = new
        self.state = SwitchState.DRAINING
        self.began = now
        self.handed_back = 0
        self.ready_at = None
        return new

    def complete(self, now: float) -> SwitchReport:
        assert self.target is not None
        report = SwitchReport(self.node, self.mode, self.target, self.began, now, self.handed_back)
        self.mode = self.target
        self.target = None
        self.state = SwitchState.SWITCHED
        self.ready_at = None
        self.last = report
        return report
