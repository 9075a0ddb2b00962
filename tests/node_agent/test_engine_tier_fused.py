"""The tier's fused run operations against their page-by-page definitions (`TierPool.insert`, `remove`, `pin`):
`insert_run` (the checks left to the caller, and what the caller knows of the depths), `remove_victims`, the
residency check `pin_all` makes through the cached-set removal (an error leaves every table as it was), and
the depths as shared int objects (`shared_depths`, `shared_depth`, `new_depths(..., none_known=True)`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.tier import TierPool
from evolving_infra.node_agent.engine.tierruns import RunDepths, new_depths, shared_depth, shared_depths

CHAIN = chain_hashes(f"f{i}".encode() for i in range(14))
OTHER = chain_hashes(f"g{i}".encode() for i in range(6))


def parent(pages: list[PageHash], i: int) -> PageHash | None:
    return pages[i - 1] if i else None


def _state(t: TierPool) -> tuple[object, ...]:
    return (
        list(t._parent.items()), list(t._access.items()), dict(t._depth), set(t._pinned), set(t._cached),
        dict(t._shared), {o: set(p) for o, p in t._owner_pins.items()}, dict(t._writing), dict(t._reserved),
        t.free, t._n_reserved,
    )  # fmt: skip


def _pair(lru: bool) -> list[TierPool]:
    return [TierPool(Tier.HOST, 30, LruEviction() if lru else BranchCountEviction(), {}) for _ in range(2)]


def _order(t: TierPool) -> list[PageHash]:
    """Every cached page in eviction order (taken out: the pool is not used afterwards)."""
    return t.victims(t.evictable())


@given(
    lru=st.booleans(), before=st.integers(0, 6), start=st.integers(0, 13), n=st.integers(1, 8),
    slots=st.sampled_from(["free", "reserved", "writing"]), pinned=st.booleans(), now=st.sampled_from([0.0, 1.0, 2.0]),
)  # fmt: skip
def test_insert_run_equals_insert_page_by_page(
    lru: bool, before: int, start: int, n: int, slots: str, pinned: bool, now: float
) -> None:
    """`insert_run` of a run the tier does not hold, told what the depth table holds, leaves the state and
    the eviction order of `insert` page by page (cached runs: every page of a run ends in the order)."""
    fused, single = _pair(lru)
    held = CHAIN[:before]  # a prefix already resident (its depths known)
    run = {p: parent(CHAIN, i) for i, p in enumerate(CHAIN) if start <= i < start + n and p not in held}
    owner = "o" if pinned or slots != "free" else None
    for t in (fused, single):
        for i, page in enumerate(held):
            t.insert(page, parent(CHAIN, i), 0.5)
        if slots == "reserved":
            t.reserve("o", len(run) + 1)
        elif slots == "writing":
            t.begin_write_all("o", run)
    if not run:
        return
    known = RunDepths.NONE_KNOWN if fused._depth.keys().isdisjoint(run) else RunDepths.LOOKUP
    fused.insert_run(run, now, owner=owner, slots=slots, depths=known)
    for page, par in run.items():
        source = None if slots == "free" else "o"
        single.insert(page, par, now, source=source, pin_owner=owner)
    assert _state(fused) == _state(single)
    assert _order(fused) == _order(single)


def test_insert_run_with_every_depth_known_keeps_the_peer_s_depths() -> None:
    l1, l2 = _pair(lru=True)
    l2._depth = l1._depth  # shared, as a `KvPool` has it
    l1._peer, l2._peer = l2, l1
    run = {p: parent(CHAIN, i) for i, p in enumerate(CHAIN[:5])}
    l1.insert_run(run, 1.0, owner="o", slots="free", depths=RunDepths.NONE_KNOWN)
    l2.insert_run(run, 1.0, depths=RunDepths.ALL_KNOWN)
    assert l2._depth == {p: i for i, p in enumerate(CHAIN[:5])}
    assert l2.resident_set() == run.keys() and set(l2._cached) == set(run)


def test_insert_all_still_checks_what_insert_run_leaves_to_its_caller() -> None:
    t = _pair(lru=True)[0]
    t.insert(CHAIN[0], None, 0.0)
    t.begin_write("w", OTHER[0])
    with pytest.raises(PoolInvariantError, match="already resident"):
        t.insert_all({CHAIN[0]: None}, 1.0)
    with pytest.raises(PoolInvariantError, match="being written"):
        t.insert_all({OTHER[0]: None}, 1.0)
    with pytest.raises(PoolInvariantError, match="was not writing"):
        t.insert_all({OTHER[0]: None}, 1.0, owner="x", slots="writing")


@given(lru=st.booleans(), picks=st.lists(st.integers(0, 13), unique=True, max_size=14), peer_holds=st.integers(0, 14),
       with_peer=st.booleans())  # fmt: skip
def test_remove_victims_equals_remove_page_by_page(
    lru: bool, picks: list[int], peer_holds: int, with_peer: bool
) -> None:
    fused, single = _pair(lru)
    peers = _pair(lru)
    for t, peer in zip((fused, single), peers, strict=True):
        if with_peer:
            peer._depth = t._depth
            t._peer, peer._peer = peer, t
        for i, page in enumerate(CHAIN):
            t.insert(page, parent(CHAIN, i), float(i % 3))
            if with_peer and i < peer_holds:
                peer.insert(page, parent(CHAIN, i), 0.0)
    victims = [CHAIN[i] for i in picks]
    all_held = with_peer and all(CHAIN.index(p) < peer_holds for p in victims)
    fused.remove_victims(victims, peer_holds=all_held)
    for page in victims:
        single.remove(page)
    assert _state(fused) == _state(single)
    assert _order(fused) == _order(single)


@given(
    lru=st.booleans(), resident=st.integers(0, 14), pins=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 13),
    st.integers(1, 6)), max_size=6), start=st.integers(0, 13), n=st.integers(1, 6), stray=st.booleans(),
)  # fmt: skip
def test_pin_all_of_a_page_not_resident_raises_leaving_every_table(
    lru: bool, resident: int, pins: list[tuple[int, int, int]], start: int, n: int, stray: bool
) -> None:
    """Other owners' pins first (some pages shared), then a `pin_all` naming a page that is not resident:
    it raises naming the smallest such page, and the tables (the cached set included) are as before."""
    t = _pair(lru)[0]
    for i, page in enumerate(CHAIN[:resident]):
        t.insert(page, parent(CHAIN, i), 0.0)
    for k, lo, m in pins:
        t.pin_all(f"o{k}", [p for p in CHAIN[lo : lo + m] if t.contains(p)], 1.0)
    run = CHAIN[start : start + n] + (OTHER[:2] if stray else [])
    absent = [p for p in run if not t.contains(p)]
    before = _state(t)
    if not absent:
        t.pin_all("o9", run, 2.0)
        assert t.pinned_by("o9") == frozenset(run)
        return
    with pytest.raises(PoolInvariantError, match=f"cannot pin page {min(absent):#x}: not resident"):
        t.pin_all("o1", run, 2.0)
    assert _state(t) == before
    t.check()


@given(first=st.integers(0, 5000), n=st.integers(0, 3000))
def test_depths_are_consecutive_and_shared(first: int, n: int) -> None:
    got = shared_depths(first, n)
    assert got == list(range(first, first + n))
    assert all(a is b for a, b in zip(got, shared_depths(first, n), strict=True))
    assert all(shared_depth(d) is d for d in got)


@given(items=st.lists(st.sampled_from(CHAIN + OTHER), unique=True, min_size=1, max_size=12),
       known=st.dictionaries(st.sampled_from(CHAIN + OTHER), st.integers(0, 400), max_size=6))  # fmt: skip
def test_new_depths_with_none_known_equals_the_look_up(items: list[PageHash], known: dict[PageHash, int]) -> None:
    """Where no page of the run has a depth, `none_known` skips the look-ups and gives the same depths (chains
    or not: a page's parent is the one before it in its own chain)."""
    run = {p: (CHAIN if p in CHAIN else OTHER)[(CHAIN if p in CHAIN else OTHER).index(p) - 1]
           if (CHAIN if p in CHAIN else OTHER).index(p) else None for p in items}  # fmt: skip
    table = {p: d for p, d in known.items() if p not in run}
    assert new_depths(run, table, none_known=True) == new_depths(run, table)
