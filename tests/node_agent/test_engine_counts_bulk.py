"""`KvPool.set_counts` (bulk dict operations) against the page-by-page update it replaced: the same counts
table, in the same order, and the same pages reported as flipped (0 <-> positive), in the same order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId
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
