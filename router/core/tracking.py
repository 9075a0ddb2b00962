"""What the router keeps per request and per node between decisions (its own record, beside the nodes' reports).

- `RoutedRequest`: one request from its admission (E.1) until it leaves: where its prefill and decode run,
  what the routing decision assumed (cached and restored tokens), the decode KV it reserved.
- `NodeTrack`: one node as the router knows it: the mode it serves (None while it serves nothing), a switch in
  flight (`target`), the prefill requests sent and not finished (`sent`, in sending order), the node's last
  report of its prefill batch and queue (`report_*`, taken at an iteration launch), the decode requests
  running there or bound to it, its pool gauges (`PoolSnapshot`), its model fitter during warmup and the usage
  counts t̄_n and f_n are remeasured from.

A driver supplies the node's mode and pool: the live service from the node's state reports, the simulator
from the engine itself (it overrides `current_mode` and `current_pool`).

Invariant: a request is in at most one node's `sent` (its `prefill_node`) and at most one node's
`decode_jobs` or `bound` (its `decode_node`); `reserved_tokens` is the sum of `reserved` over `bound`.

Boundary: plain state and small queries; decisions are `RouterCore`'s.
"""

from __future__ import annotations

import threading
from collections import deque
from itertools import count
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Work
from evolving_infra.core.fetch import FetchRun
from evolving_infra.router.fitting import ModelFitter, UsageCounts
from evolving_infra.router.routing import QueuedPrefill, RouteRequest, RunningPrefill

if TYPE_CHECKING:
    from _typeshed import SupportsKeysAndGetItem


_COLLOCATED, _PREFILL_MODE, _DECODE_MODE = NodeMode.COLLOCATED, NodeMode.PREFILL, NodeMode.DECODE


def serves(mode: NodeMode, phase: Phase) -> bool:
    """Whether a node in `mode` serves `phase` (collocated serves both): identity checks only (an enum's
    `.value` is a Python-level property, and this runs for every node at every routing decision)."""
    return mode is _COLLOCATED or mode is (_PREFILL_MODE if phase is Phase.PREFILL else _DECODE_MODE)


_ACCEPT_PREFILL = ((_COLLOCATED, _PREFILL_MODE), (None, _COLLOCATED, _PREFILL_MODE))
_ACCEPT_DECODE = ((_COLLOCATED, _DECODE_MODE), (None, _COLLOCATED, _DECODE_MODE))


def accept_rule(phase: Phase) -> tuple[tuple[NodeMode, ...], tuple[NodeMode | None, ...]]:
    """(modes, targets): a node takes new work of `phase` when the mode it serves is one of `modes` and its switch
    target (None: no switch) one of `targets`, i.e. both serve `phase`. Tuples of members, tested with `in`
    (identity first): callers check every node at every decision."""
    return _ACCEPT_PREFILL if phase is Phase.PREFILL else _ACCEPT_DECODE


@dataclass(eq=False)
class RoutedRequest:
    """The router's record of one request (see the module docstring)."""

    route: RouteRequest
    prompt_pages: tuple[PageHash, ...]
    version: int
    attempt: int = 0
    """Bumped every time the request is re-routed or re-bound (stale replies of earlier attempts are ignored)."""
    prefill_node: NodeId | None = None
    decode_node: NodeId | None = None
    routed_cached: int = 0
    routed_restore: int = 0
    prefill_started: bool = False
    prefill_done: bool = False
    recorded_cached: int | None = None
    """The cached tokens its prefill work went into the planner's slice with (once, when it arrived: its first
    routing); None until then."""
    work_measured: bool = False
    """Whether its first prefill start corrected that work with the cached tokens its prefill node reused."""
    reserved: int = 0
    """Decode KV tokens reserved on `decode_node` until the KV is submitted there."""
    fetch_plan: tuple[FetchRun, ...] = ()
    """What its prefill node pulls from peers (the last routing's plan)."""
    _queued: tuple[int, int, RouteRequest, QueuedPrefill] | None = field(default=None, init=False, repr=False)
    """(routed_cached, routed_restore, route, its `queued_view`) of the last `queued_view`."""

    @property
    def id(self) -> str:
        return str(self.route.id)

    @property
    def request_id(self) -> RequestId:
        return self.route.id

    @property
    def branch(self) -> BranchId:
        return self.route.branch

    def queued_view(self) -> QueuedPrefill:
        """The request as the router records it: its routed work (the same object while that stays the same)."""
        cached, restore, route = self.routed_cached, self.routed_restore, self.route
        kept = self._queued
        if kept is not None and kept[0] == cached and kept[1] == restore and kept[2] is route:
            return kept[3]
        work = Work(route.prompt_tokens - cached, cached, route.output_tokens, route.t_acc)
        view = QueuedPrefill(route.id, work, min(restore, cached))
        self._queued = (cached, restore, route, view)
        return view


_T = TypeVar("_T")
_SentViews = tuple[
    int | None, tuple[QueuedPrefill, ...], frozenset[str] | None, tuple[QueuedPrefill, ...], dict[str, RoutedRequest]
]
"""`NodeTrack._sent_views`: (sent version, in flight, report ids, unreported, the `sent` they were built from)."""


_VERSIONS = count(1)
"""Where every `SentRequests.version` and `NodeTrack.report_version` is drawn from (one source per process)."""
_VERSIONS_LOCK = threading.Lock()


def next_version() -> int:
    """A version no holder of node state in this process has had: each change of a `SentRequests` or of a
    track's report draws one, so equal versions mean the same state even across replaced or copied holders.
    (Locked with `_seen_version`, which replaces the source, so no thread draws from a source being replaced.)"""
    with _VERSIONS_LOCK:
        return next(_VERSIONS)


def _seen_version(version: int) -> None:
    """A holder was restored with `version` (unpickled or copied): later versions are drawn above it."""
    global _VERSIONS
    with _VERSIONS_LOCK:
        _VERSIONS = count(max(next(_VERSIONS), version) + 1)  # (the version drawn here is given to nobody)


class SentRequests(dict[str, RoutedRequest]):
    """`NodeTrack.sent`: a dict whose `version` changes with every call that may change it, drawn from
    `next_version` (so two `SentRequests` with the same version hold the same requests: a copy keeps its
    original's version until either changes), so what is built from it can be reused until it changes
    (`NodeTrack.sent_views`, the TTFT policy's kept rows)."""

    version: int

    def __init__(self, *args: Any, **kwargs: RoutedRequest) -> None:
        super().__init__(*args, **kwargs)
        self.version = next_version()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _seen_version(self.version)

    def touch(self) -> None:
        """A request in it changed its routed work (what `RoutedRequest.queued_view` reads)."""
        self.version = next_version()

    def __setitem__(self, key: str, value: RoutedRequest) -> None:
        self.version = next_version()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.version = next_version()
        super().__delitem__(key)

    def __ior__(self, other: SupportsKeysAndGetItem[str, RoutedRequest]) -> Self:  # type: ignore[override,misc]  # mapping form only
        self.version = next_version()
        return super().__ior__(other)

    @overload
    def pop(self, key: str, /) -> RoutedRequest: ...
    @overload
    def pop(self, key: str, default: RoutedRequest | _T, /) -> RoutedRequest | _T: ...
    def pop(self, key: str, /, *default: Any) -> Any:
        self.version = next_version()
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, RoutedRequest]:
        self.version = next_version()
        return super().popitem()

    def clear(self) -> None:
        self.version = next_version()
        super().clear()

    def update(self, *args: Any, **kwargs: RoutedRequest) -> None:
        self.version = next_version()
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: RoutedRequest) -> RoutedRequest:
        self.version = next_version()
        return super().setdefault(key, default)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Page counts of a node's KV tiers the router reads (from a state report)."""

    page_tokens: int
    l1_free: int = 0
    l1_cached: int = 0
    l1_pinned: int = 0
    l2_cached: int = 0
    l2_pinned: int = 0

    @property
    def cached_pages(self) -> int:
        """Everything the node caches (a tie-break of the Dynamo baseline)."""
        return self.l1_cached + self.l1_pinned + self.l2_cached + self.l2_pinned

    @property
    def room_tokens(self) -> int:
        """KV tokens a decode node can still take: its free and evictable GPU pages."""
        return (self.l1_free + self.l1_cached) * self.page_tokens


@dataclass(eq=False)
class NodeTrack:
    """The router's record of one node (see the module docstring)."""

    id: NodeId
    phase: Phase | None
    """Phase served; None while collocated (warmup) or serving nothing."""
    target: NodeMode | None = None
    """Mode being switched to (draining or relaunching); None otherwise."""
    mode: NodeMode | None = None
    """Mode last reported; None while the node serves nothing (down, relaunching, never reported)."""
    pool: PoolSnapshot | None = None
    sent: SentRequests = field(default_factory=SentRequests)
    """Prefill requests sent to the node whose prefill has not finished, in sending order."""
    report_time: float | None = None
    report_running: tuple[RunningPrefill, ...] = ()
    report_queue: tuple[QueuedPrefill, ...] = ()
    report_ids: frozenset[str] = frozenset()
    decode_jobs: dict[str, RoutedRequest] = field(default_factory=dict)
    """Decode requests submitted here and not finished."""
    bound: dict[str, RoutedRequest] = field(default_factory=dict)
    """Requests bound to this decode node whose KV has not been submitted here yet."""
    reserved_tokens: int = 0
    prealloc: deque[RoutedRequest] = field(default_factory=deque)
    """Requests bound at routing that wait for their KV reservation here (the SGLang baseline's pre-allocation)."""
    fitter: ModelFitter | None = None
    usage: UsageCounts = field(default_factory=UsageCounts)
    report_version: int = field(default=0, init=False, repr=False)
    """Changes (from `next_version`) with the `report_*` fields (`record_report`, `forget_report`) and is drawn
    afresh for every new track, so equal versions mean the same report."""
    _sent_views: _SentViews | None = field(default=None, init=False, repr=False)
    """(sent version, in flight, report ids, unreported) of the last `sent_views`."""

    def __post_init__(self) -> None:
        if not isinstance(self.sent, SentRequests):
            self.sent = SentRequests(self.sent)
        self.report_version = next_version()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _seen_version(self.report_version)

    # -- what the driver supplies --------------------------------------------------------------------
    def current_mode(self) -> NodeMode | None:
        """The mode the node serves now (None: it serves nothing)."""
        return self.mode

    def current_pool(self) -> PoolSnapshot | None:
        return self.pool

    def current_room_tokens(self) -> int:
        """`current_pool().room_tokens` (0 without a pool): KV tokens a decode node can still take, before
        reservations. A driver that reads its engines directly answers it without the snapshot."""
        pool = self.current_pool()
        return 0 if pool is None else pool.room_tokens

    # -- queries -------------------------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self.current_mode() is not None

    @property
    def draining(self) -> bool:
        return self.serving and self.target is not None

    def accepts(self, phase: Phase) -> bool:
        """Whether new work of `phase` may be sent now (mirrors the engine's refusal rules; see `accept_rule`)."""
        modes, targets = accept_rule(phase)
        return self.current_mode() in modes and self.target in targets

    def serving_phase(self) -> Phase:
        """The phase the node counts in for the planner: its switch target while switching."""
        if self.target is not None:
            return Phase(self.target.value)
        if self.phase is None:
            raise ValueError(f"node {self.id} serves no phase yet (collocated or down)")
        return self.phase

    def move_cost(self) -> float:
        """Requests the node would have to finish (or lose) if it moved now."""
        return float(len(self.sent) + len(self.decode_jobs))

    def sent_views(self) -> tuple[tuple[QueuedPrefill, ...], tuple[QueuedPrefill, ...]]:
        """(unreported, in flight): the requests of `sent` the last report did not list, and all of them, each as
        the router records it (`queued_view`). Reused until `sent` changes (its version, or another dict is put
        there) or a report comes."""
        sent, ids = self.sent, self.report_ids
        version = getattr(sent, "version", None)  # a plain dict put here by hand is never reused
        cache = self._sent_views
        if version is None or cache is None or cache[0] != version or cache[4] is not sent:  # `sent` may be replaced
            cache = (version, tuple(r.queued_view() for r in sent.values()), None, (), sent)
        if cache[2] is not ids:
            unreported = tuple(q for q, rid in zip(cache[1], sent, strict=True) if rid not in ids)
            cache = (version, cache[1], ids, unreported, sent)
        self._sent_views = cache
        return cache[3], cache[1]

    def rerouting(self, rid: str) -> None:
        """Request `rid` is being routed again: if it is still in `sent`, its routed work changes there."""
        if rid in self.sent and isinstance(self.sent, SentRequests):
            self.sent.touch()

    def record_report(self, now: float, running: tuple[RunningPrefill, ...], queued_ids: tuple[str, ...]) -> None:
        """The node's report at an iteration launch: its running prefills and the ids queued, in order."""
        self.report_version = next_version()
        self.report_time = now
        self.report_running = running
        sent = self.sent
        if not sent:
            self.report_queue, self.report_ids = (), _NO_IDS
            return
        queue: list[QueuedPrefill] = []
        if queued_ids:
            views = dict(zip(sent, self.sent_views()[1], strict=True))
            queue = [views[rid] for rid in queued_ids if rid in views]
        self.report_queue = tuple(queue)
        # Requests sent and not listed were still on their way to the node (live; never in the simulator, which
        # submits at once): they stay unreported, so routing counts them on top of the report.
        listed = set(queued_ids)
        listed.update(r.request for r in running)
        self.report_ids = frozenset(rid for rid in sent if rid in listed)

    def forget_report(self) -> None:
        self.report_version = next_version()
        self.report_running, self.report_queue, self.report_ids, self.report_time = (), (), _NO_IDS, None


_NO_IDS: frozenset[str] = frozenset()
