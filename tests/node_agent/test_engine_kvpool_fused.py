"""The pool's fused steps against their page-by-page definitions: the events of a stored run joined a chain at
once (`KvPool._stored_items`) equal those of `_stored_run`'s step per page exactly (the same outbox, not only
the same replay), and `set_counts` reading a zero off the minimum reports the same flips as page by page, for
bools too (ints, so counts, that are not of type int)."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine import KvPool
from evolving_infra.node_agent.engine.idpool import PageTables

CHAINS = [chain_hashes(f"k{c}:{i}".encode() for i in range(10)) for c in range(2)]


def parent(c: int, i: int) -> PageHash | None:
    return CHAINS[c][i - 1] if i else None


PRIOR = st.lists(
    st.tuples(st.sampled_from(["S", "R"]), st.sampled_from(list(Tier)), st.integers(0, 1), st.integers(0, 9),
              st.sampled_from([0.0, 1.0])),  # fmt: skip
    max_size=5,
)


@given(
    prior=PRIOR, c=st.integers(0, 1), start=st.integers(0, 9), n=st.integers(1, 10), shuffle=st.randoms(),
    chain=st.booleans(), missing=st.lists(st.booleans(), min_size=10, max_size=10), host=st.booleans(),
    time=st.sampled_from([0.0, 1.0]),
)  # fmt: skip
def test_stored_items_equal_the_page_by_page_events(
    prior: list[tuple[str, Tier, int, int, float]], c: int, start: int, n: int, shuffle: object, chain: bool,
    missing: list[bool], host: bool, time: float,
) -> None:  # fmt: skip
    pool = KvPool(NodeId("n"), 4, 4, LruEviction())
    for kind, tier, pc, i, when in prior:  # earlier events the run's may join
        if kind == "S":
            pool._stored(tier, CHAINS[pc][i], parent(pc, i), when)
        else:
            pool._removed(tier, CHAINS[pc][i], when)
    items = [(CHAINS[c][i], parent(c, i)) for i in range(start, min(10, start + n))]
    if not chain:
        shuffle.shuffle(items)  # type: ignore[attr-defined]
    run = dict(items)
    tier = Tier.HOST if host else Tier.GPU
    lacking = set() if host else {p for (p, _), m in zip(items, missing) if m}
    other = copy.deepcopy(pool)
    pool._stored_items(tier, items, run, lacking, time)
    other._stored_run(tier, items, lacking, time)
    assert pool._events.entries == other._events.entries
    assert pool._events.last == other._events.last
    assert pool.drain_events() == other.drain_events()


def page_by_page(counts: dict[PageHash, int], updates: dict[PageHash, int]) -> list[PageHash]:
    flipped: list[PageHash] = []
    for page, count in updates.items():
        if count:
            if page not in counts:
                flipped.append(page)
            counts[page] = count
        elif counts.pop(page, None) is not None:
            flipped.append(page)
    return flipped


def _recording_pool(tier: str) -> tuple[KvPool, list[list[PageHash]]]:
    """A pool whose tier `tier` ("l1" or "l2") records the pages each `set_counts` flips, in call order."""
    pool = KvPool(NodeId("n"), 4, 8, BranchCountEviction(), check=True, tables=PageTables.SETS)  # (records the set tiers' recounts)
    seen: list[list[PageHash]] = []
    changed = getattr(pool, tier).counts_changed

    def record(pages: object, flipped: list[PageHash]) -> None:
        seen.append(list(flipped))
        changed(pages, flipped)

    setattr(getattr(pool, tier), "counts_changed", record)
    return pool, seen


@given(st.lists(st.dictionaries(st.sampled_from(CHAINS[0]), st.one_of(st.integers(0, 3), st.booleans()), max_size=10),
                max_size=6))  # fmt: skip
def test_set_counts_with_zeros_and_bools_matches_page_by_page(batches: list[dict[PageHash, int]]) -> None:
    pool, seen = _recording_pool("l2")
    model: dict[PageHash, int] = {}
    for updates in batches:
        expected = page_by_page(model, updates)
        pool.set_counts(updates)
        assert seen.pop() == expected
        assert list(pool._counts.items()) == list(model.items())


class PageByPage(KvPool):
    """The reference: every run goes page by page (`store`, `land`, `_evict_one`), so every depth is looked up."""

    def _l2_plan(self, pages, now):  # type: ignore[no-untyped-def]
        return None


def _tables(p: KvPool) -> tuple[object, ...]:
    return (dict(p._depth), *(
        (list(t._parent.items()), t.last_accesses(), set(t._pinned), set(t._cached), dict(t._shared),
         {o: set(s) for o, s in t._owner_pins.items()}, dict(t._writing), dict(t._reserved), t.free)
        for t in (p.l1, p.l2)
    ))  # fmt: skip


OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "store", "load", "release", "evict", "count"]),
        st.integers(0, 1), st.integers(0, 9), st.integers(1, 8), st.integers(0, 3),
    ),  # fmt: skip
    max_size=60,
)


@given(ops=OPS, lru=st.booleans(), l1=st.integers(6, 14), l2=st.integers(3, 12))
def test_runs_told_their_depths_keep_the_page_by_page_depths(
    ops: list[tuple[str, int, int, int, int]], lru: bool, l1: int, l2: int
) -> None:
    """Stores and GPU loads (begin_writes, land_all) as runs, whose plan tells L1's insert that none or all of
    the pages have a depth, against page by page: the same depth table and tables of both tiers."""
    pools = [cls(NodeId("n"), l1, l2, LruEviction() if lru else BranchCountEviction(), check=True,
                 tables=PageTables.SETS) for cls in (KvPool, PageByPage)]  # fmt: skip (the set tiers' tables)
    now = 0.0
    for op, c, start, n, k in ops:
        now += float(k % 2)
        owner = f"o{k}"
        pages = [(CHAINS[c][i], parent(c, i)) for i in range(start, min(10, start + n))]
        for p in pools:
            if op == "store":
                todo = [(page, par) for page, par in pages if not p.l1.contains(page) and not p.l1.is_writing(page)]
                if todo and p.make_room(Tier.GPU, len(todo), now):
                    p.l1.reserve(owner, len(todo))
                    p.store_all(Tier.GPU, todo, now, owner=owner)
            elif op == "load":  # from L2 into L1, as an asynchronous load does
                todo = [(page, par) for page, par in pages
                        if p.l2.contains(page) and not p.l1.contains(page) and not p.l1.is_writing(page)]  # fmt: skip
                if todo and p.make_room(Tier.GPU, len(todo), now):
                    p.begin_writes(Tier.GPU, owner, [page for page, _ in todo])
                    p.land_all(Tier.GPU, owner, todo, now)
            elif op == "release":
                p.release(owner, now)
            elif op == "evict":
                p.evict(Tier.GPU if k % 2 else Tier.HOST, n, now)
            else:
                p.set_counts({page: k for page, _ in pages})
            p.drain_events()
        assert _tables(pools[0]) == _tables(pools[1])


def test_a_load_keeps_the_depths_its_pages_got_when_first_stored() -> None:
    """Pages first stored without their parent (depths from 0), then their prefix, all written back to L2 and
    loaded again into L1: L2 holds them all, so the load keeps their depths (page by page would too)."""
    pools = [cls(NodeId("n"), 12, 12, LruEviction(), check=True, tables=PageTables.SETS) for cls in (KvPool, PageByPage)]
    chain = CHAINS[0]
    for p in pools:
        for lo, hi, owner in ((5, 8, "a"), (0, 5, "b")):
            p.l1.reserve(owner, hi - lo)
            p.store_all(Tier.GPU, [(chain[i], parent(0, i)) for i in range(lo, hi)], 1.0, owner=owner)
            p.release(owner, 2.0)
        p.evict(Tier.GPU, 8, 3.0)
        p.begin_writes(Tier.GPU, "c", chain[5:8])
        p.land_all(Tier.GPU, "c", [(chain[i], parent(0, i)) for i in range(5, 8)], 4.0)
    assert [pools[0]._depth[page] for page in chain[:8]] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert _tables(pools[0]) == _tables(pools[1])


def _batch(pages: list[PageHash], mode: str, counts: list[int]) -> dict[PageHash, int]:
    if mode == "zeros":  # every count 0: pages leaving (the all-zero path)
        return dict.fromkeys(pages, 0)
    return {page: max(1, c) if mode == "positive" else c for page, c in zip(pages, counts)}


@given(st.lists(st.tuples(st.lists(st.sampled_from(CHAINS[0][:4]), unique=True, max_size=4),
                          st.sampled_from(["zeros", "positive", "mixed"]),
                          st.lists(st.integers(0, 3), min_size=4, max_size=4)),
                max_size=8))  # fmt: skip
def test_set_counts_fast_paths_match_page_by_page(batches: list[tuple[list[PageHash], str, list[int]]]) -> None:
    """Few pages, so pushes often hit the fast paths: all zeros, all positive and every page counted already
    (nothing flips), all positive and some new."""
    pool, seen = _recording_pool("l1")
    model: dict[PageHash, int] = {}
    for pages, mode, counts in batches:
        updates = _batch(pages, mode, counts)
        expected = page_by_page(model, updates)
        pool.set_counts(updates)
        assert seen.pop() == expected
        assert list(pool._counts.items()) == list(model.items())
