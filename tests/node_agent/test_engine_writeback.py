"""L1 write-backs planned at once where L2's room evicts pages of the run itself (`writeback`), against page by
page: the pools over id tables and over set tables leave, after every operation, exactly the state of the
page-by-page pools (resident pages, parents, last accesses, pins, free slots, gauges); their events replay tier
by tier to the same resident sets and name the same removed pages as often; and the two tables' events are
equal. The operations favour host tiers full of counted pages, where the run's uncounted pages evict one another."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine import KvPool, idpool, tierruns, writeback
from evolving_infra.node_agent.engine.idpool import PageTables
from tests.node_agent.test_engine_pool_runs import _replay

CHAINS = [chain_hashes(f"w{c}:{i}".encode() for i in range(12)) for c in range(4)]
OWNERS = [f"o{k}" for k in range(4)]


def parent(c: int, i: int) -> PageHash | None:
    return CHAINS[c][i - 1] if i else None


class PageByPage(KvPool):
    """The reference: L1 evictions write back page by page (`_evict_one`)."""

    def _l2_plan(self, pages, now, missing=None):  # type: ignore[no-untyped-def]
        return None

    def _write_back(self, victims, ids, now):  # type: ignore[no-untyped-def]
        return False


def _view(pool: KvPool, tier: Tier) -> tuple[object, ...]:
    t = pool.tier(tier)
    resident = sorted(t.resident())
    return (
        {p: t.parent(p) for p in resident}, t.last_accesses(), t.pinned_pages(), {p: t.pins(p) for p in resident},
        {o: t.pinned_by(o) for o in OWNERS}, {o: sorted(t.writes_of(o)) for o in OWNERS}, t.free, t.gauges(),
    )  # fmt: skip


def _apply(p: KvPool, op: str, c: int, start: int, n: int, k: int, now: float) -> None:
    owner = OWNERS[k]
    pages = [(CHAINS[c][i], parent(c, i)) for i in range(start, min(12, start + n))]
    if op in ("store", "hold"):  # a prefill's pages; "store": it finishes at once (they stay cached)
        todo = [(page, par) for page, par in pages if not p.l1.contains(page) and not p.l1.is_writing(page)]
        if todo and p.make_room(Tier.GPU, len(todo), now):
            p.l1.reserve(owner, len(todo))
            p.store_all(Tier.GPU, todo, now, owner=owner)
            if op == "store":
                p.release(owner, now)
    elif op == "release":
        p.release(owner, now)
    elif op == "count":  # the active branches count a chain's pages (k = 0: no longer)
        p.set_counts({page: k for page, _ in pages})
    elif op == "evict":
        p.evict(Tier.GPU, n, now)
    elif op == "evict_host":
        p.evict(Tier.HOST, n, now)
    elif op == "release_l1":
        p.release_l1(now)
    elif op == "touch":  # a read of pages L2 holds (a peer's fetch): they move in L2's order
        p.l2.touch_all({page for page, _ in pages if p.l2.contains(page)}, now)
    elif op == "touch_ahead":  # the same recorded at a later time than the next operations' (a later access stays)
        p.l2.touch_all({page for page, _ in pages if p.l2.contains(page)}, now + 3.5)
    elif op == "fetch":
        todo = [page for page, _ in pages if not p.l2.contains(page) and not p.l2.is_writing(page)]
        if todo and p.make_room(Tier.HOST, len(todo), now):
            p.begin_writes(Tier.HOST, owner, todo)
    elif op == "land":
        p.land_all(Tier.HOST, owner, [(page, par) for page, par in pages if p.l2.writer(page) == owner], now)
    else:
        raise AssertionError(op)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "store", "store", "hold", "release", "count", "count", "count", "evict",
                         "evict", "evict", "evict_host", "release_l1", "touch", "touch_ahead", "touch_ahead", "fetch", "land"]),
        st.integers(0, 3), st.integers(0, 11), st.integers(1, 12), st.integers(0, 3),
    ),  # fmt: skip
    max_size=60,
)


def _run(ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int) -> None:
    def policy() -> LruEviction | BranchCountEviction:
        return LruEviction() if lru else BranchCountEviction()

    pools = [
        cls(NodeId("n"), l1, l2, policy(), check=True, tables=tables)
        for cls in (KvPool, PageByPage)
        for tables in (PageTables.IDS, PageTables.SETS)
    ]
    replays = [{t: set[PageHash]() for t in Tier} for _ in pools]
    now = 0.0
    for op, c, start, n, k in ops:
        now += float(k % 2)  # several operations at one time, too
        outs = []
        for p in pools:
            _apply(p, op, c, start, n, k, now)
            outs.append(p.drain_events())
        for tier in Tier:
            views = [_view(p, tier) for p in pools]
            assert all(v == views[0] for v in views[1:]), (op, tier)
        removals: list[Counter[tuple[Tier, PageHash]]] = []
        for p, events, replayed in zip(pools, outs, replays):
            removed: Counter[tuple[Tier, PageHash]] = Counter()
            _replay(events, replayed, removed)
            assert replayed == {t: set(p.tier(t).resident_set()) for t in Tier}
            removals.append(removed)
        assert all(r == removals[0] for r in removals[1:])
        assert outs[0] == outs[1]  # the id tables' events are the set tables'


@settings(max_examples=400, deadline=None)
@given(ops=OPS, lru=st.booleans(), l1=st.integers(6, 16), l2=st.integers(3, 9))
@example(  # L2 full of counted pages; L1 evicts an uncounted chain: its pages evict one another in L2
    [("store", 1, 0, 6, 0), ("release", 0, 0, 1, 0), ("count", 0, 0, 6, 2), ("store", 0, 0, 6, 1),
     ("release", 0, 0, 1, 1), ("evict", 0, 0, 6, 1)], False, 12, 6,
)  # fmt: skip
@example(  # L1's oldest pages are L2's oldest too: L2 evicts a page of the run that is written again at its turn
    [("store", 0, 0, 6, 0), ("release", 0, 0, 1, 0), ("store", 1, 0, 3, 1), ("release", 0, 0, 1, 1),
     ("evict", 0, 0, 9, 1)], True, 10, 6,
)  # fmt: skip
@example(  # a page L2 holds was read at a later time than the write-back's: touched, it keeps that later access, so
    # the written pages go before it although it is the deepest
    [("store", 0, 0, 3, 0), ("touch_ahead", 0, 2, 1, 0), ("count", 2, 0, 1, 2), ("store", 2, 0, 1, 1),
     ("store", 1, 0, 1, 0), ("evict", 0, 0, 5, 1)], False, 12, 4,
)  # fmt: skip
def test_write_backs_at_once_leave_the_page_by_page_state_and_events(
    ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int
) -> None:
    _run(ops, lru, l1, l2)


def _plans(
    monkeypatch: pytest.MonkeyPatch, ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int
) -> list[writeback.WriteBackPlan]:
    """The plans both tables made while running `ops`."""
    seen: list[writeback.WriteBackPlan] = []
    plan = writeback.plan_write_back

    def recording(*args: object) -> writeback.WriteBackPlan:
        out = plan(*args)  # type: ignore[arg-type]
        seen.append(out)
        return out

    monkeypatch.setattr(idpool, "plan_write_back", recording)
    monkeypatch.setattr(tierruns, "plan_write_back", recording)
    _run(ops, lru, l1, l2)
    return seen


def test_uncounted_pages_written_into_a_host_tier_of_counted_pages_evict_one_another(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = [("store", 1, 0, 6, 0), ("release", 0, 0, 1, 0), ("count", 0, 0, 6, 2), ("store", 0, 0, 6, 1),
           ("release", 0, 0, 1, 1), ("evict", 0, 0, 6, 1)]  # fmt: skip
    plans = [p for p in _plans(monkeypatch, ops, False, 12, 6) if p.complete]
    assert plans, "the write-back went page by page"
    # L2 (6 pages) holds chain 0, counted; L1 evicts chain 1 (older, uncounted, no longer in L2): its first page
    # evicts a page of chain 0, each later one the page of chain 1 written just before it; one survives
    assert all(len(p.missing) == 6 and len(p.after) == 5 and len(p.before) == 1 for p in plans)


def test_a_page_of_the_run_evicted_before_its_turn_is_written_again(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = [("store", 0, 0, 6, 0), ("release", 0, 0, 1, 0), ("store", 1, 0, 3, 1), ("release", 0, 0, 1, 1),
           ("evict", 0, 0, 9, 1)]  # fmt: skip
    plans = [p for p in _plans(monkeypatch, ops, True, 10, 6) if p.complete]
    assert plans, "the write-back went page by page"
    run = set(CHAINS[0][:6]) | set(CHAINS[1][:3])
    assert all(any(page in run for page in p.before) for p in plans)
