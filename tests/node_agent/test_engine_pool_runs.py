"""Run operations of the KV pool against page by page: `store_all`, `land_all` and L1 evictions whose
write-through needs L2 evictions (chosen at once by `TierRuns.room_for_run`) must leave exactly the state of
the page-by-page calls, and their events must replay, tier by tier, to the same resident sets and name the
same removed pages (the router's directory and branch counts only see those)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.kv_events import KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine import KvPool
from evolving_infra.node_agent.engine.idpool import PageTables
from evolving_infra.node_agent.engine.tier import TierPool

CHAINS = [chain_hashes(f"c{c}:{i}".encode() for i in range(12)) for c in range(3)]


def parent(c: int, i: int) -> PageHash | None:
    return CHAINS[c][i - 1] if i else None


class PageByPage(KvPool):
    """The reference: every run goes page by page (`store`, `land`, `_evict_one`)."""

    def _l2_plan(self, pages, now):  # type: ignore[no-untyped-def]
        return None

    def _write_back(self, victims, ids, now):  # type: ignore[no-untyped-def]
        return False

    def store_all(self, tier, items, now, *, owner, from_reservation=True):  # type: ignore[no-untyped-def]
        for page, par in items:
            self.store(tier, page, par, now, owner=owner, from_reservation=from_reservation)


def _state(t: TierPool) -> tuple[object, ...]:
    return (
        list(t._parent.items()), t.last_accesses(), set(t._pinned), dict(t._shared), set(t._cached),
        {o: set(p) for o, p in t._owner_pins.items()}, dict(t._writing), dict(t._reserved), t.free,
    )  # fmt: skip


def _replay(
    events: tuple[KvEvent, ...], resident: dict[Tier, set[PageHash]], removed: Counter[tuple[Tier, PageHash]]
) -> None:
    """Apply `events` to the replayed resident sets (never storing a resident page nor removing an absent one)."""
    for e in events:
        if isinstance(e, KvStored):
            assert resident[e.tier].isdisjoint(e.pages)
            resident[e.tier] |= set(e.pages)
        elif isinstance(e, KvRemoved):
            assert set(e.pages) <= resident[e.tier]
            resident[e.tier] -= set(e.pages)
            removed.update((e.tier, p) for p in e.pages)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "store", "store", "restore", "restore", "release", "release", "count", "count", "evict", "fetch", "land"]),
        st.integers(0, 2), st.integers(0, 11), st.integers(1, 8), st.integers(0, 3),
    ),  # fmt: skip
    max_size=80,
)


@given(ops=OPS, lru=st.booleans(), l1=st.integers(8, 16), l2=st.integers(3, 10))
def test_runs_leave_the_page_by_page_state_and_equivalent_events(
    ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int
) -> None:
    pools = [
        cls(NodeId("n"), l1, l2, LruEviction() if lru else BranchCountEviction(), check=True, tables=PageTables.SETS)
        for cls in (KvPool, PageByPage)  # (the set tiers' own run operations against their page-by-page ones)
    ]
    replays: list[dict[Tier, set[PageHash]]] = [{t: set() for t in Tier} for _ in pools]
    now = 0.0
    for op, c, start, n, k in ops:
        now += float(k % 2)  # several operations at one time, too
        owner = f"o{k}"
        pages = [(CHAINS[c][i], parent(c, i)) for i in range(start, min(12, start + n))]
        outs = []
        for p in pools:
            if op == "store":
                todo = [(page, par) for page, par in pages if not p.l1.contains(page) and not p.l1.is_writing(page)]
                if todo and p.make_room(Tier.GPU, len(todo), now):
                    p.l1.reserve(owner, len(todo))
                    p.store_all(Tier.GPU, todo, now, owner=owner)
            elif op == "restore":  # pages computed again where some (often the leading ones) are resident already
                if p.make_room(Tier.GPU, len(pages), now):
                    p.l1.reserve(owner, len(pages))
                    p.store_all(Tier.GPU, pages, now, owner=owner)
            elif op == "release":
                p.release(owner, now)
            elif op == "count":
                p.set_counts({page: k for page, _ in pages})
            elif op == "evict":
                p.evict(Tier.GPU if k % 2 else Tier.HOST, n, now)
            elif op == "fetch":
                todo = [page for page, _ in pages if not p.l2.contains(page) and not p.l2.is_writing(page)]
                if todo and p.make_room(Tier.HOST, len(todo), now):
                    p.begin_writes(Tier.HOST, owner, todo)
            elif op == "land":
                landing = [(page, par) for page, par in pages if p.l2.writer(page) == owner]
                p.land_all(Tier.HOST, owner, landing, now)
            outs.append(p.drain_events())
        for tier in Tier:
            assert _state(pools[0].tier(tier)) == _state(pools[1].tier(tier))
        assert pools[0].gauges() == pools[1].gauges()
        removals = []
        for p, events, replayed in zip(pools, outs, replays):
            removed: Counter[tuple[Tier, PageHash]] = Counter()
            _replay(events, replayed, removed)
            assert replayed == {t: set(p.tier(t).resident_set()) for t in Tier}
            removals.append(removed)
        assert removals[0] == removals[1]
