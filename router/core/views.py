"""What the routing policies and the planner read, built from the router's tracks of the nodes.

- `prefill_views`: the views of all candidate prefill nodes for one request as a `PrefillViewSet` (each view
  built only when read; the prefix fields of all of them as arrays from one pass over the match).
- `prefill_view`: the KV directory's prefix match for one node (own GPU and host prefix, reachable cluster
  prefix, fetch plan), the node's last report (running batch, queue, its age), the requests sent since that
  report (`unreported`), everything sent and not yet prefilled (`router_in_flight`), the node's model and
  its cached pages. With private host memory only the node's own KV counts (nothing is fetched).
- `decode_view`: running plus bound requests, and the KV room left after reservations.
- `node_load`: the momentary signals of the queue-driven planners (zero for a node serving nothing).

Boundary: pure reads of `NodeTrack`s; nothing here changes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter

import numpy as np

from evolving_infra.core.types import NodeId
from evolving_infra.router.planner import NodeLoad
from evolving_infra.router.prefix_match import PrefixMatch
from evolving_infra.router.routing import DecodeNodeView, PrefillNodeView, PrefillNodeModel
from evolving_infra.router.routing.inputs import (
    PrefillNodeState,
    PrefillStateRow,
    PrefillViewSet,
    PrefixColumns,
    StateStamps,
)
from evolving_infra.router.routing.decode import kv_tokens_needed
from evolving_infra.router.core.tracking import NodeTrack, RoutedRequest

_ID = attrgetter("id")
_LAST_IDS: list[tuple[NodeId, ...]] = []
"""The node ids of the last `TrackViews` built (one tuple, reused while the candidates stay the same)."""
_SENT_VERSION, _REPORT_VERSION, _REPORT_TIME = (
    attrgetter("sent.version"), attrgetter("report_version"), attrgetter("report_time"))


def prefill_view(
    node: NodeTrack, match: PrefixMatch, now: float, *, shared_pool: bool, model: PrefillNodeModel | None
) -> PrefillNodeView:
    gpu = match.gpu_pages(node.id)
    either = match.either_pages(node.id)
    plan = match.fetch_plan(node.id)
    cluster = max(plan.reachable, either)
    runs = plan.runs
    fetch_pages = plan.fetch_pages
    if not shared_pool:  # private host memory: only the node's own KV is reusable
        runs, fetch_pages, cluster = (), 0, either
    unreported, in_flight = node.sent_views()
    pool = node.current_pool()
    return PrefillNodeView(
        node=node.id,
        own_gpu_pages=gpu,
        own_host_pages=max(0, either - gpu),
        cluster_prefix_pages=cluster,
        fetch_pages=fetch_pages,
        fetch_sources=runs,
        running=node.report_running,
        queue=node.report_queue,
        unreported=unreported,
        router_in_flight=in_flight,
        state_age_s=None if node.report_time is None else max(0.0, now - node.report_time),
        model=model,
        cached_pages=0 if pool is None else pool.cached_pages,
    )


class TrackViews(PrefillViewSet):
    """`prefill_view` of each of `tracks`, built when read (see `PrefillViewSet`)."""

    __slots__ = ("_tracks", "_match", "_now", "_shared", "_models", "_ids", "_views", "_columns")

    def __init__(
        self,
        tracks: Sequence[NodeTrack],
        match: PrefixMatch,
        now: float,
        *,
        shared_pool: bool,
        models: Mapping[NodeId, object],
    ) -> None:
        self._tracks = tracks
        self._match = match
        self._now = now
        self._shared = shared_pool
        self._models = models
        ids = tuple(map(_ID, tracks))
        last = _LAST_IDS[0] if _LAST_IDS else None  # read once: another thread may replace it
        if last is not None and last == ids:  # the same candidates as last time: the same tuple, so what
            ids = last  # policies keep per candidate set is found by identity
        else:
            _LAST_IDS[:] = [ids]
        self._ids = ids
        self._views: list[PrefillNodeView | None] = [None] * len(tracks)
        self._columns: PrefixColumns | None = None

    @property
    def nodes(self) -> tuple[NodeId, ...]:
        return self._ids

    def view(self, i: int) -> PrefillNodeView:
        view = self._views[i]
        if view is None:
            track = self._tracks[i]
            model = self._models.get(track.id)
            view = prefill_view(track, self._match, self._now, shared_pool=self._shared, model=model)  # type: ignore[arg-type]  # router models are opaque here
            self._views[i] = view
        return view

    def prefix_columns(self) -> PrefixColumns:
        if self._columns is None:
            gpu, either, reach, fetch = self._match.columns(self._ids)
            if self._shared:
                cluster = np.maximum(reach, either)
            else:
                cluster, fetch = either, np.zeros_like(fetch)
            self._columns = PrefixColumns(gpu=gpu, own=np.maximum(gpu, either), cluster=cluster, fetch=fetch)
        return self._columns

    def states(self) -> list[PrefillStateRow]:
        now, models = self._now, self._models
        out: list[PrefillStateRow] = []
        for track in self._tracks:
            # `track.sent_views()`, its cache hit inlined (this runs for every node at every decision)
            cache, sent = track._sent_views, track.sent
            version = getattr(sent, "version", None)
            if cache is not None and version is not None and cache[0] == version and cache[2] is track.report_ids \
                    and cache[4] is sent:  # fmt: skip
                unreported, in_flight = cache[3], cache[1]
            else:
                unreported, in_flight = track.sent_views()
            at = track.report_time
            age = None if at is None else now - at
            out.append((track.report_running, track.report_queue, unreported, in_flight,  # type: ignore[arg-type]  # router models are opaque here
                        age if age is None or age > 0.0 else 0.0, models.get(track.id)))  # fmt: skip
        return out

    def stamps(self) -> StateStamps | None:
        """Each track's `sent.version` and `report_version` (drawn from one source, so no holders to compare), report
        ages and models; None when a track's `sent` keeps no version (a plain dict put there by hand)."""
        tracks, n = self._tracks, len(self._tracks)
        versions = np.empty((n, 2), np.int64)
        try:
            versions[:, 0] = np.fromiter(map(_SENT_VERSION, tracks), np.int64, n)
        except AttributeError:
            return None
        versions[:, 1] = np.fromiter(map(_REPORT_VERSION, tracks), np.int64, n)
        at = np.fromiter(map(_REPORT_TIME, tracks), np.float64, n)  # None (never reported) becomes NaN
        return StateStamps((), versions, self._now - at, list(map(self._models.get, self._ids)))

    def state(self, i: int) -> PrefillNodeState:
        track = self._tracks[i]
        unreported, in_flight = track.sent_views()
        age = None if track.report_time is None else max(0.0, self._now - track.report_time)
        return PrefillNodeState(
            track.report_running, track.report_queue, unreported, in_flight, age, self._models.get(track.id)  # type: ignore[arg-type]  # router models are opaque here
        )


def prefill_views(
    tracks: Sequence[NodeTrack],
    match: PrefixMatch,
    now: float,
    *,
    shared_pool: bool,
    models: Mapping[NodeId, object],
) -> TrackViews:
    """The views of `tracks` for one request (`prefill_view` each), as a lazily built `PrefillViewSet`."""
    return TrackViews(tracks, match, now, shared_pool=shared_pool, models=models)


def kv_room_tokens(node: NodeTrack) -> int:
    """KV tokens a decode node can still take: free and evictable GPU pages, less what is reserved."""
    return max(0, node.current_room_tokens() - node.reserved_tokens)


def decode_view(node: NodeTrack) -> DecodeNodeView:
    # (positional: keywords cost twice as much, and a binding makes one view per decode node)
    return DecodeNodeView(node.id, len(node.decode_jobs) + len(node.bound), kv_room_tokens(node))


def decode_need(req: RoutedRequest) -> int:
    """Decode KV tokens the request needs (prompt + output)."""
    return kv_tokens_needed(req.route)


def node_load(node: NodeTrack, *, context_length: int, kv_capacity_tokens: int) -> NodeLoad:
    """The momentary signals Dynamo's and Arrow's planners read (zero for a node that is not serving)."""
    if not node.serving:
        return NodeLoad(context_length=context_length, kv_capacity_tokens=kv_capacity_tokens)
    queued = [r for r in node.sent.values() if not r.prefill_started]
    queued_tokens = sum(r.route.prompt_tokens - r.routed_cached for r in queued)
    inputs = tuple(r.route.prompt_tokens for r in node.sent.values())
    decode = list(node.decode_jobs.values()) + list(node.bound.values()) + list(node.prealloc)
    kv = sum(decode_need(r) for r in decode)
    return NodeLoad(
        queued_prefill_tokens=queued_tokens,
        context_length=context_length,
        decode_kv_tokens=kv,
        kv_capacity_tokens=kv_capacity_tokens,
        queued_prefill_inputs=inputs,
        decode_requests=len(decode),
    )
