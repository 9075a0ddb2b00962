"""`ControlCore`: the orchestration of one cluster, once, for the live router and the simulator.

The algorithms (directory, branch counts, routing, planners, fitting) are pure objects; this module is the pure
control flow around them. It takes typed events and returns typed effects; a driver (the simulator's kernel,
the live router's asyncio loop) only delivers events and carries out effects, and never assigns a field of
the core. Time is always an argument.

Life of a cluster (paper E.3):
1. `start(now)`: with a collocated warmup (`warmup_s > 0`), every node serves both phases; its iterations feed its
   model fitter; with `ModelOrigin.FITTED` the router prices prefills with provisional fits refreshed every
   `fit_interval_s`. Without a warmup the nodes serve their initial phases and the planner window starts now.
2. At `warmup_s` (a `Tick`): the fits are frozen into node models (`ModelsFrozen`; too few iterations keep the
   profile's models, with a message), the usage counts restart, the nodes leave the collocated mode for their
   initial phases (`SwitchOrder(initial=True)`, see "Leaving the warmup" below), the planner window starts.
3. Every planner interval after that (a `Tick`): t̄_n and f_n are remeasured from the window's usage counts,
   the planner decides on the core's observation (`PlannerDecided`), and a SWITCH becomes one `SwitchOrder` per
   moving node with a fresh switch generation; the router stops sending old-phase work to each at once. A planner
   that also checks between decisions (`CheckingPlanner`) is asked every `check_interval_s` on the current models
   (a check due with a decision is skipped); a decision it returns is applied as a decision is.
4. `SwitchCompleted`: the node serves its new phase; a planner switch's end starts the cooldown
   (`last_switch_end`); count changes are pushed.
5. `NodeJoined` / `NodeLost`: a node (re)joins with the phase it serves; a lost node's KV and counts are dropped.
6. `RequestFinished`: the measured output length and decode iterations of a finished request: the decode half
   of the planner's w̄ (no declared or traced output length is ever read for planning).

Leaving the warmup (`WarmupExit`). A collocated node ordered to prefill finishes its local decodes before it
prefills again, and a node ordered to decode stops prefilling at once, so ordering every node at the same instant
(`AT_ONCE`) leaves the prefill side with no node that prefills until the prefill-bound nodes have drained their
decodes (tens of seconds with long outputs). `STAGED` (the default) keeps prefill capacity up throughout:
- the decode-bound nodes stay collocated (they keep prefilling, as in the warmup) until every prefill-bound
  node serves prefill; then they are ordered to decode;
- the prefill-bound nodes move in two waves (the larger half first, in node order), so that at most half of
  them is out of prefill service at any time;
- a prefill-bound node goes through decode: it is first ordered to decode (its queued prefills are handed back
  and re-routed, its running prefill finishes) and, once it serves decode, to prefill; while it drains its
  decodes in that second switch it refuses prefills (a decode node switching to prefill does), so no prefill
  queues behind decodes on it while collocated nodes could take it.
Each stage's orders go out at the first tick after the completions they wait for: `next_tick_at` is the
completion's time (drivers deliver it at once).

`next_tick_at` is when the driver must deliver the next `Tick` (None: nothing scheduled). Every event handled
and every effect issued is appended to `log` (`ControlRecord`), the sequence the differential tests compare
between drivers.

Invariants: a node has at most one switch order outstanding (the core's `split_change` skips switching nodes);
switch generations handed out are strictly increasing and bounded by `MAX_GENERATION`; ticks are handled in time
order (a tick earlier than the last one raises).

Boundary: pure orchestration over `RouterCore`, the planner and `ModelBook`; no I/O, no clock.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.core.core import RouterCore
from evolving_infra.router.core.effects import PushCounts, SplitChange
from evolving_infra.router.core.models import ModelBook, ModelOrigin
from evolving_infra.router.core.tracking import NodeTrack
from evolving_infra.router.fitting import UsageCounts
from evolving_infra.router.planner import CheckingPlanner, Outcome, Planner, PlannerDecision, SwitchMode, WindowConfig

MAX_GENERATION = 2**53 - 1
"""Switch generations stay at or below this (exact in every JSON number and far inside protobuf's uint64; node
agents refuse larger ones): a node reporting a larger one is ignored when choosing the next generation."""


class WarmupExit(enum.Enum):
    """How the nodes leave the collocated warmup (module docstring, "Leaving the warmup")."""

    AT_ONCE = "at-once"
    """Every node is ordered to its initial phase at the warmup's end (the prefill side stalls while the
    prefill-bound nodes drain their local decodes)."""
    STAGED = "staged"
    """Prefill-bound nodes in two waves through decode; decode-bound nodes stay collocated until the prefill
    side serves."""


class ControlPhase(enum.Enum):
    WARMUP = "warmup"
    """Collocated warmup (E.3 line 1): every node serves both phases, models are being fitted."""
    SERVING = "serving"
    """Disaggregated: nodes serve prefill or decode, the planner runs."""


# -- events -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: handle what is due at `now` (fit refresh, end of warmup, planner tick)."""

    now: float


@dataclass(frozen=True, slots=True)
class SwitchCompleted:
    """`node` serves `phase` now (its drain finished, or its relaunch ended)."""

    node: NodeId
    phase: Phase
    now: float


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """`node` serves `phase` (None: collocated) and is known to routing from now on."""

    node: NodeId
    phase: Phase | None
    now: float


@dataclass(frozen=True, slots=True)
class NodeLost:
    """`node` stopped answering (or died): its KV and counts are dropped."""

    node: NodeId
    now: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """A request finished after producing `output_tokens` in `decode_iterations` iterations (both measured)."""

    output_tokens: int
    decode_iterations: float
    now: float


@dataclass(frozen=True, slots=True)
class GenerationSeen:
    """A node reported switch generation `generation` (the next order must be above it)."""

    node: NodeId
    generation: int


ControlEvent = Tick | SwitchCompleted | NodeJoined | NodeLost | RequestFinished | GenerationSeen


# -- effects ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SwitchOrder:
    """Move `node` to `phase` the way `mode` says (relaunches serve nothing for `relaunch_s`), with switch
    generation `generation`. `initial`: the end-of-warmup placement, not a planner switch (no cooldown)."""

    node: NodeId
    phase: Phase
    mode: SwitchMode
    generation: int
    relaunch_s: float = 0.0
    initial: bool = False


@dataclass(frozen=True, slots=True)
class PlannerDecided:
    """The planner's decision at `at` and, for a switch, the nodes it moves."""

    at: float
    decision: PlannerDecision
    change: SplitChange | None


@dataclass(frozen=True, slots=True)
class ModelsFrozen:
    """The warmup ended at `at`: fits frozen (or the profile's models kept: `fallback`), with messages."""

    at: float
    messages: tuple[str, ...]
    fallback: bool


ControlEffect = SwitchOrder | PlannerDecided | ModelsFrozen | PushCounts


class RecordKind(enum.Enum):
    WARMUP_STARTED = "warmup_started"
    WARMUP_ENDED = "warmup_ended"
    DECISION = "decision"
    SWITCH_ORDERED = "switch_ordered"
    SWITCH_COMPLETED = "switch_completed"
    NODE_JOINED = "node_joined"
    NODE_LOST = "node_lost"


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """One line of the control log: what happened at `at` (`node` and `detail` where they apply)."""

    at: float
    kind: RecordKind
    node: NodeId | None = None
    detail: str = ""
    reason: str = ""
    """Why (a decision's reason); not part of `key`: its figures differ between drivers."""

    def key(self) -> tuple[str, str | None, str]:
        """The record without its time (what two drivers must agree on, in order)."""
        return self.kind.value, self.node, self.detail


def record_json(record: ControlRecord) -> dict[str, object]:
    """A control record as plain JSON data."""
    return {"at": record.at, "kind": record.kind.value, "node": record.node, "detail": record.detail,
            "reason": record.reason}


def record_from_json(data: Mapping[str, object]) -> ControlRecord:
    node = data.get("node")
    return ControlRecord(float(data["at"]), RecordKind(data["kind"]), NodeId(str(node)) if node else None,  # type: ignore[arg-type]  # JSON values, typed object
                         str(data.get("detail", "")), str(data.get("reason", "")))


@dataclass(frozen=True, slots=True)
class ControlSettings:
    """How one cluster is run.

    initial: each node's phase after the warmup (or from the start without one). warmup_s: collocated warmup
    T_learn (0: none). fit_interval_s: during a fitting warmup, refresh the router's provisional models this
    often (None: only at the end). window: the planner's window (its slices are recorded from the warmup's end).
    warmup_exit: how the nodes leave the warmup.
    """

    initial: Mapping[NodeId, Phase]
    warmup_s: float = 0.0
    fit_interval_s: float | None = 60.0
    window: WindowConfig = field(default_factory=WindowConfig)
    warmup_exit: WarmupExit = WarmupExit.STAGED

    def __post_init__(self) -> None:
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"warmup_s must be a finite number >= 0, got {self.warmup_s}")
        if self.fit_interval_s is not None and not self.fit_interval_s > 0:
            raise ValueError(f"fit_interval_s must be > 0, got {self.fit_interval_s}")
        phases = set(self.initial.values())
        if self.initial and phases != {Phase.PREFILL, Phase.DECODE}:
            raise ValueError(f"the initial split needs at least one node of each phase, got {dict(self.initial)}")


class ControlCore:
    """One cluster's orchestration (see the module docstring)."""

    def __init__(self, core: RouterCore, planner: Planner | None, settings: ControlSettings, models: ModelBook) -> None:
        self.core = core
        self.planner = planner
        self.settings = settings
        self.models = models
        self.phase = ControlPhase.SERVING
        self.log: list[ControlRecord] = []
        self.generation = 0
        """The highest switch generation handed out or reported."""
        self.started_at: float | None = None
        self._last_tick: float | None = None
        self._next_fit: float | None = None
        self._warmup_end: float | None = None
        self._next_plan: float | None = None
        self._next_check: float | None = None
        """When the planner's next check between decisions is due (`CheckingPlanner`; None: it has none)."""
        self._orders: dict[NodeId, SwitchOrder] = {}
        """Switch orders not yet completed, per node."""
        self._exit: _StagedExit | None = None
        """The staged end of the warmup while it is under way."""
        self._exit_due: float | None = None
        """A completion the staged exit waits for happened at this time: its next stage is due."""

    # -- schedule -------------------------------------------------------------------------------------------
    @property
    def warming_up(self) -> bool:
        return self.phase is ControlPhase.WARMUP

    @property
    def next_tick_at(self) -> float | None:
        """When the next `Tick` is due (None: nothing scheduled)."""
        times = (self._next_fit, self._warmup_end, self._exit_due, self._next_plan, self._next_check)
        due = [t for t in times if t is not None]
        return min(due) if due else None

    def start(self, now: float) -> list[ControlEffect]:
        """Start the cluster at `now`: the warmup, or the initial split and the planner."""
        if self.started_at is not None:
            raise RuntimeError("the control core was started already")
        self.started_at = now
        s = self.settings
        if s.warmup_s > 0:
            self.phase = ControlPhase.WARMUP
            fitting = self.models.origin is ModelOrigin.FITTED
            for track in self.core.nodes.values():
                self._initial_models(track, warmup=True)
                if fitting:
                    track.fitter = self.models.shape.fitter(track.id)
            self._warmup_end = now + s.warmup_s
            if fitting and s.fit_interval_s is not None and now + s.fit_interval_s < self._warmup_end:
                self._next_fit = now + s.fit_interval_s
            self._record(now, RecordKind.WARMUP_STARTED, reason=f"collocated warmup of {s.warmup_s:g} s")
            return []
        for track in self.core.nodes.values():
            self._initial_models(track, warmup=False)
        return self._serve(now)

    def _initial_models(self, track: NodeTrack, *, warmup: bool) -> None:
        router_model, planner_model = self.models.initial(warmup)
        self.core.router_models[track.id] = router_model
        if planner_model is not None:
            self.core.planner_models[track.id] = planner_model

    # -- events ---------------------------------------------------------------------------------------------
    def handle(self, event: ControlEvent) -> list[ControlEffect]:
        """Deliver one event; returns the effects to carry out, in order."""
        if isinstance(event, Tick):
            return self.tick(event.now)
        if isinstance(event, SwitchCompleted):
            return [*self.switch_completed(event.node, event.phase, event.now)]
        if isinstance(event, NodeJoined):
            return [*self.node_joined(event.node, event.phase, event.now)]
        if isinstance(event, NodeLost):
            return [*self.node_lost(event.node, event.now, event.reason)]
        if isinstance(event, RequestFinished):
            self.request_finished(event.output_tokens, event.decode_iterations, event.now)
            return []
        if isinstance(event, GenerationSeen):
            self.generation_seen(event.node, event.generation)
            return []
        raise TypeError(f"not a control event: {event!r}")

    def tick(self, now: float) -> list[ControlEffect]:
        """Everything due at or before `now`, in order: a provisional refit, the warmup's end, a planner tick."""
        if self._last_tick is not None and now < self._last_tick:
            raise ValueError(f"tick at {now} is before the last tick at {self._last_tick}")
        self._last_tick = now
        out: list[ControlEffect] = []
        if self._next_fit is not None and now >= self._next_fit:
            self._refit()
            assert self._warmup_end is not None and self.settings.fit_interval_s is not None
            nxt = self._next_fit + self.settings.fit_interval_s
            self._next_fit = nxt if nxt < self._warmup_end else None
        if self._warmup_end is not None and now >= self._warmup_end:
            out += self._end_warmup(now)
        if self._exit_due is not None and now >= self._exit_due:
            self._exit_due = None
            out += self._advance_exit(now)
        planned = False
        if self._next_plan is not None and now >= self._next_plan:
            assert self.planner is not None
            self._next_plan = now + self.planner.interval_s
            out += self._plan(now)
            planned = True
        if self._next_check is not None and now >= self._next_check:
            interval = self._check_interval()
            while self._next_check is not None and self._next_check <= now:
                self._next_check = None if interval is None else self._next_check + interval
            if not planned:
                out += self._check(now)
        return out

    def switch_completed(self, node: NodeId, phase: Phase, now: float) -> list[PushCounts]:
        """`node` serves `phase`: routing learns it; a planner switch's end starts the cooldown."""
        order = self._orders.pop(node, None)
        self.core.switch_completed(node, phase, now)
        if order is not None and not order.initial:
            self.core.last_switch_end = now
        self._record(now, RecordKind.SWITCH_COMPLETED, node, phase.value)
        self._exit_progress(node, now)
        return list(self.core.take_counts())

    def switch_failed(self, node: NodeId, now: float, reason: str) -> None:
        """A switch order could not be carried out (the node refused): it still serves its old phase."""
        self._orders.pop(node, None)
        self.core.nodes[node].target = None
        self._record(now, RecordKind.SWITCH_COMPLETED, node, f"failed: {reason}")
        self._exit_progress(node, now)

    def node_joined(self, node: NodeId, phase: Phase | None, now: float) -> list[PushCounts]:
        """A node serves `phase` (None: collocated) and joins routing (known or new)."""
        track = self.core.nodes.get(node)
        if track is None:
            raise KeyError(f"node {node} has no track; the driver adds one before it joins")
        self.core.add_node(track, phase if phase is not None else Phase.PREFILL)
        track.phase = phase
        if node not in self.core.router_models:
            self._initial_models(track, warmup=self.warming_up)
        if self.warming_up and track.fitter is None and self.models.origin is ModelOrigin.FITTED:
            track.fitter = self.models.shape.fitter(node)
        self._record(now, RecordKind.NODE_JOINED, node, phase.value if phase is not None else "collocated")
        return list(self.core.take_counts())

    def node_lost(self, node: NodeId, now: float, reason: str = "") -> list[PushCounts]:
        """A node is gone: it serves nothing, its KV leaves the directory and its counts are released."""
        track = self.core.nodes[node]
        track.phase, track.target = None, None
        track.forget_report()
        self._orders.pop(node, None)
        self._record(now, RecordKind.NODE_LOST, node, reason)
        self._exit_progress(node, now)
        return list(self.core.clear_node(node, now))

    def request_finished(self, output_tokens: int, decode_iterations: float, now: float) -> None:
        """The decode half of w̄: measured output and iterations of a finished request."""
        recorder = self.core.recorder
        if recorder is not None:
            recorder.record_decode(output_tokens, decode_iterations, now)

    def generation_seen(self, node: NodeId, generation: int) -> None:
        if 0 <= generation <= MAX_GENERATION:
            self.generation = max(self.generation, generation)

    # -- internals ------------------------------------------------------------------------------------------
    def _next_generation(self) -> int:
        if self.generation + 1 > MAX_GENERATION:
            raise OverflowError("switch generations are exhausted")
        self.generation += 1
        return self.generation

    def _refit(self) -> None:
        for track in self.core.nodes.values():
            if track.fitter is not None:
                self.core.router_models[track.id] = self.models.provisional(track.fitter)

    def _end_warmup(self, now: float) -> list[ControlEffect]:
        self._warmup_end = None
        self._next_fit = None
        out: list[ControlEffect] = []
        fitters = {n: t.fitter for n, t in self.core.nodes.items() if t.fitter is not None}
        if self.models.origin is ModelOrigin.FITTED and fitters:
            models, messages, fallback = self.models.freeze(fitters)
            for node, (router_model, planner_model) in models.items():
                self.core.router_models[node] = router_model
                self.core.planner_models[node] = planner_model
            out.append(ModelsFrozen(now, tuple(messages), fallback))
        else:
            for track in self.core.nodes.values():
                self._initial_models(track, warmup=False)
        for track in self.core.nodes.values():
            track.fitter = None
            track.usage = UsageCounts()
        self.phase = ControlPhase.SERVING
        self._record(now, RecordKind.WARMUP_ENDED)
        placed = [(n, p) for n, p in sorted(self.settings.initial.items()) if n in self.core.nodes]
        placed = [(n, p) for n, p in placed if self.core.nodes[n].serving]
        for node, phase in placed:  # where branches are placed from now on (counts follow the phase)
            self.core.branches.set_phase(node, phase)
        out += self.core.take_counts()
        if self.settings.warmup_exit is WarmupExit.AT_ONCE:
            generation = self._next_generation()
            for node, phase in placed:
                out.append(self._order(SwitchOrder(node, phase, SwitchMode.IN_PLACE, generation, initial=True), now))
            return out + self._serve(now)
        prefill = [n for n, p in placed if p is Phase.PREFILL]
        first = (len(prefill) + 1) // 2
        waves = [w for w in (prefill[:first], prefill[first:]) if w]
        self._exit = _StagedExit(waves, [n for n, p in placed if p is Phase.DECODE])
        return out + self._serve(now) + self._advance_exit(now)

    # -- the staged end of the warmup ------------------------------------------------------------------------
    def _exit_progress(self, node: NodeId, now: float) -> None:
        """A node the staged exit may wait for completed a switch (or failed, or was lost): re-check at `now`."""
        if self._exit is not None and node in self._exit.waiting():
            self._exit_due = now if self._exit_due is None else min(self._exit_due, now)

    def _done_in_wave(self, node: NodeId, plan: _StagedExit) -> bool:
        """`node`'s order to prefill completed (or failed), or it serves nothing (it left the cluster)."""
        track = self.core.nodes.get(node)
        if track is None or not track.serving:
            return True
        return track.target is None and node in plan.via_decode

    def _initial_order(self, node: NodeId, phase: Phase, now: float) -> list[ControlEffect]:
        track = self.core.nodes.get(node)
        if track is None or not track.serving or track.target is not None:
            return []
        return [self._order(SwitchOrder(node, phase, SwitchMode.IN_PLACE, self._next_generation(), initial=True), now)]

    def _advance_exit(self, now: float) -> list[ControlEffect]:
        """Issue every stage of the staged exit whose wait is over (see the module docstring)."""
        plan = self._exit
        out: list[ControlEffect] = []
        while plan is not None:
            if plan.active is None:
                if plan.waves:
                    plan.active = plan.waves.pop(0)
                    for node in plan.active:  # first to decode: its prefills go elsewhere, its decodes stay
                        out += self._initial_order(node, Phase.DECODE, now)
                    continue
                for node in plan.decode:
                    out += self._initial_order(node, Phase.DECODE, now)
                self._exit = plan = None
                break
            for node in plan.active:
                track = self.core.nodes.get(node)
                if track is None or not track.serving or track.target is not None or node in plan.via_decode:
                    continue
                # it serves decode now (or its order to decode failed): on to prefill; it drains its decodes
                # refusing prefills
                plan.via_decode.add(node)
                out += self._initial_order(node, Phase.PREFILL, now)
            if not all(self._done_in_wave(n, plan) for n in plan.active):
                break
            plan.active = None
        return out

    def _serve(self, now: float) -> list[ControlEffect]:
        """The planner's window starts now; its first tick one interval later."""
        window = getattr(getattr(self.planner, "settings", None), "window", None)
        self.core.start_window(window if isinstance(window, WindowConfig) else self.settings.window, now)
        if self.planner is not None:
            self._next_plan = now + self.planner.interval_s
            interval = self._check_interval()
            self._next_check = None if interval is None else now + interval
        return []

    def _check_interval(self) -> float | None:
        interval = self.planner.check_interval_s if isinstance(self.planner, CheckingPlanner) else None
        if interval is not None and not interval > 0:
            raise ValueError(f"a planner's check_interval_s must be > 0 or None, got {interval}")
        return interval

    def _order(self, order: SwitchOrder, now: float) -> SwitchOrder:
        self.core.switch_begun(order.node, order.phase)
        self._orders[order.node] = order
        detail = f"{order.phase.value} {order.mode.value}" + (" initial" if order.initial else "")
        self._record(now, RecordKind.SWITCH_ORDERED, order.node, detail)
        return order

    def _observed(self) -> list[NodeTrack]:
        """The nodes the planner plans over: serving a phase, or switching to one (down nodes are left out)."""
        return [t for t in self.core.nodes.values() if t.target is not None or (t.serving and t.phase is not None)]

    def _plan(self, now: float) -> list[ControlEffect]:
        assert self.planner is not None
        core = self.core
        previous: dict[NodeId, object] = dict(core.planner_models)

        def refresh(track: NodeTrack, usage: UsageCounts | None) -> tuple[object, object]:
            return self.models.refreshed(track.id, previous.get(track.id), usage)

        core.refresh_models(refresh)
        observed = {t.id for t in self._observed()}
        if not observed:
            return []
        observation = core.observation(now, only=observed)
        return self.decided(self.planner.decide(observation, now), now)

    def _check(self, now: float) -> list[ControlEffect]:
        """The planner's check between decisions, on the current models (refreshed at decisions only)."""
        assert isinstance(self.planner, CheckingPlanner)
        observed = {t.id for t in self._observed()}
        if not observed:
            return []
        decision = self.planner.check(self.core.observation(now, only=observed), now)
        return [] if decision is None else self.decided(decision, now)

    def decided(self, decision: PlannerDecision, now: float) -> list[ControlEffect]:
        """A decision (the planner's, or one made outside it, e.g. by a test) as its switch orders."""
        change = self.core.split_change(decision)
        self._record(now, RecordKind.DECISION, detail=_describe(decision, change), reason=_why(decision))
        out: list[ControlEffect] = [PlannerDecided(now, decision, change)]
        if change is None or not change.switches:
            return out
        generation = self._next_generation()
        for switch in change.switches:
            relaunch = change.relaunch_s if switch.mode is SwitchMode.RELAUNCH else 0.0
            out.append(self._order(SwitchOrder(switch.node, switch.phase, switch.mode, generation, relaunch), now))
        return out

    def _record(self, at: float, kind: RecordKind, node: NodeId | None = None, detail: str = "", reason: str = "") -> None:
        self.log.append(ControlRecord(at, kind, node, detail, reason))


@dataclass
class _StagedExit:
    """The staged end of the warmup under way: prefill-bound nodes in waves, then the decode-bound nodes."""

    waves: list[list[NodeId]]
    decode: list[NodeId]
    active: list[NodeId] | None = None
    """The wave moving now (None: the next stage starts at the next check)."""
    via_decode: set[NodeId] = field(default_factory=set)
    """Nodes of the active wave already ordered on from decode to prefill."""

    def waiting(self) -> set[NodeId]:
        return set(self.active or ())


def _describe(decision: PlannerDecision, change: SplitChange | None) -> str:
    if decision.outcome is Outcome.SWITCH and change is not None:
        p, d = change.split
        return f"{decision.outcome.value} {p}P{d}D {decision.mode.value}"
    return decision.outcome.value


def _why(decision: PlannerDecision) -> str:
    """The decision's reason, with each window slice's use where the planner reports it."""
    slices = getattr(decision.diagnostics, "slices", ())
    uses = " ".join(f"[{s.start:g},{s.end:g}):{s.use.value}/{s.requests}" for s in slices)
    return (decision.reason + (f"; slices {uses}" if uses else ""))[:1000]
