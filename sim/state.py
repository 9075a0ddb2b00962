"""The mutable state of one simulated cluster, shared by the event handlers (`flow`, `stepping`, `phases`).

One `ClusterState` holds the pure objects the live services also drive (engine cores, KV directory, branch
table, router, decode binder, planner, slice recorder, model fitters) plus the simulator's own bookkeeping:
requests in flight (`SimRequest`), per-node driver state (`SimNode`: step scheduling, what the router sent and
the node's last report, decode jobs, reservations, spans) and the records of the run.

Invariant: every request in `requests` is in exactly one stage, and a node's `step_at` is set exactly when a
step event for it is pending.

Boundary: state, small queries and the two cross-cutting chores every handler needs: scheduling a node's next
step (`kick`) and forwarding KV events to the directory and counts to the engines (`absorb`).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evolving_infra.core.kv_events import KvEvent, KvRemoved
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, NodeMode, Phase, Tier, Work
from evolving_infra.node_agent.engine import EngineCore, FetchRun
from evolving_infra.node_agent.engine.switch import serves
from evolving_infra.router.fitting import ModelFitter, UsageCounts
from evolving_infra.router.routing import QueuedPrefill, RouteRequest, RunningPrefill
from evolving_infra.sim.kernel import Cancel, Command, Event, Priority
from evolving_infra.sim.records import NodeSpan, RequestRecord, SplitRecord, SwitchRecord
from evolving_infra.sim.replay import RequestSpec


class Stage(enum.Enum):
    HELD = "held"
    """Issued, but its agent is paused (pause rule)."""
    WAIT_RESERVATION = "wait-reservation"
    """Routed; waits for decode KV to be reserved before its prefill may be queued (SGLang, D.1)."""
    PREFILL = "prefill"
    """Queued or running at its prefill node."""
    WAIT_BIND = "wait-bind"
    """Prefill started or finished, but no decode node had KV room yet."""
    TRANSFER = "transfer"
    """Prefill finished; KV on its way to the decode node."""
    DECODE = "decode"


@dataclass(eq=False)
class SimRequest:
    """One request in flight and everything the handlers learned about it."""

    spec: RequestSpec
    route: RouteRequest
    prompt_pages: tuple[PageHash, ...]
    generated: tuple[PageHash, ...]
    version: int
    issued: float
    since: float
    stage: Stage = Stage.PREFILL
    attempt: int = 0
    prefill_node: NodeId | None = None
    decode_node: NodeId | None = None
    queued: float | None = None
    prefill_start: float | None = None
    first_token: float | None = None
    prefill_done: bool = False
    routed_cached: int = 0
    routed_restore: int = 0
    fetch: tuple[FetchRun, ...] = ()
    fetched: int = 0
    cached: int = 0
    reserved: int = 0

    @property
    def id(self) -> str:
        return self.spec.id

    def queued_view(self) -> QueuedPrefill:
        """The request as the router records it: its routed work."""
        cached = self.routed_cached
        work = Work(self.route.prompt_tokens - cached, cached, self.route.output_tokens, self.route.t_acc)
        return QueuedPrefill(self.spec.id, work, min(self.routed_restore, cached))  # type: ignore[arg-type]


@dataclass(eq=False)
class SimNode:
    """Driver-side state of one node (the engine itself is `engine`; None while a relaunch runs)."""

    id: NodeId
    engine: EngineCore | None
    phase: Phase | None
    """Phase served; None while collocated (warmup) or relaunching."""
    target: NodeMode | None = None
    """Mode being switched to (draining or relaunching); None otherwise."""
    strand_on_switch: bool = False
    switch_decided: float = 0.0
    switch_from: Phase | None = None
    step_at: float | None = None
    iterating: bool = False
    sent: dict[str, SimRequest] = field(default_factory=dict)
    """Prefill requests sent to the node whose prefill has not finished, in sending order."""
    report_time: float | None = None
    report_running: tuple[RunningPrefill, ...] = ()
    report_queue: tuple[QueuedPrefill, ...] = ()
    report_ids: frozenset[str] = frozenset()
    decode_jobs: dict[str, SimRequest] = field(default_factory=dict)
    """Decode requests submitted here and not finished."""
    bound: dict[str, SimRequest] = field(default_factory=dict)
    """Requests bound to this decode node whose KV has not been submitted here yet."""
    reserved_tokens: int = 0
    """KV tokens of `bound` requests (taken from the room offered to new bindings)."""
    prealloc: deque[SimRequest] = field(default_factory=deque)
    """Requests bound at routing that wait for their KV reservation here (SGLang's pre-allocation)."""
    fitter: ModelFitter | None = None
    usage: UsageCounts = field(default_factory=UsageCounts)
    span_start: float = 0.0
    span_phase: Phase | None = None
    busy: float = 0.0
    carry: float = 0.0

    def accepts(self, phase: Phase) -> bool:
        """Whether new work of `phase` may be sent now (mirrors the engine's refusal rules)."""
        if self.engine is None:
            return False
        mode = self.engine.mode
        if self.target is None:
            return serves(mode, phase)
        return serves(self.target, phase) and serves(mode, phase)

    @property
    def serving(self) -> bool:
        return self.engine is not None

    @property
    def draining(self) -> bool:
        return self.engine is not None and self.target is not None


@dataclass
class RunStats:
    """Counters of what the driver did, reported with the metrics."""

    events: int = 0
    issued: int = 0
    finished: int = 0
    rerouted: int = 0
    aborted_by_relaunch: int = 0
    rebound: int = 0
    fetches: int = 0
    fetched_tokens: int = 0
    planner_ticks: int = 0
    planner_switches: int = 0
    pauses: int = 0
    resumes: int = 0
    bind_waits: int = 0
    reservation_waits: int = 0
    fit_messages: list[str] = field(default_factory=list)


@dataclass(eq=False)
class ClusterState:
    """Everything the handlers share (see the module docstring)."""

    cfg: Any
    profile: Any
    nodes: dict[NodeId, SimNode]
    directory: Any
    branches: Any
    router: Any
    binder: Any
    planner: Any
    replayer: Any
    content: Any
    trace: Any
    parents: dict[str, str]
    pause: Any = None
    recorder: Any = None
    router_models: dict[NodeId, Any] = field(default_factory=dict)
    fitted: dict[NodeId, Any] = field(default_factory=dict)
    """Frozen warmup fits (models FITTED), the base that t̄_n and f_n are remeasured on."""
    make_engine: Callable[[NodeId, NodeMode], EngineCore] | None = None
    planner_models: dict[NodeId, Any] = field(default_factory=dict)
    collocated: bool = False
    disaggregated_at: float | None = None
    requests: dict[str, SimRequest] = field(default_factory=dict)
    wait_bind: deque[SimRequest] = field(default_factory=deque)
    parked: deque[SimRequest] = field(default_factory=deque)
    """Requests with no node accepting prefill right now (retried when a switch or relaunch completes)."""
    decode_occupancy: int = 0
    last_switch_end: float | None = None
    programs: dict[str, Any] = field(default_factory=dict)
    held: dict[str, list[Any]] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    switches: list[SwitchRecord] = field(default_factory=list)
    splits: list[SplitRecord] = field(default_factory=list)
    spans: list[NodeSpan] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)
    on_step: Callable[[Event], list[Command]] | None = None
    scored_end: float | None = None

    # -- queries -------------------------------------------------------------------------------------
    def node_ids(self) -> list[NodeId]:
        return list(self.nodes)

    def accepting(self, phase: Phase) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.accepts(phase)]

    def split_now(self) -> tuple[int, int]:
        """(prefill, decode) nodes serving a phase now (relaunching and collocated nodes excluded)."""
        p = sum(1 for n in self.nodes.values() if n.serving and n.phase is Phase.PREFILL)
        d = sum(1 for n in self.nodes.values() if n.serving and n.phase is Phase.DECODE)
        return p, d

    def record_split(self, now: float) -> None:
        p, d = self.split_now()
        if not self.splits or (self.splits[-1].prefill, self.splits[-1].decode) != (p, d):
            self.splits.append(SplitRecord(now, p, d))


def kick(state: ClusterState, node: SimNode, now: float) -> list[Command]:
    """Make sure `node` steps at `now` (or when its running iteration ends)."""
    if node.engine is None or node.iterating or state.on_step is None:
        return []
    if node.step_at is not None and node.step_at <= now:
        return []
    node.step_at = now
    token = ("step", node.id)
    return [Cancel(token), Event(now, Priority.SCHEDULE, state.on_step, label=f"step {node.id}", token=token, payload=node.id)]


def wake_at(state: ClusterState, node: SimNode, at: float) -> list[Command]:
    """An idle node steps again at `at` (a load finishing) unless something wakes it sooner."""
    if node.engine is None or state.on_step is None:
        return []
    node.step_at = at
    token = ("step", node.id)
    return [Event(at, Priority.SCHEDULE, state.on_step, label=f"wake {node.id}", token=token, payload=node.id)]


def absorb(state: ClusterState, node: NodeId, events: tuple[KvEvent, ...]) -> None:
    """KV events of `node` to the directory; host removals to the branch counts; counts back to the engines."""
    if not events:
        return
    directory, branches = state.directory, state.branches
    for event in events:
        directory.apply(event)
        if isinstance(event, KvRemoved) and event.tier is Tier.HOST:
            branches.evicted(event.node, event.pages)
    push_counts(state)


def push_counts(state: ClusterState) -> None:
    """Send every changed branch count to its node's engine (`take_updates` -> `set_counts`)."""
    for node in state.nodes.values():
        updates = state.branches.take_updates(node.id)
        if updates and node.engine is not None:
            node.engine.set_counts(updates)
