"""The TTFT policy's kept per-node rows (`KeptRows`, over `TrackViews.stamps`) choose what the full queue replay
chooses, whatever happens to the nodes between decisions: requests sent, finished, re-routed or changed, reports
and forgotten reports, reports going stale as time passes, new node models (with and without a closed form), a
node's `sent` replaced, nodes leaving and joining the candidate set, and pickled copies of the whole state."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from evolving_infra.core.itermodel import PrefillCoefficients, PrefillItem
from evolving_infra.core.pages import chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Tier, Work
from evolving_infra.router.core import NodeTrack, RoutedRequest
from evolving_infra.router.core.tracking import SentRequests
from evolving_infra.router.core.views import prefill_views
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.routing import CoefficientPrefillModel, RouteRequest, RunningPrefill, TtftRouter, TtftSettings
from evolving_infra.router.routing.inputs import StaticViews
from evolving_infra.router.routing.ttft import replay_backlog

PT = 64
NODES = [NodeId(f"p{i}") for i in range(5)]
PAGES = tuple(chain_hashes(f"sys:{i}".encode() for i in range(40)))


class NoClosedForm:
    """Eq. 1 without `linear_coefficients()`: the policy must price it by replay."""

    def __init__(self, coef: PrefillCoefficients) -> None:
        self._inner = CoefficientPrefillModel(coef)

    def prefill_request_time(self, work: Work) -> float:
        return self._inner.prefill_request_time(work)

    def prefill_iteration_time(self, items: Sequence[PrefillItem]) -> float:
        return self._inner.prefill_iteration_time(items)


def _model(kind: int) -> object:
    coef = [PrefillCoefficients(0.02, 2e-5, 1e-10, 1e-6), PrefillCoefficients(0.01, 3e-5, 2e-10, 0.0)][kind % 2]
    return NoClosedForm(coef) if kind >= 2 else CoefficientPrefillModel(coef)


def _routed(rid: str, uncached: int, cached: int) -> RoutedRequest:
    route = RouteRequest(RequestId(rid), BranchId("b"), (), uncached + cached, 50, page_tokens=PT)
    req = RoutedRequest(route, (), 1)
    req.routed_cached = cached
    req.routed_restore = cached // 3
    return req


ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 4), st.integers(1, 20_000), st.integers(0, 4_000)),
        st.tuples(st.just("finish"), st.integers(0, 4), st.just(0), st.just(0)),
        st.tuples(st.just("reroute"), st.integers(0, 4), st.integers(0, 4_000), st.just(0)),
        st.tuples(st.just("report"), st.integers(0, 4), st.integers(0, 9_000), st.integers(0, 3)),
        st.tuples(st.just("forget"), st.integers(0, 4), st.just(0), st.just(0)),
        st.tuples(st.just("time"), st.just(0), st.sampled_from([0.5, 2.0, 4.0, 7.0]), st.just(0)),
        st.tuples(st.just("model"), st.integers(0, 4), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("replace"), st.integers(0, 4), st.just(0), st.just(0)),
        st.tuples(st.just("leave"), st.integers(0, 4), st.just(0), st.just(0)),
        st.tuples(st.just("pickle"), st.just(0), st.just(0), st.just(0)),
        st.tuples(st.just("route"), st.integers(1, 40), st.integers(0, 63), st.integers(0, 1)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops)
@example([("report", 0, 500, 0), ("route", 10, 0, 0), ("report", 0, 9000, 0), ("route", 10, 0, 0)])  # a new report
@example([("report", 0, 9000, 0), ("route", 10, 0, 0), ("time", 0, 7.0, 0), ("route", 10, 0, 0)])  # it goes stale
@example([("send", 0, 900, 0), ("route", 10, 0, 0), ("model", 0, 1, 0), ("route", 10, 0, 0)])  # a new model
@example([("route", 10, 0, 0), ("replace", 0, 5000, 0), ("route", 10, 0, 0)])  # a new `sent`, same version
def test_kept_rows_choose_what_the_full_replay_chooses(steps: list[tuple[str, int, float, int]]) -> None:
    directory = KvDirectory()
    directory.store(NODES[0], Tier.GPU, None, PAGES[:30], 0.0)
    directory.store(NODES[1], Tier.HOST, None, PAGES, 0.0)
    directory.store(NODES[2], Tier.GPU, None, PAGES[:10], 0.0)
    tracks = {n: NodeTrack(n, Phase.PREFILL, mode=NodeMode.PREFILL) for n in NODES}
    models: dict[NodeId, object] = {n: _model(i) for i, n in enumerate(NODES)}
    kept = TtftRouter(TtftSettings(min_fetch_tokens=512))
    away: set[NodeId] = set()
    now, sent = 0.0, 0
    for op, a, b, c in steps:
        node = NODES[a % len(NODES)]
        track = tracks[node]
        if op == "send":
            sent += 1
            track.sent[f"q{sent}"] = _routed(f"q{sent}", int(b), c)
        elif op == "finish" and track.sent:
            track.sent.pop(next(iter(track.sent)))
        elif op == "reroute" and track.sent:
            req = track.sent[next(reversed(track.sent))]
            track.rerouting(req.id)
            req.routed_cached = min(int(b), req.route.prompt_tokens)
        elif op == "report":
            running = (RunningPrefill(RequestId(f"run{a}"), int(b), 300),) if b else ()
            track.record_report(now, running, tuple(list(track.sent)[:c]))
        elif op == "forget":
            track.forget_report()
        elif op == "time":
            now += b
        elif op == "model":
            models[node] = _model(int(b))
        elif op == "replace":  # a new dict with one more request, built whole: its version may equal the old one's
            sent += 1
            track.sent = SentRequests({**track.sent, f"q{sent}": _routed(f"q{sent}", int(b) + 1, 0)})
        elif op == "leave":
            away ^= {node}
        elif op == "pickle":
            tracks, models, kept = pickle.loads(pickle.dumps((tracks, models, kept)))
        elif op == "route":
            pages = PAGES[:a]
            req = RouteRequest(RequestId("new"), BranchId("x"), pages, a * PT + c * 17, 100, page_tokens=PT)
            candidates = [t for n, t in tracks.items() if n not in away]
            if not candidates:
                continue
            match = directory.lookup(pages)
            views = prefill_views(candidates, match, now, shared_pool=True, models=models)
            assert views.stamps() is not None
            chosen = kept.route(req, views, now)
            for i in range(len(views) if len(views) > 1 else 0):  # every node's kept backlog is its replay now,
                if views.view(i).model is not None:  # the winner's or not (a single node is priced directly)
                    assert kept._kept.entries[i].backlog == replay_backlog(views.view(i), kept.settings)
            built = [views.view(i) for i in range(len(views))]
            replayed = TtftRouter(kept.settings, memoize_backlogs=False).route(req, built, now)
            unkept = TtftRouter(kept.settings).route(req, StaticViews(built), now)
            for other in (replayed, unkept):
                assert chosen.node == other.node
                assert chosen.score_of(chosen.node) == other.score_of(other.node)
                assert (chosen.cached_tokens, chosen.fetch_tokens) == (other.cached_tokens, other.fetch_tokens)


def test_a_decision_after_nothing_changed_recomputes_no_node() -> None:
    tracks = [NodeTrack(n, Phase.PREFILL, mode=NodeMode.PREFILL) for n in NODES]
    models = {n: _model(0) for n in NODES}
    for i, t in enumerate(tracks):
        t.sent[f"q{i}"] = _routed(f"q{i}", 1000 * (i + 1), 0)
    router = TtftRouter()
    req = RouteRequest(RequestId("new"), BranchId("x"), PAGES[:4], 4 * PT, 10, page_tokens=PT)
    match = KvDirectory().lookup(PAGES[:4])
    first = router.route(req, prefill_views(tracks, match, 0.0, shared_pool=True, models=models), 0.0)
    assert first.node == NODES[0]  # the shortest backlog
    assert router._kept.recomputed == len(NODES)
    router.route(req, prefill_views(tracks, match, 0.1, shared_pool=True, models=models), 0.1)
    assert router._kept.recomputed == len(NODES)
    tracks[0].sent["late"] = _routed("late", 50_000, 0)
    after = router.route(req, prefill_views(tracks, match, 0.2, shared_pool=True, models=models), 0.2)
    assert router._kept.recomputed == len(NODES) + 1
    assert after.node == NODES[1]  # the change was seen


def test_a_plain_dict_sent_keeps_no_stamps() -> None:
    track = NodeTrack(NODES[0], Phase.PREFILL, mode=NodeMode.PREFILL)
    track.sent = {"a": _routed("a", 100, 0)}  # type: ignore[assignment]  # by hand, as a test might
    views = prefill_views([track], KvDirectory().lookup(PAGES[:2]), 0.0, shared_pool=True, models={})
    assert views.stamps() is None
