"""The mutable state of one simulated cluster, shared by the event handlers (`flow`, `stepping`, `phases`).

One `ClusterState` holds the pure objects the live services also drive: the engine cores, the router core
(`RouterCore`: KV directory, branch table, routing policies, planner window, the router's record of nodes and
requests) and the planner, plus the simulator's own bookkeeping: requests in flight (`SimRequest`, the router's
`RoutedRequest` plus measured times), per-node driver state (`SimNode`, the router's `NodeTrack` plus the engine,
step scheduling and busy-time spans) and the records of the run.

Invariant: every request in `requests` is in exactly one stage, and a node's `step_at` is set exactly when a
step event for it is pending.

Boundary: state, small queries and the two cross-cutting chores every handler needs: scheduling a node's next
step (`kick`) and forwarding KV events to the directory and counts to the engines (`absorb`).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evolving_infra.core.kv_events import KvEvent
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, NodeMode, Phase
from evolving_infra.node_agent.engine import EngineCore, FetchRun
from evolving_infra.router.branches import BranchTable
from evolving_infra.router.core import NodeTrack, PoolSnapshot, PushCounts, RoutedRequest, RouterCore
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.planner import SliceRecorder
from evolving_infra.sim.kernel import Cancel, Command, Event, Kernel, Priority
from evolving_infra.sim.records import NodeSpan, RequestRecord, SplitRecord, SwitchRecord
from evolving_infra.sim.replay import RequestSpec

if TYPE_CHECKING:
    from evolving_infra.sim.quiet import QuietRun


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


@dataclass(eq=False, kw_only=True)
class SimRequest(RoutedRequest):
    """One request in flight: the router's record (`RoutedRequest`) plus what the simulator measures."""

    spec: RequestSpec
    generated: tuple[PageHash, ...]
    issued: float
    since: float
    stage: Stage = Stage.PREFILL
    queued: float | None = None
    prefill_start: float | None = None
    first_token: float | None = None
    fetch: tuple[FetchRun, ...] = ()
    fetched: int = 0
    cached: int = 0


@dataclass(eq=False, kw_only=True)
class SimNode(NodeTrack):
    """One node: the router's record (`NodeTrack`) plus the driver's state (the engine itself is `engine`;
    None while a relaunch runs)."""

    engine: EngineCore | None
    strand_on_switch: bool = False
    switch_decided: float = 0.0
    switch_from: Phase | None = None
    step_at: float | None = None
    iterating: bool = False
    span_start: float = 0.0
    span_phase: Phase | None = None
    busy: float = 0.0
    carry: float = 0.0
    step_token: tuple[str, NodeId] = field(init=False)
    """Names the node's pending step event for cancellation (`kick`, `wake_at`)."""
    quiet: QuietRun | None = field(default=None, init=False, repr=False)
    """The quiet decode iterations the node is running as one event (`sim.quiet`); None when it runs none."""
    quiet_token: tuple[str, NodeId] = field(init=False)
    step_label: str = field(init=False)
    end_label: str = field(init=False)
    _snapshot: tuple[object, PoolSnapshot] | None = field(default=None, init=False, repr=False)
    """The last `current_pool` and the engine's pool gauges it was made from."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.step_token = ("step", self.id)
        self.quiet_token = ("quiet", self.id)
        self.step_label = f"step {self.id}"
        self.end_label = f"end {self.id}"

    def current_mode(self) -> NodeMode | None:
        return None if self.engine is None else self.engine.mode

    def current_pool(self) -> PoolSnapshot | None:
        engine = self.engine
        if engine is None:
            return None
        g = engine.pool.gauges()  # immutable, and the same object while nothing changed: so is the snapshot
        last = self._snapshot
        if last is None or last[0] is not g or last[1].page_tokens != engine.profile.page_tokens:
            snapshot = PoolSnapshot(engine.profile.page_tokens, g.l1.free, g.l1.cached, g.l1.pinned, g.l2.cached, g.l2.pinned)
            last = self._snapshot = (g, snapshot)
        return last[1]

    def current_room_tokens(self) -> int:
        """`current_pool().room_tokens`, read from the engine's GPU tier without the gauges (every decode binding
        reads it for every decode node)."""
        engine = self.engine
        return 0 if engine is None else engine.pool.l1.room() * engine.profile.page_tokens


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
    failed_fetches: int = 0
    """Fetch runs that found some of their pages evicted at the source when they landed (recomputed)."""
    failed_fetch_tokens: int = 0
    peak_transfers: int = 0
    """Most fetches and KV transfers in flight at once over the links (`sim.links`)."""
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
    core: RouterCore
    replayer: Any
    content: Any
    trace: Any
    parents: dict[str, str]
    pause: Any = None
    make_engine: Callable[[NodeId, NodeMode], EngineCore] | None = None
    control: Any = None
    """The cluster's control core (`ControlCore`): warmup, models, planner, switch orders."""
    disaggregated_at: float | None = None
    requests: dict[str, SimRequest] = field(default_factory=dict)
    wait_bind: deque[SimRequest] = field(default_factory=deque)
    parked: deque[SimRequest] = field(default_factory=deque)
    """Requests with no node accepting prefill right now (retried when a switch or relaunch completes)."""
    programs: dict[str, Any] = field(default_factory=dict)
    held: dict[str, list[SimRequest]] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    switches: list[SwitchRecord] = field(default_factory=list)
    splits: list[SplitRecord] = field(default_factory=list)
    spans: list[NodeSpan] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """The planner's switches (`planner_switch_decisions` in the metrics)."""
    holds: list[dict[str, Any]] = field(default_factory=list)
    """Our planner's holds after weighing candidates (`planner_hold_decisions`): why it did not move."""
    stats: RunStats = field(default_factory=RunStats)
    on_step: Callable[[Event], list[Command]] | None = None
    on_iteration_end: Callable[[Event], list[Command]] | None = None
    """The handler of iteration-end events (made once by `stepping`)."""
    on_quiet_end: Callable[[Event], list[Command]] | None = None
    """The handler of the events that end quiet decode runs (made once by `stepping`)."""
    inline_steps: bool = True
    """Whether `sim.run` lets a node's next step run at once where the kernel allows (off: the reference
    behaviour, every step through the queue; the same results, checked by a test)."""
    quiet_runs: bool = True
    """Whether a decode node's quiet iterations may run as one event (`sim.quiet`; needs `kernel`); off: each
    iteration stepped, the same results (checked by a test)."""
    kernel: Kernel | None = None
    """The kernel running this cluster (`sim.run`), asked by `stepping` whether a node's next step may run at
    once (`Kernel.run_inline`); None: every step goes through the queue."""
    scored_end: float | None = None
    links: Any = None
    """The fetches and KV transfers in flight (`sim.links.LinkModel`), made by `sim.flow` on first use."""

    @property
    def collocated(self) -> bool:
        """Whether the collocated warmup runs (every node serves both phases)."""
        return self.control is not None and self.control.warming_up

    # -- the router core's parts ---------------------------------------------------------------------
    @property
    def directory(self) -> KvDirectory:
        return self.core.directory

    @property
    def branches(self) -> BranchTable:
        return self.core.branches

    @property
    def router(self) -> Any:
        return self.core.router

    @property
    def binder(self) -> Any:
        return self.core.binder

    @property
    def recorder(self) -> SliceRecorder | None:
        return self.core.recorder

    # -- queries -------------------------------------------------------------------------------------
    def node_ids(self) -> list[NodeId]:
        return list(self.nodes)

    def accepting(self, phase: Phase) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.accepts(phase)]

    def split_now(self) -> tuple[int, int]:
        """(prefill, decode) nodes serving a phase now (relaunching and collocated nodes excluded)."""
        return self.core.split_now()

    def record_split(self, now: float) -> None:
        p, d = self.split_now()
        c = self.core.collocated_now()
        last = self.splits[-1] if self.splits else None
        if last is None or (last.prefill, last.decode, last.collocated) != (p, d, c):
            self.splits.append(SplitRecord(now, p, d, c))


def kick(state: ClusterState, node: SimNode, now: float) -> list[Command]:
    """Make sure `node` steps at `now` (or when its running iteration ends)."""
    if node.engine is None or node.iterating or state.on_step is None:
        return []
    pending = node.step_at
    if pending is not None and pending <= now:
        return []
    node.step_at = now
    token = node.step_token
    step = Event(now, Priority.SCHEDULE, state.on_step, node.step_label, token, node.id)  # (positional: the hot path)
    return [step] if pending is None else [Cancel(token), step]  # no step pending: nothing to cancel


def wake_at(state: ClusterState, node: SimNode, at: float) -> list[Command]:
    """An idle node steps again at `at` (a load finishing) unless something wakes it sooner."""
    if node.engine is None or state.on_step is None:
        return []
    node.step_at = at
    return [Event(at, Priority.SCHEDULE, state.on_step, label=f"wake {node.id}", token=node.step_token, payload=node.id)]


def absorb(state: ClusterState, node: NodeId, events: tuple[KvEvent, ...]) -> None:
    """KV events of `node` to the directory; host removals to the branch counts; counts back to the engines."""
    if events:
        apply_counts(state, state.core.absorb(events))


def push_counts(state: ClusterState) -> None:
    """Send every changed branch count to its node's engine (`take_updates` -> `set_counts`)."""
    apply_counts(state, state.core.take_counts())


def apply_counts(state: ClusterState, pushes: Iterable[PushCounts]) -> None:
    """Carry out the core's count pushes (a relaunching node has no engine to take them)."""
    for push in pushes:
        engine = state.nodes[push.node].engine
        if engine is not None:
            engine.set_counts(push.counts)
