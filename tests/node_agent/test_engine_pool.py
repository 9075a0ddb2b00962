"""The L1/L2 KV pool: write-through, L1 eviction with write-back, L2 eviction by branch counts, pins,
in-flight writes completed by another owner, KV events and the conservation invariant."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.kv_events import KvRemoved, KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine import KvPool, PoolInvariantError
from evolving_infra.node_agent.engine.idpool import PageTables

PAGES = chain_hashes(f"p{i}".encode() for i in range(32))


def parent(i: int) -> PageHash | None:
    return PAGES[i - 1] if i else None


def pool(l1: int = 4, l2: int = 8, policy: object | None = None) -> KvPool:
    return KvPool(NodeId("n"), l1, l2, policy or BranchCountEviction(), check=True)  # type: ignore[arg-type]


def put(p: KvPool, owner: str, idx: Iterable[int], now: float = 0.0, tier: Tier = Tier.GPU) -> None:
    """`owner` reserves slots and stores pages PAGES[i] (pinned), as a running request does."""
    idx = list(idx)
    assert p.make_room(tier, len(idx), now)
    p.tier(tier).reserve(owner, len(idx))
    for i in idx:
        p.store(tier, PAGES[i], parent(i), now, owner=owner)


def test_store_writes_through_to_host_and_emits_one_chain_per_tier() -> None:
    p = pool()
    put(p, "r", range(3), now=1.0)
    events = p.drain_events()
    assert events == (
        KvStored(NodeId("n"), Tier.GPU, None, tuple(PAGES[:3]), 1.0),
        KvStored(NodeId("n"), Tier.HOST, None, tuple(PAGES[:3]), 1.0),
    )
    g = p.gauges()
    assert (g.l1.pinned, g.l1.cached, g.l1.free) == (3, 0, 1)
    assert (g.l2.pinned, g.l2.cached, g.l2.free) == (0, 3, 5)
    p.release("r", 2.0)
    assert p.gauges().l1.cached == 3


def test_l1_eviction_writes_back_a_page_host_memory_lacks() -> None:
    p = pool(l1=2, l2=2)
    # Host memory full of pages pinned by a queued request: the write-through of page 0 is skipped.
    put(p, "q", [10, 11], tier=Tier.HOST)
    put(p, "r", [0])
    assert not p.l2.contains(PAGES[0])
    assert p.gauges().skipped_write_throughs == 1
    p.release("r", 1.0)
    p.release("q", 1.0)
    p.drain_events()
    assert p.evict(Tier.GPU, 1, 2.0) == [PAGES[0]]
    events = p.drain_events()
    # The page reaches host memory (evicting a cached host page) before it leaves GPU memory.
    stored = [e for e in events if isinstance(e, KvStored)]
    assert stored == [KvStored(NodeId("n"), Tier.HOST, None, (PAGES[0],), 2.0)]
    assert p.l2.contains(PAGES[0]) and not p.l1.contains(PAGES[0])
    assert events.index(stored[0]) < max(i for i, e in enumerate(events) if isinstance(e, KvRemoved))


def test_l1_eviction_drops_the_page_when_host_memory_is_all_pinned() -> None:
    p = pool(l1=2, l2=2)
    put(p, "q", [10, 11], tier=Tier.HOST)
    put(p, "r", [0])
    p.release("r", 1.0)
    p.drain_events()
    assert p.evict(Tier.GPU, 1, 2.0) == [PAGES[0]]
    assert p.drain_events() == (KvRemoved(NodeId("n"), Tier.GPU, (PAGES[0],), 2.0),)
    assert not p.l2.contains(PAGES[0])
    assert p.l2.pinned_pages() == {PAGES[10], PAGES[11]}


def test_host_eviction_keeps_pages_with_branch_counts_then_lru() -> None:
    p = pool(l1=8, l2=4)
    for i, t in zip(range(4), (1.0, 2.0, 3.0, 4.0), strict=True):
        put(p, f"r{i}", [i], now=t, tier=Tier.HOST)
        p.release(f"r{i}", t)
    p.set_counts({PAGES[0]: 2, PAGES[2]: 1})
    assert p.evict(Tier.HOST, 3, 5.0) == [PAGES[1], PAGES[3], PAGES[0]]
    assert p.l2.resident() == {PAGES[2]}


def test_equal_keys_evict_the_deepest_page_first_so_prefixes_stay_whole() -> None:
    p = pool(l1=16, l2=16)
    put(p, "a", range(5), now=1.0, tier=Tier.HOST)  # a chain of depths 0..4
    other = chain_hashes(f"q{i}".encode() for i in range(3))  # another chain, depths 0..2
    p.l2.reserve("b", 3)
    for i, page in enumerate(other):
        p.store(Tier.HOST, page, other[i - 1] if i else None, 1.0, owner="b")
    p.release("a", 2.0)
    p.release("b", 2.0)  # all eight pages now share one key
    assert p.evict(Tier.HOST, 2, 3.0) == [PAGES[4], PAGES[3]]
    assert p.evict(Tier.HOST, 2, 3.0) == sorted([PAGES[2], other[2]])  # equal depth: the page hash decides
    assert p.evict(Tier.HOST, 4, 3.0) == sorted([PAGES[1], other[1]]) + sorted([PAGES[0], other[0]])


def test_a_page_keeps_its_depth_while_either_tier_holds_it() -> None:
    p = pool(l1=4, l2=8)
    put(p, "a", range(3), now=1.0)  # L1, written through to L2
    p.release("a", 1.0)
    p.evict(Tier.GPU, 3, 2.0)  # L1 drops the chain; L2 keeps it, and the depths
    assert p.evict(Tier.HOST, 2, 3.0) == [PAGES[2], PAGES[1]]  # one key (touched at 2.0): deepest first
    p.check_invariants()


def test_lru_host_eviction_ignores_counts() -> None:
    p = pool(l1=8, l2=4, policy=LruEviction())
    for i, t in zip(range(4), (1.0, 2.0, 3.0, 4.0), strict=True):
        put(p, f"r{i}", [i], now=t, tier=Tier.HOST)
        p.release(f"r{i}", t)
    p.set_counts({PAGES[0]: 2})
    assert p.evict(Tier.HOST, 2, 5.0) == [PAGES[0], PAGES[1]]


def test_pinned_pages_are_never_evicted_and_room_waits() -> None:
    p = pool(l1=3, l2=8)
    put(p, "a", [0, 1])
    put(p, "b", [2])
    p.release("b", 1.0)
    assert not p.make_room(Tier.GPU, 2, 2.0)  # only one unpinned page
    assert p.l1.resident() == {PAGES[0], PAGES[1], PAGES[2]}
    assert p.make_room(Tier.GPU, 1, 2.0)
    assert p.l1.resident() == {PAGES[0], PAGES[1]}
    assert p.evict(Tier.GPU, 5, 3.0) == []


def test_a_pinned_page_cannot_be_removed() -> None:
    p = pool()
    put(p, "a", [0])
    with pytest.raises(PoolInvariantError, match="refusing to evict pinned page"):
        p.l1.remove(PAGES[0])


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["store", "pin", "release", "count", "evict"]), st.integers(0, 15), st.integers(0, 3)
        ),
        max_size=60,
    ),
    lru=st.booleans(),
)
def test_eviction_follows_the_policy_order_and_spares_pins(ops: list[tuple[str, int, int]], lru: bool) -> None:
    """`check=True` compares every eviction with `policy.victims` over a full snapshot."""
    p = pool(l1=6, l2=8, policy=LruEviction() if lru else BranchCountEviction())
    now = 0.0
    for op, i, k in ops:
        now += 1.0
        owner = f"o{k}"
        if op == "store" and not p.l1.contains(PAGES[i]) and p.make_room(Tier.GPU, 1, now):
            p.l1.reserve(owner, 1)
            p.store(Tier.GPU, PAGES[i], parent(i), now, owner=owner)
        elif op == "pin" and p.l2.contains(PAGES[i]):
            p.l2.pin(owner, PAGES[i], now)
        elif op == "release":
            p.release(owner, now)
        elif op == "count":
            p.set_counts({PAGES[i]: k})
        elif op == "evict":
            pinned = {t: p.tier(t).pinned_pages() for t in Tier}
            for tier in Tier:
                gone = set(p.evict(tier, k, now))
                assert not gone & pinned[tier]


def test_a_fetch_completed_by_another_owners_store_is_not_double_counted() -> None:
    p = pool(l1=4, l2=8)
    p.begin_writes(Tier.HOST, "fetcher", [PAGES[0]])
    assert p.gauges().l2.in_use == 1
    put(p, "computer", [0], now=1.0)  # write-through completes the fetcher's slot
    assert p.l2.contains(PAGES[0]) and PAGES[0] in p.l2.pinned_by("fetcher")
    g = p.gauges().l2
    assert (g.in_use, g.pinned, g.free) == (0, 1, 7)
    p.land(Tier.HOST, "fetcher", PAGES[0], None, 2.0)  # no second store
    host_stores = [e for e in p.drain_events() if isinstance(e, KvStored) and e.tier is Tier.HOST]
    assert [e.pages for e in host_stores] == [(PAGES[0],)]
    p.release("fetcher", 3.0)
    p.release("computer", 3.0)
    p.check_invariants()


def test_check_invariants_names_the_broken_rule() -> None:
    p = KvPool(NodeId("n"), 4, 8, BranchCountEviction(), check=True, tables=PageTables.SETS)
    put(p, "r", [0])
    p.l1._free += 1  # corrupt the free counter
    with pytest.raises(PoolInvariantError, match=r"gpu: free 4 \+ cached 0 \+ pinned 1 \+ in_use 0 != capacity 4"):
        p.check_invariants()


def test_check_invariants_of_the_id_tables_names_the_broken_rule() -> None:
    p = KvPool(NodeId("n"), 4, 8, BranchCountEviction(), check=True, tables=PageTables.IDS)
    put(p, "r", [0])
    p.l1.t.resident += 1  # corrupt the resident counter
    with pytest.raises(PoolInvariantError, match=r"gpu: counters \(cached 0, resident 2\) disagree with the state array "
                                                 r"\(cached 0, resident 1\)"):
        p.check_invariants()


def test_counts_must_be_non_negative_integers() -> None:
    p = pool()
    with pytest.raises(ValueError, match="must be an integer >= 0"):
        p.set_counts({PAGES[0]: -1})
    p.set_counts({PAGES[0]: 3})
    p.set_counts({PAGES[0]: 0})
    assert p.count(PAGES[0]) == 0
