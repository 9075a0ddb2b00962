"""The planner interface: what every planner reads (`PlannerObservation`) and returns (`PlannerDecision`).

A planner is called every `interval_s` seconds of (virtual or wall) time with an observation and `now`, and
returns a decision: a full target split or None (keep the split), the way the switch must be applied, and
diagnostics saying why. Planners hold no clock; the only state they may keep is their own bookkeeping
(for example a seeded random generator for relaunch durations).

Boundary: data types and the Protocol only; the planners live in `ours`, `dynamo`, `arrow`, `static`, and the
registry in `registry`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from evolving_infra.core.types import NodeId, Phase, SwitchMode  # SwitchMode lives in the core: node agents apply it too
from evolving_infra.router.planner.diagnostics import Diagnostics
from evolving_infra.router.planner.throughput import NodeModel
from evolving_infra.router.planner.window import SliceStats


class PlannerName(enum.Enum):
    """The planners a cluster or simulation may select."""

    OURS = "ours"
    DYNAMO = "dynamo"
    ARROW = "arrow"
    STATIC = "static"


class Outcome(enum.Enum):
    """What a decision amounts to."""

    SWITCH = "switch"
    HOLD = "hold"
    SKIPPED_SWITCH_IN_FLIGHT = "skipped_switch_in_flight"
    SKIPPED_COOLDOWN = "skipped_cooldown"


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """Momentary per-node signals that the queue-driven baselines read (filled from engine reports).

    queued_prefill_tokens: prompt tokens waiting in the node's prefill queue (as the engine counts them);
    context_length: the model's maximum context length in tokens; decode_kv_tokens: KV tokens of the decode
    requests scheduled on the node plus those queued for it; kv_capacity_tokens: the node's KV capacity in
    tokens; queued_prefill_inputs: full input length t_in of each request queued (and running) for prefill
    on the node, in queue order; decode_requests: requests running plus queued in decode on the node.
    """

    queued_prefill_tokens: int = 0
    context_length: int = 131_072
    decode_kv_tokens: int = 0
    kv_capacity_tokens: int = 1
    queued_prefill_inputs: tuple[int, ...] = ()
    decode_requests: int = 0

    def __post_init__(self) -> None:
        if self.context_length <= 0 or self.kv_capacity_tokens <= 0:
            raise ValueError(
                f"context_length and kv_capacity_tokens must be > 0, got {self.context_length}, "
                f"{self.kv_capacity_tokens}"
            )
        counts = (self.queued_prefill_tokens, self.decode_kv_tokens, self.decode_requests, *self.queued_prefill_inputs)
        if min(counts) < 0:
            raise ValueError(f"node load counts must be >= 0, got {self}")

    @property
    def prefill_ratio(self) -> float:
        """Queued prefill tokens per context length (Dynamo's prefill load signal)."""
        return self.queued_prefill_tokens / self.context_length

    @property
    def kv_utilization(self) -> float:
        """(Scheduled + queued decode KV tokens) / KV capacity (Dynamo's decode load signal)."""
        return self.decode_kv_tokens / self.kv_capacity_tokens


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A node's phase, whether a switch of it is in flight (draining or relaunching), and a hint of how costly
    it is to move it now (lower moves first, e.g. its running requests)."""

    phase: Phase
    switching: bool = False
    move_cost: float = 0.0


def _frozen(mapping: Mapping[NodeId, object]) -> Mapping[NodeId, object]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class PlannerObservation:
    """Everything any planner may read at a decision point.

    nodes: phase and switch state of every node of the cluster; last_switch_end: when the last switch
    completed (None if never); slices: the completed slices of the planning window, oldest first; models:
    per-node iteration-time models (ours, Arrow); load: momentary per-node signals (Dynamo, Arrow);
    active_kv_pages: the KV pages of the active branches' contexts (distinct pages of their paths), None if
    unknown; kv_pages: per node, the KV pages its GPU and host memory hold together (empty if unknown).
    Ours reads the last two to refuse a move towards decode whose prefill nodes could not hold the active
    contexts (docs/planner.md, "A split whose prefill nodes cannot hold the active contexts").
    """

    nodes: Mapping[NodeId, NodeStatus]
    last_switch_end: float | None = None
    slices: Sequence[SliceStats] = ()
    models: Mapping[NodeId, NodeModel] = field(default_factory=dict)
    load: Mapping[NodeId, NodeLoad] = field(default_factory=dict)
    active_kv_pages: int | None = None
    kv_pages: Mapping[NodeId, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a planner observation needs at least one node")
        if self.active_kv_pages is not None and not self.active_kv_pages >= 0:
            raise ValueError(f"active_kv_pages must be >= 0, got {self.active_kv_pages}")
        if any(not v > 0 for v in self.kv_pages.values()):
            raise ValueError(f"every node's kv_pages must be > 0, got {dict(self.kv_pages)}")
        object.__setattr__(self, "kv_pages", _frozen(self.kv_pages))
        object.__setattr__(self, "nodes", _frozen(self.nodes))
        object.__setattr__(self, "slices", tuple(self.slices))
        object.__setattr__(self, "models", _frozen(self.models))
        object.__setattr__(self, "load", _frozen(self.load))

    @property
    def phases(self) -> dict[NodeId, Phase]:
        return {n: s.phase for n, s in self.nodes.items()}

    @property
    def move_costs(self) -> dict[NodeId, float]:
        return {n: s.move_cost for n, s in self.nodes.items()}

    @property
    def switching(self) -> tuple[NodeId, ...]:
        return tuple(sorted(n for n, s in self.nodes.items() if s.switching))

    def load_of(self, node: NodeId) -> NodeLoad:
        if node not in self.load:
            raise ValueError(f"no load signals for node {node!r}; signals exist for {sorted(self.load)}")
        return self.load[node]

    def model_of(self, node: NodeId) -> NodeModel:
        if node not in self.models:
            raise ValueError(f"no node model for node {node!r}; models exist for {sorted(self.models)}")
        return self.models[node]


@dataclass(frozen=True, slots=True)
class PlannerDecision:
    """A planner's answer. `target` is the full split to apply (None: keep the current one); `mode` is how a
    switch is applied; `relaunch_s` the downtime of each moved node under RELAUNCH (0 otherwise);
    `diagnostics` is the planner's own record of why (a dataclass per planner)."""

    target: Mapping[NodeId, Phase] | None
    mode: SwitchMode
    outcome: Outcome
    reason: str
    diagnostics: Diagnostics
    relaunch_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.target is not None) != (self.outcome is Outcome.SWITCH):
            raise ValueError(f"a decision has a target exactly when its outcome is SWITCH; got {self.outcome}")
        if self.relaunch_s < 0 or (self.relaunch_s > 0 and self.mode is not SwitchMode.RELAUNCH):
            raise ValueError(f"relaunch_s must be >= 0 and only set for RELAUNCH, got {self.relaunch_s}")
        if self.target is not None:
            object.__setattr__(self, "target", _frozen(self.target))


class Planner(Protocol):
    """A phase-split planner, called every `interval_s` seconds."""

    @property
    def name(self) -> PlannerName: ...

    @property
    def interval_s(self) -> float: ...

    def decide(self, observation: PlannerObservation, now: float) -> PlannerDecision: ...


@runtime_checkable
class CheckingPlanner(Protocol):
    """A planner that also checks, between its decisions, whether a premise of its last switch still holds.

    `check_interval_s`: how often (None: never); `check`: None while the premise holds, else a decision to apply
    at once (ours: the prefill headroom a move towards decode was allowed on, docs/planner.md)."""

    @property
    def check_interval_s(self) -> float | None: ...

    def check(self, observation: PlannerObservation, now: float) -> PlannerDecision | None: ...
