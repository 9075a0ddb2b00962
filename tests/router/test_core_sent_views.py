"""The router's per-node views of the requests it sent (`NodeTrack.sent_views`, `record_report`) are reused until
`sent` changes or a report comes, and always equal the views built afresh from `sent` and the last report."""

from __future__ import annotations

import copy
import random
import pickle

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.types import BranchId, NodeId, Phase, RequestId
from evolving_infra.router.core import NodeTrack, RoutedRequest
from evolving_infra.router.core.tracking import SentRequests
from evolving_infra.router.routing import QueuedPrefill, RouteRequest

PT = 64
RIDS = [f"r{i}" for i in range(6)]


def _request(rid: str, cached: int) -> RoutedRequest:
    route = RouteRequest(RequestId(rid), BranchId("b"), (), 1000, 10, page_tokens=PT)
    req = RoutedRequest(route, (), 1)
    req.routed_cached = cached
    req.routed_restore = cached // 2
    return req


def _fresh(node: NodeTrack) -> tuple[tuple[QueuedPrefill, ...], tuple[QueuedPrefill, ...]]:
    """The views built from scratch, as the router did before they were reused."""
    unreported = tuple(r.queued_view() for rid, r in node.sent.items() if rid not in node.report_ids)
    return unreported, tuple(r.queued_view() for r in node.sent.values())


ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from(RIDS), st.integers(0, 900)),
        st.tuples(st.just("pop"), st.sampled_from(RIDS), st.just(0)),
        st.tuples(st.just("delete"), st.sampled_from(RIDS), st.just(0)),
        st.tuples(st.just("report"), st.sampled_from(RIDS), st.integers(0, 63)),
        st.tuples(st.just("reroute"), st.sampled_from(RIDS), st.integers(0, 900)),
        st.tuples(st.just("update"), st.sampled_from(RIDS), st.integers(0, 900)),
        st.tuples(st.just("clear"), st.just(""), st.just(0)),
        st.tuples(st.just("forget"), st.just(""), st.just(0)),
        st.tuples(st.just("copy"), st.just(""), st.integers(0, 1)),
    ),
    max_size=40,
)


@given(ops)
def test_sent_views_equal_views_built_afresh(steps: list[tuple[str, str, int]]) -> None:
    node = NodeTrack(NodeId("p0"), Phase.PREFILL)
    assert isinstance(node.sent, SentRequests)
    for op, rid, arg in steps:
        if op == "send":
            node.sent[rid] = _request(rid, arg)
        elif op == "pop":
            node.sent.pop(rid, None)
        elif op == "delete" and rid in node.sent:
            del node.sent[rid]
        elif op == "report":  # a report lists a subset of what was sent, in sending order
            queued = tuple(r for i, r in enumerate(node.sent) if arg >> i & 1) + ("unknown",)
            node.record_report(1.0, (), queued)
            assert node.report_queue == tuple(node.sent[r].queued_view() for r in queued if r in node.sent)
            assert node.report_ids == frozenset(r for r in node.sent if r in queued)  # the rest is still on its way
        elif op == "reroute" and rid in node.sent:  # its routed work changes while it is still listed
            node.rerouting(rid)
            node.sent[rid].routed_cached = arg
            node.sent[rid].routed_restore = 0
        elif op == "update":
            node.sent.update({rid: _request(rid, arg)})
        elif op == "clear":
            node.sent.clear()
        elif op == "forget":
            node.forget_report()
        elif op == "copy":
            node = copy.deepcopy(node) if arg % 2 == 0 else pickle.loads(pickle.dumps(node))
        assert node.sent_views() == _fresh(node)


def test_views_are_reused_until_sent_changes_or_a_report_comes() -> None:
    node = NodeTrack(NodeId("p0"), Phase.PREFILL)
    node.sent["a"] = _request("a", 64)
    first = node.sent_views()
    assert node.sent_views()[1] is first[1] and node.sent_views()[0] is first[0]
    node.record_report(1.0, (), ("a",))
    after_report = node.sent_views()
    assert after_report[1] is first[1] and after_report == ((), first[1])
    node.sent["b"] = _request("b", 0)
    assert node.sent_views() == _fresh(node) and len(node.sent_views()[0]) == 1


def test_a_plain_dict_put_in_by_hand_is_read_afresh_every_time() -> None:
    node = NodeTrack(NodeId("p0"), Phase.PREFILL, sent={"a": _request("a", 0)})  # type: ignore[arg-type]
    assert isinstance(node.sent, SentRequests)
    node.sent = {"b": _request("b", 0)}  # type: ignore[assignment]
    assert node.sent_views() == _fresh(node)
    node.sent["c"] = _request("c", 64)
    assert node.sent_views() == _fresh(node)


def test_another_sent_dict_with_the_same_version_is_read_afresh() -> None:
    node = NodeTrack(NodeId("p0"), Phase.PREFILL)
    assert node.sent_views() == ((), ())
    replaced = SentRequests({"a": _request("a", 0)})
    replaced.version = node.sent.version  # versions are unique (see below); the cache also checks the dict itself
    node.sent = replaced
    assert node.sent_views() == _fresh(node) and len(node.sent_views()[1]) == 1
    node.record_report(1.0, (), ())
    assert node.sent_views() == _fresh(node)


def test_serves_is_the_mode_phase_relation() -> None:
    """`serves` (identity checks) against its definition, for every mode and phase."""
    from evolving_infra.core.types import NodeMode, Phase
    from evolving_infra.router.core.tracking import serves

    for mode in NodeMode:
        for phase in Phase:
            assert serves(mode, phase) == (mode is NodeMode.COLLOCATED or mode.value == phase.value)


def test_accepts_is_serving_the_phase_in_mode_and_switch_target() -> None:
    """`accepts` (and the core's inlined `accepting`) against its definition, for every mode, target and phase."""
    from evolving_infra.core.types import NodeMode, Phase
    from evolving_infra.router.core import RouterCore
    from evolving_infra.router.core.tracking import serves
    from evolving_infra.router.routing import make_decode_binder, make_prefill_router

    tracks = {}
    for mode in (None, *NodeMode):
        for target in (None, *NodeMode):
            node = NodeTrack(NodeId(f"{mode}-{target}"), Phase.PREFILL, target=target, mode=mode)
            tracks[node.id] = node
            for phase in Phase:
                want = mode is not None and serves(mode, phase) and (target is None or serves(target, phase))
                assert node.accepts(phase) == want
    core = RouterCore(tracks, router=make_prefill_router("round-robin"), binder=make_decode_binder("fewest-requests", random.Random(0)))
    for phase in Phase:
        assert core.accepting(phase) == [n for n in tracks.values() if n.accepts(phase)]
        assert core.accepting(phase)  # some do


def test_versions_are_unique_across_holders_copies_and_unpickled_ones() -> None:
    """Every `SentRequests` change and every track's report draws a version no holder had: a new dict or track
    never repeats one, and a copy keeps its original's version (same state) until either changes, after which
    neither repeats the other's; an unpickled holder moves the source past its version."""
    import copy
    import pickle

    from evolving_infra.router.core import tracking

    a = NodeTrack(NodeId("p0"), Phase.PREFILL)
    b = NodeTrack(NodeId("p1"), Phase.PREFILL)
    seen = {a.sent.version, b.sent.version, a.report_version, b.report_version}
    assert len(seen) == 4
    a.sent["x"] = _request("x", 0)
    a.record_report(1.0, (), ("x",))
    assert a.sent.version not in seen and a.report_version not in seen
    for clone in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a), copy.copy(a)):
        assert clone.report_version == a.report_version
        assert list(clone.sent) == list(a.sent)
    restored = pickle.loads(pickle.dumps(a))
    assert restored.sent.version == a.sent.version  # same requests, same version
    restored.sent.pop("x")
    a.sent["y"] = _request("y", 0)
    assert restored.sent.version != a.sent.version and min(restored.sent.version, a.sent.version) > max(seen)
    # a holder from elsewhere with a version far ahead: versions drawn later are above it
    ahead = SentRequests()
    ahead.version = tracking.next_version() + 10_000
    back = pickle.loads(pickle.dumps(ahead))
    assert back.version == ahead.version
    assert tracking.next_version() > ahead.version
    track = pickle.loads(pickle.dumps(NodeTrack(NodeId("p2"), Phase.PREFILL)))
    track.report_version += 5_000  # as if restored from a process that drew more
    again = pickle.loads(pickle.dumps(track))
    assert NodeTrack(NodeId("p3"), Phase.PREFILL).report_version > again.report_version


def test_versions_stay_unique_while_threads_draw_and_holders_are_restored() -> None:
    """Threads drawing versions (changes of `sent` dicts and reports) while another restores holders (unpickles
    them, which moves the source past their versions): every version drawn is drawn once."""
    import pickle
    import sys
    import threading

    from evolving_infra.router.core import tracking

    drawn: list[list[int]] = [[] for _ in range(3)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to meet the restore in its window
    try:
        def draw(out: list[int]) -> None:
            for _ in range(20_000):
                out.append(tracking.next_version())

        def restore() -> None:
            for _ in range(2_000):
                holder = SentRequests()
                holder.version = tracking.next_version() + 1  # just ahead of the source
                pickle.loads(pickle.dumps(holder))

        threads = [threading.Thread(target=draw, args=(out,)) for out in drawn] + [threading.Thread(target=restore)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(switch)
    everything = [v for out in drawn for v in out]
    assert len(everything) == 60_000 and len(set(everything)) == len(everything)
