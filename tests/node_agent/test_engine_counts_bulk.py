"""`KvPool.set_counts` (bulk dict operations) against the page-by-page update it replaced: the same counts
table, in the same order, and the same pages reported as flipped (0 <-> positive), in the same order; and the
router's pushes in stretches (`CountUpdates`) against the plain dict of the same updates."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.pages import CountUpdates, PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine import KvPool
from evolving_infra.node_agent.engine.idpool import PageTables

PAGES = chain_hashes(f"c{i}".encode() for i in range(12))
updates_st = st.dictionaries(st.sampled_from(PAGES), st.integers(0, 3), max_size=12)


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


@given(st.lists(updates_st, max_size=6))
def test_set_counts_matches_page_by_page(batches: list[dict[PageHash, int]]) -> None:
    pool = KvPool(NodeId("n"), 4, 8, BranchCountEviction(), check=True, tables=PageTables.SETS)  # (records the set tiers' recounts)
    seen: list[list[PageHash]] = []
    changed = pool.l2.counts_changed

    def record(pages: object, flipped: list[PageHash]) -> None:
        seen.append(list(flipped))
        changed(pages, flipped)  # type: ignore[arg-type]

    pool.l2.counts_changed = record  # type: ignore[method-assign]
    model: dict[PageHash, int] = {}
    for updates in batches:
        expected = page_by_page(model, updates)
        pool.set_counts(updates)
        assert seen.pop() == expected
        assert list(pool._counts.items()) == list(model.items())


groups_st = st.lists(
    st.tuples(st.lists(st.sampled_from(PAGES), unique=True, max_size=6), st.integers(0, 3)), max_size=4
)


@given(st.lists(groups_st, max_size=6))
def test_pushes_in_stretches_match_the_same_dict(batches: list[list[tuple[list[PageHash], int]]]) -> None:
    """The router's pushes (`CountUpdates`: stretches of one count each, overlapping or not) leave the id tables
    as the plain dict of the same updates does: the same counts table, in the same order, the same counted
    flags, and the same eviction order of cached pages in both tiers."""
    pools = [KvPool(NodeId("n"), 8, 12, BranchCountEviction(), check=True, tables=PageTables.IDS) for _ in range(2)]
    for pool in pools:  # every page resident in L2 and the first eight in L1, all cached
        for i, page in enumerate(PAGES):
            pool.store(Tier.HOST, page, PAGES[i - 1] if i else None, float(i), owner="o", from_reservation=False)
        pool.release("o", 12.0)
    for batch in batches:
        updates = CountUpdates()
        for pages, count in batch:
            updates.add(pages, count)
        pools[0].set_counts(updates)
        pools[1].set_counts(dict(updates))
        a, b = pools
        assert list(a._counts.items()) == list(b._counts.items())
        ids = a.page_ids
        assert ids is not None and b.page_ids is not None
        assert [bool(ids.counted[ids.get(p)]) for p in PAGES] == [bool(b.page_ids.counted[b.page_ids.get(p)]) for p in PAGES]
    assert pools[0].l2.victims(12) == pools[1].l2.victims(12) == pools[0].expected_victims(Tier.HOST, 12)


@given(st.lists(st.tuples(st.dictionaries(st.sampled_from(PAGES), st.integers(0, 3)), groups_st), max_size=6))
def test_consistent_overlapping_stretches_take_the_stretch_path_and_match_the_dict(
    batches: list[tuple[dict[PageHash, int], list[tuple[list[PageHash], int]]]],
) -> None:
    """Pushes promised consistent (a page in two stretches has one count there, as the router's are) are applied
    stretch by stretch even when stretches overlap, and leave the tables as the dict of the same updates does."""
    pools = [KvPool(NodeId("n"), 8, 12, BranchCountEviction(), check=True, tables=PageTables.IDS) for _ in range(2)]
    for pool in pools:
        for i, page in enumerate(PAGES):
            pool.store(Tier.HOST, page, PAGES[i - 1] if i else None, float(i), owner="o", from_reservation=False)
        pool.release("o", 12.0)
    for given_counts, shape in batches:
        updates = CountUpdates(consistent=True)
        for pages, _ in shape:  # overlapping stretches, each page with the batch's one count for it
            for count in sorted({given_counts[p] for p in pages if p in given_counts}):
                updates.add([p for p in pages if given_counts.get(p) == count], count)
        pools[0].set_counts(updates)
        pools[1].set_counts(updates.as_dict())
        a, b = pools
        assert list(a._counts.items()) == list(b._counts.items())
        ids, other = a.page_ids, b.page_ids
        assert ids is not None and other is not None
        assert [bool(ids.counted[ids.get(p)]) for p in PAGES] == [bool(other.counted[other.get(p)]) for p in PAGES]
    assert pools[0].l2.victims(12) == pools[1].l2.victims(12) == pools[0].expected_victims(Tier.HOST, 12)


def test_count_updates_read_as_the_dict_of_their_stretches() -> None:
    updates = CountUpdates()
    updates.add(PAGES[:3], 2)
    updates.add([], 5)  # (an empty stretch is no stretch)
    updates.add(PAGES[3:5], 0)
    assert updates == {**dict.fromkeys(PAGES[:3], 2), **dict.fromkeys(PAGES[3:5], 0)}
    assert updates.groups == [(PAGES[:3], 2), (PAGES[3:5], 0)] and updates.disjoint()
    updates.add(PAGES[4:6], 1)
    assert updates[PAGES[4]] == 1 and not updates.disjoint()
    assert bool(updates) and not CountUpdates() and len(updates) == 6 and PAGES[5] in updates
