"""`RouterCore`: the router's side of the request path, node reports and planning, once, for both drivers.

The live router service (`router.service`) and the simulator (`sim`) drive the same object; time is passed
in and nothing here does I/O. What it decides comes back as data for the driver to carry out
(`effects.py`): the prefill to send (with its fetch plan), branch counts to push per node, node switches.

Request path (docs/router.md):
1. `admit`: algorithm E.1 (branch version, path) for the request's prompt pages.
2. `route`: the KV directory's longest prefixes for every accepting prefill node (less those the driver
   excludes for this request, unless that leaves none), one `PrefillNodeView` per node (its last report, the
   requests sent since, the router's own in-flight record, the report's age, the node's model), the prefill
   policy's decision, the branch placed on the node (E.2), the fetch plan.
   `prefill_sent` records the request as sent to the node.
3. `prefill_started`: usage counts (t̄_n, f_n), the warmup fitter, the planner's window; `bind` then picks a
   decode node with KV room (fewest requests) and places the branch there.
4. `prefill_finished` / `decode_submitted` / `decode_finished`: placements confirmed once the node holds the
   branch's current version; the policy's hooks; decode occupancy for the planner.
5. `end_branch`: the branch's counts drop to zero.

Reports: `absorb` (KV events to the directory, host evictions to the branch table), `iteration` (warmup
fitting and usage), `NodeTrack.record_report` (running batch and queue). `take_counts` collects every
changed count per node (`BranchTable.take_updates`).

Switches: `split_change` turns a planner decision into the nodes that move; `switch_begun` stops new work of
the old phase; `release_prefill` / `release_decode` prepare handed-back requests for `route` / `bind` again;
`switch_completed` records the new phase; `clear_node` drops a node's KV and counts (it died or relaunched).

Invariant: every count change is returned by the next `take_counts` exactly once, for the node it is on.

Boundary: pure decisions and bookkeeping over the directory, branch table, policies and planner window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from evolving_infra.core.itermodel import IterationRecord
from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, Tier
from evolving_infra.router.branches import BranchTable
from evolving_infra.core.fetch import FetchRun
from evolving_infra.router.core.effects import PushCounts, Routed, SendPrefill, SplitChange, SwitchNode
from evolving_infra.router.core.tracking import NodeTrack, RoutedRequest, accept_rule
from evolving_infra.router.core.views import decode_need, decode_view, node_load, prefill_views
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.fitting import UsageCounts
from evolving_infra.router.planner import (
    NodeStatus, Outcome, PlannerDecision, PlannerObservation, SliceRecorder, WindowConfig,
)  # fmt: skip
from evolving_infra.router.routing import (
    DecodeBinder, DecodeBinding, FetchTiming, PrefillPolicyName, PrefillRouter, RoutingDecision,
)  # fmt: skip

ModelRefresh = Callable[[NodeTrack, UsageCounts | None], tuple[object, object]]
"""(node, window usage or None) -> (router model, planner model) for the next window."""


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """How the core routes and binds.

    shared_pool: host memory of all nodes is one pool (peers' host KV can be fetched); False: only a node's own
    KV is reusable. reserve_on_bind: a bound request's decode KV is reserved on its node until submitted there
    (False: the driver reserves it some other way, e.g. the SGLang baseline at routing).
    context_length_tokens, kv_capacity_tokens: the queue-driven planners' load denominators. node_kv_pages: the
    KV pages a node's GPU and host memory hold together (0: unknown; ours then does not check that a split's
    prefill nodes hold the active contexts).
    """

    shared_pool: bool = True
    reserve_on_bind: bool = True
    context_length_tokens: int = 200_000
    kv_capacity_tokens: int = 1
    node_kv_pages: int = 0


@dataclass(frozen=True, slots=True)
class Bound:
    """Outcome of `bind`: the binder's answer and the count changes of the placement."""

    binding: DecodeBinding
    counts: tuple[PushCounts, ...] = ()

    @property
    def node(self) -> NodeId | None:
        return self.binding.node


class RouterCore:
    """The router's shared core (see the module docstring). `nodes` are the driver's `NodeTrack`s."""

    def __init__(
        self,
        nodes: Mapping[NodeId, NodeTrack],
        *,
        router: PrefillRouter,
        binder: DecodeBinder,
        settings: CoreSettings | None = None,
        directory: KvDirectory | None = None,
        branches: BranchTable | None = None,
    ) -> None:
        self.nodes: dict[NodeId, NodeTrack] = dict(nodes)
        self.settings = settings or CoreSettings()
        self.router = router
        self.binder = binder
        self.directory = directory if directory is not None else KvDirectory()
        if branches is None:
            branches = BranchTable({n.id: n.phase or Phase.PREFILL for n in self.nodes.values()})
        self.branches = branches
        for node in self.nodes:
            self.directory.add_node(node)
        self.router_models: dict[NodeId, object] = {}
        self.planner_models: dict[NodeId, object] = {}
        self.recorder: SliceRecorder | None = None
        self.decode_occupancy = 0
        self.last_switch_end: float | None = None
        name = getattr(router, "name", None)
        self._pool_fetches_prefix = self.settings.shared_pool and name is not PrefillPolicyName.TTFT
        self._order: dict[NodeId, int] = {}  # position of each node in `nodes` (rebuilt when a node joins)

    # -- nodes -----------------------------------------------------------------------------------------
    def add_node(self, node: NodeTrack, phase: Phase) -> None:
        """A node joins (or comes back): known to the directory and the branch table with `phase`."""
        self.nodes[node.id] = node
        self.directory.add_node(node.id)
        self.branches.set_phase(node.id, phase)

    def accepting(self, phase: Phase) -> list[NodeTrack]:
        """The nodes that take new work of `phase` now (`NodeTrack.accepts`, inlined: every node, every decision)."""
        modes, targets = accept_rule(phase)
        return [n for n in self.nodes.values() if n.current_mode() in modes and n.target in targets]

    def split_now(self) -> tuple[int, int]:
        """(prefill, decode) nodes serving a phase now (nodes serving nothing and collocated ones excluded)."""
        p = sum(1 for n in self.nodes.values() if n.serving and n.phase is Phase.PREFILL)
        d = sum(1 for n in self.nodes.values() if n.serving and n.phase is Phase.DECODE)
        return p, d

    def collocated_now(self) -> int:
        """Nodes serving both phases now (the collocated warmup)."""
        return sum(1 for n in self.nodes.values() if n.current_mode() is NodeMode.COLLOCATED)

    # -- counts ----------------------------------------------------------------------------------------
    def take_counts(self) -> list[PushCounts]:
        """Every count changed since the last call, per node (in node order); only the nodes whose counts
        changed are visited."""
        dirty = self.branches.dirty_nodes()
        if not dirty:
            return []
        order = self._order
        if len(order) != len(self.nodes) or any(node not in order and node in self.nodes for node in dirty):
            order = self._order = {node: i for i, node in enumerate(self.nodes)}
        take = self.branches.take_updates
        mine = sorted((order[node], node) for node in dirty if node in order)
        return [PushCounts(node, updates) for _, node in mine if (updates := take(node))]

    def absorb(self, events: Iterable[KvEvent]) -> list[PushCounts]:
        """KV events to the directory, host removals to the branch counts; the count changes (none if no events)."""
        any_event = False
        for event in events:
            any_event = True
            self.directory.apply(event)
            if isinstance(event, KvRemoved) and event.tier is Tier.HOST:
                self.branches.evicted(event.node, event.pages)
        return self.take_counts() if any_event else []

    def end_branch(self, branch: BranchId, now: float) -> list[PushCounts]:
        """The harness said `branch` finished: its counts drop to zero. Returns the count changes."""
        self.branches.end(branch)
        self.router.on_branch_finished(branch, now)
        return self.take_counts()

    def clear_node(self, node: NodeId, now: float) -> list[PushCounts]:
        """The node lost its KV (it died or relaunched): its pages leave the directory, its counts are released."""
        self.directory.apply(KvCleared(node, None, now))
        self.branches.drop_node(node)
        return self.take_counts()

    # -- request path ------------------------------------------------------------------------------------
    def admit(self, branch: BranchId, pages: Sequence[PageHash]) -> int:
        """Algorithm E.1 for a request of `branch` with prompt pages `pages`; returns the branch version."""
        return self.branches.request(branch, pages).version

    def route(self, req: RoutedRequest, now: float, exclude: frozenset[NodeId] = frozenset()) -> Routed | None:
        """Choose the prefill node for `req` (None: no node accepts prefill now) and place its branch there.

        `exclude`: nodes passed over while another node accepts prefill (the live router's nodes that refused
        this request's prefill for their phase, before their reports say so); when every candidate is excluded,
        every candidate is considered. Empty (the simulator): the candidates are every accepting node."""
        candidates = self.accepting(Phase.PREFILL)
        if not candidates:
            return None
        if exclude:
            candidates = [n for n in candidates if n.id not in exclude] or candidates
        match = self.directory.lookup(req.prompt_pages)
        shared = self.settings.shared_pool
        views = prefill_views(candidates, match, now, shared_pool=shared, models=self.router_models)
        decision: RoutingDecision = self.router.route(req.route, views, now)
        self.router.on_routed(req.route, decision, now)
        node = self.nodes[decision.node]
        view = views.view_of(node.id)
        if req.prefill_node in self.nodes:  # drivers release a request before routing it again, but to be sure:
            self.nodes[req.prefill_node].rerouting(req.id)
        req.prefill_node = node.id
        if self.recorder is not None and req.recorded_cached is None:
            # the prefill half of w̄, for the slice the request arrives in (E.3: "each request that arrives in the
            # window"), with the tokens the router can reuse for it (corrected when its prefill starts); the
            # decode half comes when it finished
            cached = req.recorded_cached = min(decision.cached_tokens, req.route.prompt_tokens)
            self.recorder.record_prefill(req.route.prompt_tokens - cached, cached, now)
        req.routed_cached = decision.cached_tokens
        req.routed_restore = max(0, decision.cached_tokens - view.own_gpu_pages * req.route.page_tokens)
        fetch = req.fetch_plan = self._fetch_plan(req, decision, view.fetch_sources or ())
        counts: list[PushCounts] = []
        if req.branch in self.branches:
            self.branches.place(req.branch, node.id, held=False)
            counts = self.take_counts()
        return Routed(node.id, decision, view, fetch, tuple(counts))

    def _fetch_plan(
        self, req: RoutedRequest, decision: RoutingDecision, runs: tuple[FetchRun, ...]
    ) -> tuple[FetchRun, ...]:
        """What the prefill node pulls from peers: the policy's plan, or the pool's whole reachable prefix when
        the policy does not move KV itself but the host memory is a shared pool."""
        pages = req.prompt_pages
        if decision.fetch_timing is not FetchTiming.NONE and decision.fetch_from:
            chosen: tuple[FetchRun, ...] = decision.fetch_from
        elif self._pool_fetches_prefix:
            chosen = runs
        else:
            return ()
        return tuple(r.bound(pages) for r in chosen)

    def prefill_sent(self, req: RoutedRequest) -> SendPrefill:
        """The request is being sent to its prefill node: recorded there; the effect to carry out."""
        assert req.prefill_node is not None, f"request {req.id} has no prefill node"
        self.nodes[req.prefill_node].sent[req.id] = req
        return SendPrefill(req.prefill_node, req.id, req.fetch_plan)

    def prefill_started(
        self, node: NodeId, req: RoutedRequest, cached_tokens: int, restored_tokens: int, now: float
    ) -> None:
        """`node` started the prefill with `cached_tokens` reused (`restored_tokens` of them from host memory)."""
        track = self.nodes[node]
        req.prefill_started = True
        if self.recorder is not None and req.recorded_cached is not None and not req.work_measured:
            # the cached tokens the router counted at arrival may have been evicted while the request waited (or
            # more may be cached now): the slice's prefill work follows what the node reuses
            req.work_measured = True
            prompt = req.route.prompt_tokens
            self.recorder.correct_prefill(prompt, req.recorded_cached, min(cached_tokens, prompt), now)
        restored = min(restored_tokens, cached_tokens)
        track.usage = track.usage + UsageCounts.of_request(cached_tokens, restored)
        if track.fitter is not None and not track.fitter.frozen:
            track.fitter.observe_request(cached_tokens, restored)

    def prefill_finished(self, node: NodeId, request: str, req: RoutedRequest | None, now: float) -> list[PushCounts]:
        """`node` finished the prefill of `request` (`req`: the router's record, None if it left)."""
        self.nodes[node].sent.pop(request, None)
        self._record_backlog(now)
        if req is None:
            return []
        req.prefill_done = True
        self.router.on_first_token(req.route.id, now)
        self.branches.confirm_held(req.branch, node, req.version)
        return self.take_counts()

    def bind(self, req: RoutedRequest, now: float) -> Bound:
        """Bind `req` to a decode node with KV room (the binder's choice), or report why none can take it."""
        nodes = self.accepting(Phase.DECODE)
        local = self.nodes.get(req.prefill_node) if req.prefill_node is not None else None
        if local is not None and local.current_mode() is NodeMode.COLLOCATED and local in nodes:
            nodes = [local]  # a collocated node decodes what it prefilled (the engine's local decode)
        binding = self.binder.bind(req.route, [decode_view(n) for n in nodes], now)
        if binding.node is None:
            return Bound(binding)
        self.binder.on_bound(req.route, binding, now)
        target = self.nodes[binding.node]
        req.decode_node = target.id
        target.bound[req.id] = req
        if self.settings.reserve_on_bind:
            req.reserved = decode_need(req)
            target.reserved_tokens += req.reserved
        counts: list[PushCounts] = []
        if req.branch in self.branches:
            self.branches.place(req.branch, target.id, held=False)
            counts = self.take_counts()
        return Bound(binding, tuple(counts))

    def unbind(self, req: RoutedRequest) -> None:
        """Drop the request's decode binding and reservation (it will be bound again, or left)."""
        if req.decode_node is None:
            return
        node = self.nodes[req.decode_node]
        node.bound.pop(req.id, None)
        if req in node.prealloc:
            node.prealloc.remove(req)
        node.reserved_tokens -= req.reserved
        req.reserved = 0
        req.decode_node = None

    def reserve(self, req: RoutedRequest) -> None:
        """Reserve the request's decode KV on its decode node (the driver reserves outside `bind`)."""
        assert req.decode_node is not None
        req.reserved = decode_need(req)
        self.nodes[req.decode_node].reserved_tokens += req.reserved

    def decode_handover(self, req: RoutedRequest) -> None:
        """The request's KV is being submitted to its decode node: it leaves `bound` and its reservation ends."""
        assert req.decode_node is not None
        target = self.nodes[req.decode_node]
        target.bound.pop(req.id, None)
        target.reserved_tokens -= req.reserved
        req.reserved = 0

    def decode_submitted(self, req: RoutedRequest, now: float) -> list[PushCounts]:
        """The decode node accepted the request: it runs there; the placement there is confirmed."""
        assert req.decode_node is not None
        self.nodes[req.decode_node].decode_jobs[req.id] = req
        self.set_occupancy(self.decode_occupancy + 1, now)
        self.branches.confirm_held(req.branch, req.decode_node, req.version)
        return self.take_counts()

    def decode_finished(self, node: NodeId, req: RoutedRequest, now: float) -> None:
        """The request's last token was produced on `node` (or it failed there): it leaves the router."""
        if self.nodes[node].decode_jobs.pop(req.id, None) is not None:
            self.set_occupancy(self.decode_occupancy - 1, now)
        self.router.on_finished(req.route.id, now)

    def forget(self, req: RoutedRequest, now: float) -> list[PushCounts]:
        """The request left without finishing (error, cancel): drop it from every node's record."""
        if req.prefill_node is not None:
            self.nodes[req.prefill_node].sent.pop(req.id, None)
        if req.decode_node is not None:
            if self.nodes[req.decode_node].decode_jobs.pop(req.id, None) is not None:
                self.set_occupancy(self.decode_occupancy - 1, now)
            self.unbind(req)
        self.router.on_finished(req.route.id, now)
        return self.take_counts()

    # -- re-routing ---------------------------------------------------------------------------------------
    def release_prefill(self, req: RoutedRequest, *, lost_kv: bool = False, now: float | None = None) -> None:
        """Prepare a request for `route` again: handed back by a switching node, or its node lost (with
        `lost_kv`, its prefill and decode are forgotten too: it starts over; a decode still counted as running
        leaves the decode occupancy at `now`)."""
        req.attempt += 1
        if req.prefill_node is not None:
            self.nodes[req.prefill_node].sent.pop(req.id, None)
        if lost_kv:
            if req.decode_node is not None:
                running = self.nodes[req.decode_node].decode_jobs.pop(req.id, None) is not None
                if running and now is not None:
                    self.set_occupancy(self.decode_occupancy - 1, now)
            self.unbind(req)
            req.prefill_done = False
            req.prefill_started = False
        req.prefill_node = None

    def release_decode(self, req: RoutedRequest, now: float) -> None:
        """Prepare a queued decode handed back by a switching decode node for `bind` again."""
        req.attempt += 1
        if req.decode_node is not None and self.nodes[req.decode_node].decode_jobs.pop(req.id, None) is not None:
            self.set_occupancy(self.decode_occupancy - 1, now)
        req.decode_node = None

    # -- reports ------------------------------------------------------------------------------------------
    def iteration(self, node: NodeId, record: IterationRecord) -> None:
        """One iteration report: to the node's fitter during warmup, prefill items to its usage counts."""
        track = self.nodes[node]
        if track.fitter is not None and not track.fitter.frozen and record.duration > 0:
            track.fitter.observe(record)
        if record.prefill:
            track.usage = track.usage + UsageCounts.of_iteration(record.prefill)

    # -- planning -------------------------------------------------------------------------------------------
    def set_occupancy(self, count: int, now: float) -> None:
        self.decode_occupancy = count
        if self.recorder is not None:
            self.recorder.record_decode_occupancy(count, now)
            self._record_backlog(now)

    def _record_backlog(self, now: float) -> None:
        """The planner's prefill backlog (requests sent to prefill nodes, prefill not ended), sampled at decode
        occupancy changes and prefill ends: O(nodes), never per routing decision (a routing's send is seen at
        the next such event)."""
        recorder = self.recorder
        if recorder is not None:
            recorder.record_prefill_backlog(sum(len(t.sent) for t in self.nodes.values()), now)

    def start_window(self, window: WindowConfig, now: float) -> None:
        """Start recording planner slices (at the end of warmup, or at start without one)."""
        self.recorder = SliceRecorder.for_window(window, now)
        self.set_occupancy(self.decode_occupancy, now)

    def refresh_models(self, refresh: ModelRefresh) -> None:
        """New router and planner models per node from the window's usage counts; the counts restart."""
        for node in self.nodes.values():
            usage = node.usage if node.usage.prefill_iterations or node.usage.cached_tokens else None
            router_model, planner_model = refresh(node, usage)
            self.planner_models[node.id] = planner_model
            self.router_models[node.id] = router_model
            node.usage = UsageCounts()

    def observation(self, now: float, only: set[NodeId] | None = None) -> PlannerObservation:
        """What the planner reads at `now` (over the nodes in `only`, default all)."""
        s = self.settings
        nodes = [n for n in self.nodes.values() if only is None or n.id in only]
        return PlannerObservation(
            nodes={n.id: NodeStatus(n.serving_phase(), n.target is not None, n.move_cost()) for n in nodes},
            last_switch_end=self.last_switch_end,
            slices=self.recorder.completed(now) if self.recorder is not None else (),
            models=dict(self.planner_models),  # type: ignore[arg-type]  # planner models are opaque here
            load={
                n.id: node_load(n, context_length=s.context_length_tokens, kv_capacity_tokens=s.kv_capacity_tokens)
                for n in nodes
            },
            active_kv_pages=self.branches.active_pages() if s.node_kv_pages > 0 else None,
            kv_pages={n.id: s.node_kv_pages for n in nodes} if s.node_kv_pages > 0 else {},
        )

    def split_change(self, decision: PlannerDecision) -> SplitChange | None:
        """The nodes a SWITCH decision moves (in node-id order); None for any other outcome. Nodes already
        switching, or already serving their target, do not move."""
        if decision.outcome is not Outcome.SWITCH or decision.target is None:
            return None
        switches = []
        for node_id, phase in sorted(decision.target.items()):
            node = self.nodes[node_id]
            if node.target is not None or node.serving_phase() is phase:
                continue
            switches.append(SwitchNode(node_id, phase, decision.mode))
        return SplitChange(decision, dict(decision.target), tuple(switches), decision.relaunch_s)

    def switch_begun(self, node: NodeId, phase: Phase) -> None:
        """`node` starts moving to `phase`: no new work of its old phase is routed to it from now on."""
        self.nodes[node].target = NodeMode.of(phase)

    def switch_completed(self, node: NodeId, phase: Phase, now: float) -> None:
        """`node` serves `phase`: the branch table learns it (counts follow with the next `take_counts`)."""
        track = self.nodes[node]
        track.phase = phase
        track.target = None
        self.branches.set_phase(node, phase)
