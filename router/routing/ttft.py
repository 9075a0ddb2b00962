"""Ours: route each prefill to the node with the shortest predicted TTFT (paper eq. 7, algorithm E.3).

For request r and prefill node n:
- t_c,n: the longest prefix of r cached on n or on another node; x_n: its tokens only another node holds.
  A fetch below `min_fetch_tokens` is not worth its fixed cost, so then n reuses only its own leading run
  and recomputes the rest (x_n = 0).
- t_uc,n = prompt - t_c,n (at least the last prompt token is always computed).
- W_n, the wait before r's first chunk, and S_n, r's service time, by replaying n's running batch and
  queue (plus what the router sent n since its last report) and then r, in chunked-prefill order with eq. 1
  per iteration (`queue_replay.py`); `WaitModel.SUM_OF_SERVICE_TIMES` instead sums eq. 3 over the same requests.
- T_n = W_n + S_n + max(0, tau(x_n) - W_n) + kappa * x_n: the fetch runs while r waits, so only the part
  of tau that outlasts the wait adds to the TTFT; kappa charges the duplicate copy a fetch leaves behind.

Choice: the smallest T_n; ties go to the node with the longest prefix in its own memory, then to the
smallest node id. Invariant: the chosen node's T_n is <= every other node's T_n.

Stale state: a node's report is used only if at most `state_max_age_s` old. Otherwise (or if it never
reported) its running batch and queue are unknown, and the router replays its own record instead: every
request it sent to n whose prefill it has not seen finish, each with its full work (progress unknown, so
the wait is overestimated rather than underestimated).

Boundary: pure; the views carry the directory's prefix lengths and the nodes' state.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from itertools import chain
from dataclasses import dataclass

import numpy as np

from evolving_infra.core.types import NodeId, Work
from evolving_infra.router.routing.base import (
    FetchTiming,
    NodeScore,
    PrefillPolicyName,
    RouteReason,
    RouterHooks,
    RoutingDecision,
    by_node,
)
from evolving_infra.router.routing.backlogs import APPEND_BOUND, ROW_WIDTH, BacklogStore, _Entry, append_columns
from evolving_infra.router.routing.inputs import (
    PrefillNodeState,
    PrefillNodeView,
    PrefillViewSet,
    QueuedPrefill,
    RouteRequest,
    RunningPrefill,
    unique_nodes,
)
from evolving_infra.router.routing.keptrows import KeptRows
from evolving_infra.router.routing.nodemodel import PrefillNodeModel
from evolving_infra.router.routing.queue_replay import (
    DEFAULT_CHUNK_TOKENS,
    Backlog,
    ReplayJob,
    append_job,
    replay_chunked_prefill,
)


class WaitModel(enum.Enum):
    REPLAY = "replay"
    """Replay chunked-prefill iterations (eq. 1 each): requests sharing an iteration are accounted for."""
    SUM_OF_SERVICE_TIMES = "sum-of-service-times"
    """Eq. 7 literally: remaining time of the running batch plus the eq. 3 service time of each queued one."""


class StateSource(enum.Enum):
    REPORTED = "reported"
    """The node's latest report (fresh enough) plus the requests sent to it since."""
    ROUTER_RECORD = "router-record"
    """The report is missing or stale: the router's own record of requests sent and not yet prefilled."""


@dataclass(frozen=True, slots=True)
class TtftSettings:
    """Parameters of the TTFT policy; defaults are the paper's (appendix E.3) where it gives them.

    kappa (`copy_price_s_per_token`) is not given a value in the paper; the default, 1 us per token, equals
    tau's per-token slope: a fetched token costs its transfer time once even when the wait hides the fetch,
    so between nodes whose predicted finish is equal, the one creating fewer duplicate pages wins, while a
    node that is busier by more than the transfer time still loses to a fetch.
    """

    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    state_max_age_s: float = 5.0
    fetch_fixed_s: float = 0.45
    fetch_per_token_s: float = 1e-6
    min_fetch_tokens: int = 512
    copy_price_s_per_token: float = 1e-6
    wait_model: WaitModel = WaitModel.REPLAY

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")
        for name in ("state_max_age_s", "fetch_fixed_s", "fetch_per_token_s", "copy_price_s_per_token"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.min_fetch_tokens < 0:
            raise ValueError(f"min_fetch_tokens must be >= 0, got {self.min_fetch_tokens}")
        if not isinstance(self.wait_model, WaitModel):
            allowed = ", ".join(m.value for m in WaitModel)
            raise ValueError(f"wait_model must be a WaitModel ({allowed}), got {self.wait_model!r}")

    def fetch_time(self, tokens: int) -> float:
        """tau(x): 0 for no fetch, else a fixed cost plus a per-token cost."""
        if tokens <= 0:
            return 0.0
        return self.fetch_fixed_s + self.fetch_per_token_s * tokens

    def fetches(self, tokens: int) -> bool:
        return tokens > 0 and tokens >= self.min_fetch_tokens


@dataclass(frozen=True, slots=True)
class TtftEstimate:
    """The predicted TTFT of a request on one prefill node, term by term (seconds, tokens)."""

    node: NodeId
    own_pages: int
    cached_tokens: int
    fetch_tokens: int
    uncached_tokens: int
    restore_tokens: int
    wait: float
    service: float
    exposed_fetch: float
    copy_price: float
    state: StateSource

    @property
    def total(self) -> float:
        return self.wait + self.service + self.exposed_fetch + self.copy_price

    def score(self) -> NodeScore:
        return NodeScore(
            node=self.node,
            score=self.total,
            terms={
                "t_c": float(self.cached_tokens),
                "x": float(self.fetch_tokens),
                "t_uc": float(self.uncached_tokens),
                "wait": self.wait,
                "service": self.service,
                "exposed_fetch": self.exposed_fetch,
                "copy_price": self.copy_price,
                "total": self.total,
                "state_reported": 1.0 if self.state is StateSource.REPORTED else 0.0,
            },
        )


def _queued_job(entry: QueuedPrefill) -> ReplayJob:
    # A fully cached request still computes its last token.
    return ReplayJob(entry.request, max(entry.work.t_uc, 1), entry.work.t_c, entry.restore_tokens)


def state_source(view: PrefillNodeView | PrefillNodeState, settings: TtftSettings) -> StateSource:
    age = view.state_age_s
    fresh = age is not None and age <= settings.state_max_age_s
    return StateSource.REPORTED if fresh else StateSource.ROUTER_RECORD


def _jobs(
    source: StateSource,
    running: Sequence[RunningPrefill],
    queued: Sequence[QueuedPrefill],
) -> list[ReplayJob]:
    jobs = [ReplayJob(r.request, r.remaining_tokens, r.context_tokens) for r in running if r.remaining_tokens > 0]
    jobs.extend(_queued_job(q) for q in queued)
    return jobs


def _state_parts(view: PrefillNodeView | PrefillNodeState, source: StateSource) -> tuple[tuple[object, ...], ...]:
    if source is StateSource.REPORTED:
        return (view.running, view.queue, view.unreported)
    return (view.router_in_flight,)


def _parts_jobs(source: object, parts: tuple[Sequence[object], ...]) -> list[ReplayJob]:
    if source is StateSource.REPORTED:
        running, queue, unreported = parts
        return _jobs(StateSource.REPORTED, running, (*queue, *unreported))  # type: ignore[arg-type]  # parts are this policy's own state tuples
    return _jobs(StateSource.ROUTER_RECORD, (), parts[0])  # type: ignore[arg-type]  # parts are this policy's own state tuples


def backlog_jobs(view: PrefillNodeView, settings: TtftSettings) -> list[ReplayJob]:
    """What the node must prefill before a new request, in order (see "Stale state" above)."""
    source = state_source(view, settings)
    return _parts_jobs(source, _state_parts(view, source))


def _model(view: PrefillNodeView) -> PrefillNodeModel:
    if view.model is None:
        raise ValueError(f"prefill node {view.node} has no node model; the TTFT policy needs one per node")
    return view.model


def replay_backlog(view: PrefillNodeView, settings: TtftSettings) -> Backlog:
    """The node's backlog replayed once; `estimate_ttft` prices any request against it."""
    return replay_chunked_prefill(_model(view), backlog_jobs(view, settings), settings.chunk_tokens).backlog


def estimate_ttft(
    request: RouteRequest, view: PrefillNodeView, settings: TtftSettings, backlog: Backlog | None = None
) -> TtftEstimate:
    """T_n for `request` on the node of `view` (see the module docstring).

    `backlog` (from `replay_backlog` on the same view and settings) saves replaying the node's backlog.
    """
    view.check_pages(request)
    model = _model(view)
    page = request.page_tokens
    fetch_tokens = view.fetch_pages * page
    if settings.fetches(fetch_tokens):
        cached = request.usable_cached_tokens(view.cluster_prefix_pages)
    else:
        fetch_tokens = 0
        cached = request.usable_cached_tokens(view.own_pages)
    uncached = request.prompt_tokens - cached
    restore = cached - min(view.own_gpu_pages * page, cached)
    if settings.wait_model is WaitModel.REPLAY:
        if backlog is None:
            backlog = replay_backlog(view, settings)
        timing = append_job(model, backlog, ReplayJob(request.id, uncached, cached, restore))
        wait, service = timing.start, timing.service
    else:
        jobs = backlog_jobs(view, settings)
        wait = sum(model.prefill_request_time(Work(job.remaining_tokens, job.context_tokens, 0)) for job in jobs)
        service = model.prefill_request_time(Work(uncached, cached, request.output_tokens, request.t_acc))
    return TtftEstimate(
        node=view.node,
        own_pages=view.own_gpu_pages + view.own_host_pages,
        cached_tokens=cached,
        fetch_tokens=fetch_tokens,
        uncached_tokens=uncached,
        restore_tokens=restore,
        wait=wait,
        service=service,
        exposed_fetch=max(0.0, settings.fetch_time(fetch_tokens) - wait),
        copy_price=settings.copy_price_s_per_token * fetch_tokens,
        state=state_source(view, settings),
    )


class TtftRouter(RouterHooks):
    """Ours. Keeps no routing state: what it sent is in the views (`unreported`, `router_in_flight`).

    It keeps each node's replayed backlog (`backlogs.BacklogStore`: reused while the node's state objects and
    model stay the same, extended when requests were only added, replayed otherwise), so pricing a request
    costs only its own iterations per node. Given a `PrefillViewSet` it prices every node with linear models
    at once (`backlogs.append_columns`) and re-prices exactly, with the replay, only the nodes whose
    closed-form estimate lies within `APPEND_BOUND` of the best: the choice is the replay's, and the
    decision's diagnostics list only those nodes. Answers are identical with and without the store
    (`memoize_backlogs=False` replays every node's backlog for every request).
    """

    def __init__(self, settings: TtftSettings | None = None, memoize_backlogs: bool = True) -> None:
        self.settings = settings if settings is not None else TtftSettings()
        self.memoize_backlogs = memoize_backlogs
        self.backlogs = BacklogStore(self.settings.chunk_tokens, _parts_jobs, _queued_job)
        self._kept = KeptRows()

    @property
    def name(self) -> PrefillPolicyName:
        return PrefillPolicyName.TTFT

    def estimates(self, request: RouteRequest, nodes: Sequence[PrefillNodeView]) -> list[TtftEstimate]:
        unique_nodes(nodes, "prefill")
        return [estimate_ttft(request, view, self.settings, self._backlog(view)) for view in nodes]

    def _backlog(self, view: PrefillNodeView) -> Backlog | None:
        """The node's replayed backlog from the store (None: replay it afresh)."""
        if not self.memoize_backlogs or self.settings.wait_model is not WaitModel.REPLAY or view.model is None:
            return None
        source = state_source(view, self.settings)
        return self.backlogs.entry(view.node, source, view.model, _state_parts(view, source)).backlog

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        if (
            isinstance(nodes, PrefillViewSet)
            and self.memoize_backlogs
            and self.settings.wait_model is WaitModel.REPLAY
            and len(nodes) > 1
        ):
            estimates = self._columns_estimates(request, nodes)
        else:
            estimates = self.estimates(request, nodes)
        best = min(estimates, key=lambda e: (e.total, -e.own_pages, e.node))
        view = nodes.view_of(best.node) if isinstance(nodes, PrefillViewSet) else by_node(nodes, best.node)
        cluster = request.usable_cached_tokens(view.cluster_prefix_pages)
        fetching = best.fetch_tokens > 0
        return RoutingDecision(
            node=view.node,
            policy=self.name,
            reason=RouteReason.LOWEST_PREDICTED_TTFT,
            cached_tokens=best.cached_tokens,
            uncached_tokens=best.uncached_tokens,
            fetch_tokens=best.fetch_tokens,
            recompute_tokens=cluster - best.cached_tokens,
            fetch_from=view.fetch_sources if fetching else None,
            fetch_timing=FetchTiming.WHILE_QUEUED if fetching else FetchTiming.NONE,
            diagnostics=tuple(e.score() for e in estimates),
        )

    def _columns_estimates(self, request: RouteRequest, nodes: PrefillViewSet) -> list[TtftEstimate]:
        """Exact estimates of every node that can win: all nodes priced at once, the close ones re-priced."""
        ids = nodes.nodes
        if ids is not self._kept.ids and len(set(ids)) != len(ids):  # (the kept set's ids were checked)
            unique_nodes(nodes, "prefill")
        s = self.settings
        cols = nodes.prefix_columns()
        if len(cols.cluster) and int(cols.cluster.max()) > request.prompt_pages:
            nodes.view(int(cols.cluster.argmax())).check_pages(request)
        page, prompt = request.page_tokens, request.prompt_tokens
        fetch = cols.fetch * page
        fetching = fetch >= max(1, s.min_fetch_tokens)  # `s.fetches` (integer tokens)
        cached = np.minimum(np.where(fetching, cols.cluster, cols.own) * page, prompt - 1)
        fetch = np.where(fetching, fetch, 0)
        uncached = prompt - cached
        restore = cached - np.minimum(cols.gpu * page, cached)
        exact: list[TtftEstimate] = []
        linear: list[int] | None  # positions of the nodes priced in closed form (None: all of them)
        stamps = nodes.stamps()
        ints: np.ndarray | None = None
        if stamps is None:
            linear, table = self._rows_by_state(request, nodes, exact)
        else:
            kept = self._kept
            kept.refresh(ids, stamps, stamps.ages <= s.state_max_age_s, self._recompute(nodes))
            linear_mask = kept.linear
            if linear_mask.all():
                linear, table, ints = None, kept.table, kept.ints
            else:
                for i in np.flatnonzero(~linear_mask).tolist():
                    exact.append(estimate_ttft(request, nodes.view(i), s, kept.entries[i].backlog))
                linear = np.flatnonzero(linear_mask).tolist()
                table, ints = kept.table[linear], kept.ints[linear]
        if linear is None or linear:
            if linear is not None:  # only some nodes have rows: take theirs
                at = np.asarray(linear)
                uncached, cached, restore, fetch = uncached[at], cached[at], restore[at], fetch[at]
            start, finish = append_columns(table, uncached, cached, restore, s.chunk_tokens, ints)
            x = fetch
            tau = np.where(x > 0, s.fetch_fixed_s + s.fetch_per_token_s * x, 0.0)
            total = finish + np.maximum(0.0, tau - start) + s.copy_price_s_per_token * x
            # Each closed-form total is within APPEND_BOUND * (1 + |finish|) of the replay's (plus 1e-12 relative for
            # the sums above); with the largest such slack for every node, a node can win (or tie) only if its
            # total is at most the best upper bound plus that slack: re-price exactly those.
            slack = APPEND_BOUND * (1.0 + float(np.abs(finish).max())) + 1e-12 * (1.0 + float(np.abs(total).max()))
            best = float(total.min()) + slack
            if exact:
                best = min(best, min(e.total for e in exact))
            for k in np.flatnonzero(total <= best + slack).tolist():
                i = k if linear is None else linear[k]
                view = nodes.view(i)
                backlog = self._backlog(view) if stamps is None else self._kept.entries[i].backlog
                exact.append(estimate_ttft(request, view, s, backlog))
        return exact

    def _rows_by_state(
        self, request: RouteRequest, nodes: PrefillViewSet, exact: list[TtftEstimate]
    ) -> tuple[list[int], np.ndarray]:
        """(positions, rows) of the nodes with closed-form rows, from every node's state read afresh (a set that
        keeps no stamps); the others' exact estimates go to `exact`."""
        s = self.settings
        rows: list[tuple[float, ...]] = []
        linear: list[int] = []
        entry, max_age = self.backlogs.entry, s.state_max_age_s
        reported, record = StateSource.REPORTED, StateSource.ROUTER_RECORD
        by_report, by_record = self.backlogs.table(reported), self.backlogs.table(record)
        for i, (node, state) in enumerate(zip(nodes.nodes, nodes.states(), strict=True)):
            running, queue, unreported, in_flight, age, model = state
            if model is None:
                _model(nodes.view(i))
            # `state_source`, `_state_parts` and the store's unchanged-entry answer, inlined (once per node per
            # decision); anything else goes through `entry`
            if age is not None and age <= max_age:
                parts: tuple[Sequence[object], ...] = (running, queue, unreported)
                hit = by_report.get(node)
                if hit is None or hit.model is not model or hit.parts != parts:
                    hit = entry(node, reported, model, parts)  # type: ignore[arg-type]  # entry compares models by identity; None is fine
            else:
                parts = (in_flight,)
                hit = by_record.get(node)
                if hit is None or hit.model is not model or hit.parts != parts:
                    hit = entry(node, record, model, parts)  # type: ignore[arg-type]  # entry compares models by identity; None is fine
            if hit.row is None:
                exact.append(estimate_ttft(request, nodes.view(i), s, hit.backlog))
            else:
                rows.append(hit.row)
                linear.append(i)
        width = len(rows[0]) if rows else ROW_WIDTH  # np.fromiter over the flat values beats np.asarray of tuples
        table = np.fromiter(chain.from_iterable(rows), np.float64, len(rows) * width).reshape(len(rows), width)
        return linear, table

    def _recompute(self, nodes: PrefillViewSet) -> Callable[[int, bool], _Entry]:
        """For `KeptRows.refresh`: the store's entry of node i's state now (its report if `fresh`, else the
        router's record)."""
        entry = self.backlogs.entry

        def recompute(i: int, fresh: bool) -> _Entry:
            state = nodes.state(i)
            model = state.model
            if model is None:
                _model(nodes.view(i))
            source = StateSource.REPORTED if fresh else StateSource.ROUTER_RECORD
            return entry(nodes.nodes[i], source, model, _state_parts(state, source))  # type: ignore[arg-type]  # checked just above

        return recompute
