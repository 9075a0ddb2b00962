"""The pool over id tables (`idpool.IdTierPool` under `KvPool`, tables=IDS) against the pool over hash-keyed sets
(`TierPool`, tables=SETS) as its oracle: the same operations (runs stored, fetched, landed, cancelled; single
pages stored pinned or not; prefixes pinned, touched, unpinned page by page; releases; branch counts; evictions
by policy, with excluded pages; L1 released) at
times that often tie, and after each the same resident pages and parents, last accesses, pins per owner and per
page, in-use slots and gauges, and exactly the same KV events (so every eviction chose the same pages in the
same order). Both pools run with `check=True`, which also compares every eviction with the policy's own
`victims` over a full snapshot."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.pages import CountUpdates, PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine import KvPool, walks
from evolving_infra.node_agent.engine.chainrun import ChainRun
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.idorder import IdOrder
from evolving_infra.node_agent.engine.pageids import _INTS, PageIds
from evolving_infra.node_agent.engine.idpool import ENV, IdTierPool, PageTables, page_tables
from evolving_infra.node_agent.engine.tier import TierPool

CHAINS = [chain_hashes(f"c{c}:{i}".encode() for i in range(12)) for c in range(3)]
OWNERS = [f"o{k}" for k in range(4)]


def parent(c: int, i: int) -> PageHash | None:
    return CHAINS[c][i - 1] if i else None


def _view(pool: KvPool, tier: Tier) -> tuple[object, ...]:
    """What a tier shows through its interface (no internal tables)."""
    t = pool.tier(tier)
    resident = sorted(t.resident())
    return (
        {p: t.parent(p) for p in resident}, t.last_accesses(), t.pinned_pages(), {p: t.pins(p) for p in resident},
        {o: t.pinned_by(o) for o in OWNERS}, {o: t.reserved_by(o) for o in OWNERS},
        {o: sorted(t.writes_of(o)) for o in OWNERS}, t.free, t.evictable(), t.gauges(), sorted(t.owners()),
    )  # fmt: skip



@pytest.fixture(autouse=True)
def _walks_keep_ids_for_any_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompts here are short: a walk keeps its ids for the next walk of its prefix at any length."""
    monkeypatch.setattr(walks, "KEEP_IDS_MIN", 0)

OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "store", "store", "restore", "chain", "chain", "admit", "admit", "walk", "walk", "hostwalk", "hostwalk", "single", "release", "release", "count", "count", "counts", "counts", "evict", "fetch",
                         "land", "cancel", "room", "release_l1", "release_l1", "pin", "pin", "touch", "unpin", "load", "load", "loaded",
                         "loaded"]),
        st.integers(0, 2), st.integers(0, 11), st.integers(1, 8), st.integers(0, 3),
    ),  # fmt: skip
    max_size=80,
)


_LOADS: dict[int, dict[str, tuple[list[tuple[PageHash, PageHash | None]], object]]] = {}  # per pool: owner -> load
_RESOLVED: dict[tuple[int, tuple[PageHash, ...]], walks.Resolved | None] = {}  # per pool and prefix: the last walk's ids


def _apply(p: KvPool, op: str, pages: list[tuple[PageHash, PageHash | None]], n: int, k: int, now: float) -> object:
    """One operation on pool `p`; what it returned (compared between the pools)."""
    owner = OWNERS[k]
    loads = _LOADS.setdefault(id(p), {})
    if op == "load":  # a prefill's load from L2: its walk, the sources pinned in L2, L1 slots start receiving them
        if owner in loads:
            return None  # (one load per request)
        if p.l1.writing and not p.l1.writing_set().isdisjoint(page for page, _ in pages):
            return None  # (as the prefill's GPU admission: it waits while a load brings some of its pages)
        walk = walks.gpu_walk(p, tuple(page for page, _ in pages))
        m = min(len(walk.loads), p.l1.free + p.l1.evictable())  # (the loads that fit: those of a shorter prompt)
        if not m or p.l1.lacks_room(m):
            return None
        todo, ids = walk.loads[:m], None if walk.load_ids is None else walk.load_ids[:m]
        held = p.l2.pinned_by(owner)  # (as the prefill's admission: pins on what the request pins already are kept)
        if not held:
            walks.pin_walked(p, Tier.HOST, owner, [page for page, _ in todo], ids, now)
        else:
            p.l2.pin_all(owner, [page for page, _ in todo if page not in held], now)
        assert p.make_room(Tier.GPU, m, now)
        p.begin_writes(Tier.GPU, owner, [page for page, _ in todo])
        loads[owner] = (todo, ids)
        return walk.in_l1, todo
    if op == "loaded":  # the load lands (by the walk's ids, with the id tables) and the L2 sources are unpinned
        if owner not in loads:
            return None
        landing, ids = loads.pop(owner)
        p.land_all(Tier.GPU, owner, landing, now, ids=ids)  # type: ignore[arg-type]
        p.l2.unpin_all(owner, now)
        return len(landing)
    if op == "release":  # (a request that goes away takes its load with it)
        loads.pop(owner, None)
    if op == "store":
        todo = [(page, par) for page, par in pages if not p.l1.contains(page) and not p.l1.is_writing(page)]
        if todo and p.make_room(Tier.GPU, len(todo), now):
            p.l1.reserve(owner, len(todo))
            p.store_all(Tier.GPU, todo, now, owner=owner)
            return True
        return False
    if op == "restore":  # pages computed again where some (often the leading ones) are resident already
        if p.make_room(Tier.GPU, len(pages), now):
            p.l1.reserve(owner, len(pages))
            p.store_all(Tier.GPU, pages, now, owner=owner)
            return True
        return False
    if op == "chain":  # a prefill's computed pages or a decode's filled ones: one chain (some may be resident)
        if p.make_room(Tier.GPU, len(pages), now):
            p.l1.reserve(owner, len(pages))
            p.store_chain(ChainRun(tuple(page for page, _ in pages), pages[0][1]), now, owner=owner)
            return True
        return False
    if op == "admit":  # a decode's admission of a received prompt: pins what L1 holds, stores the rest
        prompt = tuple(page for page, _ in pages)
        if p.l1.writing and not p.l1.writing_set().isdisjoint(prompt):
            return None  # (the decode waits for the load)
        return walks.admit_prompt(p, owner, prompt, len(prompt) + n % 3, now)
    if op == "walk":  # a prefill's walk over its prefix, and its pins (by the ids kept, with the id tables)
        prefix = tuple(page for page, _ in pages)  # (a walk of the same prefix before: its ids, refreshed)
        walk = walks.gpu_walk(p, prefix, _RESOLVED.get((id(p), prefix)))
        _RESOLVED[id(p), prefix] = walk.resolved
        if not p.l2.pinned_by(owner):
            walks.pin_walked(p, Tier.HOST, owner, [page for page, _ in walk.loads], walk.load_ids, now)
        walks.pin_walked(p, Tier.GPU, owner, walk.in_l1, walk.l1_ids, now)
        return walk.in_l1, walk.loads
    if op == "hostwalk":  # a prefill's host walk (a fetch plan naming the prompt's pages from the n-th on)
        plan = {page: None for page, _ in pages[n % (len(pages) + 1) :]}
        prefix = tuple(page for page, _ in pages)
        walk = walks.host_walk(p, prefix, lambda: plan, _RESOLVED.get((id(p), prefix)))
        _RESOLVED[id(p), prefix] = walk.resolved
        if not p.l2.pinned_by(owner):
            walks.pin_walked(p, Tier.HOST, owner, walk.pins, walk.pin_ids, now)
        return walk.pins, walk.fetch
    if op == "single":  # one page into L2 from a free slot, pinned or not (a peer's transfer, a write-back)
        page, par = pages[0]
        if p.l2.contains(page) or p.l2.is_writing(page) or not p.make_room(Tier.HOST, 1, now):
            return False
        p.store(Tier.HOST, page, par, now, owner=owner, from_reservation=False, pin=k % 2 == 0)
        return True
    if op == "release":
        p.release(owner, now)
        return None
    if op == "count":
        p.set_counts({page: (k + n) % 3 for page, _ in pages})
        return None
    if op == "counts":  # the router's pushes: stretches of one count each (the second may overlap the first)
        updates = CountUpdates()
        cut = n % (len(pages) + 1)
        updates.add([page for page, _ in pages[:cut]], k % 3)
        updates.add([page for page, _ in pages[cut - (k % 2) if cut else cut :]], (k + n) % 3)
        p.set_counts(updates)
        return updates.disjoint()
    if op == "evict":
        return p.evict(Tier.GPU if k % 2 else Tier.HOST, n, now)
    if op == "fetch":
        todo = [page for page, _ in pages if not p.l2.contains(page) and not p.l2.is_writing(page)]
        if todo and p.make_room(Tier.HOST, len(todo), now):
            p.begin_writes(Tier.HOST, owner, todo)
            return True
        return False
    if op == "land":
        landing = [(page, par) for page, par in pages if p.l2.writer(page) == owner]
        p.land_all(Tier.HOST, owner, landing, now)
        return len(landing)
    if op == "cancel":
        p.cancel_writes(Tier.HOST, owner, [page for page, _ in pages])
        return None
    if op == "room":  # room made while part of a prompt is kept (excluded)
        return p.make_room(Tier.HOST if k % 2 else Tier.GPU, n, now, exclude=[page for page, _ in pages[:2]])
    if op == "release_l1":
        return p.release_l1(now)
    tier = p.l2 if k % 2 else p.l1
    held = [page for page, _ in pages if tier.contains(page)]
    if op == "pin":  # an admission pins the prefix it reuses
        tier.pin_all(owner, held, now)
        return len(held)
    if op == "touch":
        tier.touch_all(set(held), now)
        return len(held)
    if op == "unpin":  # a pin turned out unneeded: dropped without a touch
        if owner in loads:
            return None  # (a load's sources stay pinned until it lands)
        mine = sorted(tier.pinned_by(owner))
        if mine:
            tier.unpin(owner, mine[n % len(mine)])
        return len(mine)
    raise AssertionError(op)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, lru=st.booleans(), l1=st.integers(4, 16), l2=st.integers(3, 12))
@example(  # cached pages of one chain get counts after another chain's release: a host eviction takes the other first
    [("store", 0, 0, 4, 0), ("release", 0, 0, 1, 0), ("store", 1, 0, 4, 1), ("release", 0, 0, 1, 1),
     ("count", 0, 0, 4, 2), ("evict", 0, 0, 4, 2)], False, 8, 8,
)  # fmt: skip
@example(  # an admission whose room check must count the cached pages among those it reuses (it lacks room)
    [("store", 0, 0, 2, 0), ("release", 0, 0, 1, 0), ("admit", 0, 0, 4, 1)], True, 4, 8,
)
@example(  # an admission reusing pages L1 holds in the middle of its prompt
    [("store", 0, 1, 2, 0), ("admit", 0, 0, 4, 1), ("release", 0, 0, 1, 1), ("evict", 0, 0, 6, 1)], False, 16, 8,
)
@example(  # an admission whose room evicts from L2 a received page only L2 held: the ids it resolved go stale
    [("store", 2, 0, 4, 2), ("store", 0, 1, 8, 3), ("release", 2, 8, 7, 3), ("admit", 2, 9, 3, 2),
     ("admit", 1, 7, 3, 3), ("release", 1, 4, 3, 2), ("restore", 0, 7, 5, 0), ("admit", 0, 6, 3, 0)], False, 15, 12,
)  # fmt: skip
@example(  # an admission whose received pages L2 holds in part: the write-through inserts the rest by their ids
    [("store", 0, 0, 6, 0), ("release", 0, 0, 1, 0), ("release_l1", 0, 0, 1, 1), ("admit", 0, 0, 9, 2)], True, 12, 10,
)
@example(  # an admission whose write-through would evict from L2 a received page L2 holds: page by page
    [("store", 0, 0, 4, 1), ("release", 0, 0, 1, 1), ("release_l1", 0, 0, 1, 1), ("store", 1, 0, 2, 1),
     ("release", 0, 0, 1, 1), ("admit", 0, 0, 6, 3)], True, 12, 6,
)  # fmt: skip
@example(  # a walk of a prefix walked before, after a page of it left both tiers and its id went to another page
    [("store", 2, 8, 6, 2), ("single", 0, 0, 5, 1), ("walk", 0, 8, 7, 2), ("release", 2, 5, 5, 2),
     ("release_l1", 1, 9, 8, 1), ("evict", 1, 5, 5, 2), ("single", 0, 0, 8, 1), ("walk", 0, 4, 8, 2)], True, 10, 12,
)  # fmt: skip
@example(  # a prefill's load from L2 lands by the walk's ids while another chain's stores evict around its pins
    [("store", 0, 0, 6, 0), ("release", 0, 0, 1, 0), ("release_l1", 0, 0, 1, 1), ("load", 0, 0, 6, 1),
     ("store", 1, 0, 6, 2), ("release", 0, 0, 1, 2), ("store", 2, 0, 5, 3), ("loaded", 0, 0, 1, 1)], True, 12, 10,
)  # fmt: skip
@example(  # the same with a load that is only partly a chain L2 holds (its middle page evicted from L2 first)
    [("store", 0, 0, 6, 0), ("release", 0, 0, 1, 0), ("release_l1", 0, 0, 1, 1), ("store", 1, 0, 8, 2),
     ("load", 0, 0, 6, 1), ("release", 0, 0, 1, 2), ("loaded", 0, 0, 1, 1), ("admit", 0, 0, 8, 3)], False, 12, 10,
)  # fmt: skip
@example(  # the router's pushes in stretches: pages turn counted, then uncounted again, then host evictions
    [("store", 0, 0, 4, 0), ("release", 0, 0, 1, 0), ("counts", 0, 0, 4, 2), ("store", 1, 0, 4, 1),
     ("release", 0, 0, 1, 1), ("evict", 0, 0, 2, 2), ("counts", 0, 0, 4, 0), ("evict", 0, 0, 2, 2)], False, 8, 8,
)  # fmt: skip
@example(  # stretches that overlap (a page released, then counted again in one push): applied as a whole
    [("store", 0, 0, 4, 0), ("release", 0, 0, 1, 0), ("counts", 0, 0, 4, 2), ("counts", 0, 0, 4, 3),
     ("store", 1, 0, 4, 1), ("release", 0, 0, 1, 1), ("evict", 0, 0, 2, 2)], False, 8, 8,
)  # fmt: skip
def test_id_tables_match_the_set_tables(ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int) -> None:
    _same_pools(ops, lru, l1, l2)


DENSE_CHAINS = [[PageHash(58 + 30 * c + i) for i in range(12)] for c in range(3)]
"""Chains named as the simulator names pages (runs of consecutive labels; two of them cross a block of
`labelblocks.WIDTH` labels)."""


@settings(max_examples=200, deadline=None)
@given(ops=OPS, lru=st.booleans(), l1=st.integers(4, 16), l2=st.integers(3, 12))
def test_id_tables_over_dense_labels_match_the_set_tables(
    ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int
) -> None:
    _same_pools(ops, lru, l1, l2, DENSE_CHAINS)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, lru=st.booleans(), l1=st.integers(4, 16), l2=st.integers(3, 12))
def test_id_tables_match_the_set_tables_when_the_order_rebuilds_at_every_entry(
    ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int
) -> None:
    saved = IdOrder.REBUILD_FACTOR, IdOrder.REBUILD_FLOOR
    IdOrder.REBUILD_FACTOR, IdOrder.REBUILD_FLOOR = 0, 0  # every entry rebuilds the order from the cached ids
    try:
        _same_pools(ops, lru, l1, l2)
    finally:
        IdOrder.REBUILD_FACTOR, IdOrder.REBUILD_FLOOR = saved


def test_a_page_that_turns_uncounted_while_pinned_enters_the_order_when_released() -> None:
    """A page entered while counted, then pinned, turns uncounted while pinned (its key drops below the one it
    was entered under): once released it is evicted with the uncounted pages, before the counted ones, deepest
    first."""
    pool = KvPool(NodeId("n"), 8, 8, BranchCountEviction(), check=True, tables=PageTables.IDS)
    tier = pool.l2
    assert isinstance(tier, IdTierPool)
    chain = CHAINS[0][:4]
    for i, page in enumerate(chain):
        tier.insert(page, chain[i - 1] if i else None, 0.0, pin_owner="a")
    pool.set_counts(dict.fromkeys(chain, 1))
    tier.unpin_all("a", 1.0)  # cached and counted: entered under (1, 1.0)
    tier.pin_all("b", chain[:2], 2.0)
    pool.set_counts(dict.fromkeys(chain[:2], 0))  # uncounted while pinned: (0, 2.0), below its entry
    tier.unpin_all("b", 3.0)
    tier.check()
    assert pool.expected_victims(Tier.HOST, 4) == [chain[1], chain[0], chain[3], chain[2]]
    assert tier.victims(4) == [chain[1], chain[0], chain[3], chain[2]]


def test_the_order_keeps_its_stale_entries_bounded() -> None:
    """Pages touched again and again leave entries under old keys behind; the order rebuilds from the cached
    ids before they outgrow REBUILD_FACTOR x the cached pages plus REBUILD_FLOOR."""
    pool = KvPool(NodeId("n"), 64, 64, BranchCountEviction(), tables=PageTables.IDS)
    tier = pool.l1
    assert isinstance(tier, IdTierPool)
    chain = CHAINS[0][:12]
    for i, page in enumerate(chain):
        tier.insert(page, chain[i - 1] if i else None, 0.0)
    for step in range(1, 3000):
        tier.touch_all(set(chain), float(step))
        order = tier.t.order
        assert order._entries <= order.REBUILD_FACTOR * tier.t.cached + order.REBUILD_FLOOR
    assert order.rebuilds > 0
    assert tier.victims(3) == [chain[11], chain[10], chain[9]]  # the order is still the policy's: deepest first


LONG = chain_hashes(f"long:{i}".encode() for i in range(400))


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["evict", "evict", "touch", "pin", "unpin", "count"]), st.integers(0, 399),
                  st.integers(1, 60)),
        max_size=40,
    ),  # fmt: skip
    lru=st.booleans(),
)
def test_victims_from_a_large_ordered_bucket_follow_the_policy(steps: list[tuple[str, int, int]], lru: bool) -> None:
    """Victims taken a few at a time from buckets of hundreds of pages (a chain stored at one time) check the
    liveness of only as much of the ordered bucket as they take; pages of its unchecked rest touched, pinned,
    counted or unpinned meanwhile must still be skipped or found where the policy puts them (`check=True`
    compares every eviction with the policy's victims over a full snapshot)."""
    pool = KvPool(NodeId("n"), 8, 400, LruEviction() if lru else BranchCountEviction(), check=True, tables=PageTables.IDS)
    l2 = pool.l2
    l2.insert_all({page: LONG[i - 1] if i else None for i, page in enumerate(LONG)}, 0.0)
    now = 1.0
    for op, at, n in steps:
        pages = [page for page in LONG[at : at + n] if l2.contains(page)]
        if op == "evict":
            pool.evict(Tier.HOST, n, now)
        elif op == "touch":
            l2.touch_all(set(pages), now)
        elif op == "pin":
            l2.pin_all("o", pages, now)
        elif op == "unpin":
            l2.unpin_all("o", now)
        else:
            pool.set_counts({page: at % 3 for page in LONG[at : at + n]})
        now += 0.5
    l2.unpin_all("o", now)
    pool.evict(Tier.HOST, l2.evictable(), now)  # every remaining page, in the policy's order
    assert l2.free == 400


@settings(max_examples=100, deadline=None)
@given(
    times=st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=2, max_size=12),
    counted=st.lists(st.booleans(), min_size=12, max_size=12),
    lru=st.booleans(),
)
def test_entering_ids_of_many_times_makes_one_chunk_per_key_in_the_ids_order(
    times: list[float], counted: list[bool], lru: bool
) -> None:
    """`IdOrder.enter` of ids last accessed at several times (as a rebuild enters them): one chunk per key, with
    the key's ids in the order they were given, the keys in ascending order, and 32-bit entries whose
    generations are the ids'."""
    pool = KvPool(NodeId("n"), 16, 16, LruEviction() if lru else BranchCountEviction(), tables=PageTables.IDS)
    tier = pool.l2
    assert isinstance(tier, IdTierPool)
    chain = CHAINS[1][: len(times)]
    for i, page in enumerate(chain):
        tier.insert(page, chain[i - 1] if i else None, times[i])
    ids = tier._ids(chain)[::-1].copy()  # entered deepest first: not the ids' own order
    t = tier.t
    flagged = np.array([i for i in ids.tolist() if counted[i]], dtype=np.int64)
    t.pages.set_count(flagged, 1)  # (the tier's own order re-enters them)
    order = IdOrder(tier.policy, t.pages, t)
    order.enter(ids)
    expected: dict[tuple[float, ...], list[int]] = {}
    for i in ids.tolist():
        expected.setdefault(order.key_of(bool(counted[i]), float(t.access[i])), []).append(i)
    got = {key: [c for chunk in bucket.chunks for c in chunk[0].tolist()] for key, bucket in order._buckets.items()}
    assert got == expected
    assert all(len(bucket.chunks) == 1 for bucket in order._buckets.values())
    assert sorted(order._keys) == sorted(expected)
    for bucket in order._buckets.values():
        entries, gens = bucket.chunks[0]
        assert entries.dtype == np.int32 and (gens == t.pages.gen[entries]).all()
    assert order.victims(len(ids)).tolist() == tier.t.order.victims(len(ids)).tolist()  # the same order either way


@settings(max_examples=100, deadline=None)
@given(
    stored=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12)), max_size=4),
    evicted=st.integers(0, 10),
    probe=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 11)), max_size=14),
)
def test_the_resident_view_answers_as_the_set_of_resident_pages(
    stored: list[tuple[int, int]], evicted: int, probe: list[tuple[int, int]]
) -> None:
    """`IdTierPool.resident_set()` (a view over the state array, no hash-keyed table) against the resident pages
    as a built-in set: membership, size, iteration, `isdisjoint`, `&`, `issuperset`, `|`, and the parents of the
    pages it holds (from the node's ids) against the chains they were stored with."""
    pool = KvPool(NodeId("n"), 24, 24, BranchCountEviction(), tables=PageTables.IDS)
    tier = pool.l2
    assert isinstance(tier, IdTierPool)
    for c, n in stored:
        chain = CHAINS[c][:n]
        run = {p: parent(c, i) for i, p in enumerate(chain) if not tier.contains(p)}
        if run and tier.free >= len(run):
            tier.insert_all(run, 1.0)
    if evicted:
        tier.remove_victims(tier.victims(min(evicted, tier.evictable())))
    view, truth = tier.resident_set(), set(tier.resident())
    assert len(view) == len(truth) == tier.t.resident and set(view) == truth
    pages = [CHAINS[c][i] for c, i in probe]
    assert [p in view for p in pages] == [p in truth for p in pages] and 7 not in view
    assert view.isdisjoint(pages) == truth.isdisjoint(pages)
    assert view & pages == truth & set(pages) and pages & view == truth & set(pages)
    assert view.issuperset(pages) == truth.issuperset(pages)
    assert view | set(pages) == truth | set(pages)
    expected = {CHAINS[c][i]: parent(c, i) for c in range(3) for i in range(12)}
    assert {p: tier.parent(p) for p in truth} == {p: expected[p] for p in truth} == dict(tier.parents())
    missing = next((p for p in expected if p not in truth), None)
    if missing is not None:
        with pytest.raises(KeyError):
            tier.parent(missing)


def test_the_ids_never_outgrow_what_the_tiers_can_hold() -> None:
    """Ids live while a tier holds their page and are reused before new ones are made, so a node's id arrays stop
    at its tiers' capacities together (not at the next doubling), and asking for more ids than that is refused."""
    pool = KvPool(NodeId("n"), 5, 7, BranchCountEviction(), tables=PageTables.IDS)
    ids = pool.page_ids
    assert ids is not None and ids.limit == 12
    for round_ in range(40):  # chains stored and evicted over and over through both tiers
        chain = chain_hashes(f"r{round_}:{i}".encode() for i in range(4))
        for tier in (Tier.HOST, Tier.GPU):
            pool.make_room(tier, 4, float(round_))
            pool.tier(tier).insert_all({p: (chain[i - 1] if i else None) for i, p in enumerate(chain)}, float(round_))
        assert len(ids.hashes) <= 12 and len(pool.l1.t.state) <= 12  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        PageIds(limit=0)
    small = PageIds(limit=3)
    for i in range(3):
        small.intern(PageHash(100 + i), None)
    with pytest.raises(OverflowError):
        small.intern(PageHash(200), None)
    # the hash -> id dict's values (and the free ids) are the shared int objects of their ids, never ints of their own
    assert ids._id and all(v is _INTS[v] for v in [*ids._id.values(), *ids._free])
    assert all(v is _INTS[v] for v in small._id.values())


def test_counts_follow_their_pages_between_the_ids_and_the_dict_of_unheld_pages() -> None:
    """A page's branch count is kept by its id while a tier holds it and by its hash otherwise (pushed before
    the page arrives, or kept after it left); the mapping view reads both, and re-storing a page takes its
    count back to the id (its counted flag with it)."""
    pool = KvPool(NodeId("n"), 4, 4, BranchCountEviction(), check=True, tables=PageTables.IDS)
    ids = pool.page_ids
    assert ids is not None
    chain = chain_hashes(f"c{i}".encode() for i in range(3))
    pool.set_counts({chain[0]: 2, chain[1]: 1})  # before any tier holds them
    assert ids.counts == {chain[0]: 2, chain[1]: 1} and dict(pool._counts) == ids.counts
    for i, page in enumerate(chain):
        pool.store(Tier.HOST, page, chain[i - 1] if i else None, 1.0, owner="o", from_reservation=False)
    assert not ids.counts and [pool.count(p) for p in chain] == [2, 1, 0]
    assert ids.counted[ids.ids(chain)].tolist() == [True, True, False]
    pool.release("o", 2.0)
    # uncounted first, then the counted chain's end first (`check=True`: the pool's own choice is compared with it)
    assert pool.expected_victims(Tier.HOST, 3, frozenset()) == [chain[2], chain[1], chain[0]]
    pool.evict(Tier.HOST, 3, 3.0)
    assert ids.counts == {chain[0]: 2, chain[1]: 1} and len(ids) == 0  # the counts outlive the copies
    pool.set_counts({chain[0]: 0})
    assert dict(pool._counts) == {chain[1]: 1} and len(pool._counts) == 1 and chain[1] in pool._counts


def _same_pools(ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int,
                chains: list[list[PageHash]] = CHAINS) -> None:  # fmt: skip
    """The set tables, the id tables and the id tables over blocks of labels (`dense_labels`: correct for any page
    names, the simulator's dense labels only make it cheap) driven alike, compared after every operation."""
    pools = [
        KvPool(NodeId("n"), l1, l2, LruEviction() if lru else BranchCountEviction(), check=True, tables=tables,
               dense_labels=dense)
        for tables, dense in ((PageTables.SETS, False), (PageTables.IDS, False), (PageTables.IDS, True))
    ]
    assert isinstance(pools[0].l2, TierPool) and isinstance(pools[1].l2, IdTierPool)
    _LOADS.clear()
    _RESOLVED.clear()
    now = 0.0
    for op, c, start, n, k in ops:
        now += float(k % 2)  # several operations at one time, too
        lo = 0 if op in ("admit", "walk", "hostwalk", "load") else start  # (admissions take whole prompts, from the chain's first page)
        pages = [(chains[c][i], chains[c][i - 1] if i else None) for i in range(lo, min(12, start + n))]
        results = [_apply(p, op, pages, n, k, now) for p in pools]
        events = [p.drain_events() for p in pools]
        for other in (1, 2):
            assert results[0] == results[other], (op, other)
            assert events[0] == events[other], (op, other)
            for tier in Tier:
                assert _view(pools[0], tier) == _view(pools[other], tier), (op, tier, other)
            assert pools[0].gauges() == pools[other].gauges()
            assert {p: pools[0].count(p) for p, _ in pages} == {p: pools[other].count(p) for p, _ in pages}


def test_errors_leave_the_id_tier_as_it_was() -> None:
    """Bad calls raise `PoolInvariantError` naming the page, as the set tier does, and change nothing."""
    pool = KvPool(NodeId("n"), 4, 4, BranchCountEviction(), check=True, tables=PageTables.IDS)
    a, b = CHAINS[0][0], CHAINS[0][1]
    pool.l1.reserve("o0", 1)
    pool.store_all(Tier.GPU, [(a, None)], 0.0, owner="o0")
    before = _view(pool, Tier.GPU)
    with pytest.raises(PoolInvariantError, match="not resident"):
        pool.l1.pin_all("o1", [a, b], 1.0)
    with pytest.raises(PoolInvariantError, match="pinned"):
        pool.l1.remove(a)
    with pytest.raises(PoolInvariantError, match="already resident"):
        pool.l1.insert(a, None, 1.0)
    assert _view(pool, Tier.GPU) == before
    pool.check_invariants()


def test_the_tables_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "ids")
    assert page_tables([LruEviction(), BranchCountEviction()]) is PageTables.IDS
    assert isinstance(KvPool(NodeId("n"), 4, 4, BranchCountEviction()).l1, IdTierPool)
    monkeypatch.setenv(ENV, "sets")
    assert isinstance(KvPool(NodeId("n"), 4, 4, BranchCountEviction()).l1, TierPool)
    monkeypatch.setenv(ENV, "arrays")
    with pytest.raises(ValueError, match="EVOLVING_INFRA_PAGE_TABLES must be one of"):
        page_tables([LruEviction()])
    monkeypatch.delenv(ENV)
    assert page_tables([LruEviction()]) is PageTables.IDS  # the default
    assert type(KvPool(NodeId("n"), 4, 4, BranchCountEviction()).l1) is IdTierPool
