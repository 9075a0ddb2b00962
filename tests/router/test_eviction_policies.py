"""Host eviction order: branch counts (zero counts first, LRU within each group) and the LRU baseline."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import (
    BranchCountEviction,
    EvictionPolicyName,
    HostPage,
    LruEviction,
    eviction_policy,
)
from evolving_infra.core.pages import PageHash


def page(h: int, count: int, last: float, pinned: bool = False) -> HostPage:
    return HostPage(PageHash(h), count, last, pinned)


PAGES = [
    page(1, 2, 1.0),  # oldest, referenced by two branches
    page(2, 0, 5.0),  # replaced history
    page(3, 0, 3.0),  # finished sub-agent
    page(4, 1, 2.0),  # waiting for a tool
    page(5, 0, 0.5, pinned=True),  # being fetched: never a victim
]


@pytest.mark.parametrize(
    ("policy", "n", "expected"),
    [
        (BranchCountEviction(), 1, [3]),
        (BranchCountEviction(), 2, [3, 2]),
        (BranchCountEviction(), 3, [3, 2, 1]),
        (BranchCountEviction(), 10, [3, 2, 1, 4]),
        (LruEviction(), 1, [1]),
        (LruEviction(), 3, [1, 4, 3]),
        (LruEviction(), 10, [1, 4, 3, 2]),
        (LruEviction(), 0, []),
    ],
)
def test_victims_in_policy_order(policy: BranchCountEviction | LruEviction, n: int, expected: list[int]) -> None:
    assert policy.victims(PAGES, n) == expected


def test_lru_ignores_counts_and_branch_counts_do_not() -> None:
    pages = [page(1, 5, 1.0), page(2, 0, 2.0)]
    assert LruEviction().victims(pages, 1) == [1]
    assert BranchCountEviction().victims(pages, 1) == [2]


def test_ties_break_by_page_hash() -> None:
    pages = [page(9, 0, 1.0), page(4, 0, 1.0), page(7, 0, 1.0)]
    assert LruEviction().victims(pages, 3) == [4, 7, 9]
    assert BranchCountEviction().victims(reversed(pages), 2) == [4, 7]


def test_policy_registry() -> None:
    assert eviction_policy("lru").name is EvictionPolicyName.LRU
    assert eviction_policy(EvictionPolicyName.BRANCH_COUNT).name is EvictionPolicyName.BRANCH_COUNT
    with pytest.raises(ValueError, match="unknown eviction policy 'fifo'; known: branch-count, lru"):
        eviction_policy("fifo")


host_pages = st.lists(
    st.builds(
        HostPage,
        page=st.integers(0, 2**64 - 1).map(PageHash),
        count=st.integers(0, 3),
        last_access=st.floats(0, 100, allow_nan=False),
        pinned=st.booleans(),
    ),
    unique_by=lambda p: p.page,
    max_size=30,
)


@given(pages=host_pages, n=st.integers(0, 35))
def test_branch_count_order_is_a_prefix_of_the_sorted_unpinned_pages(pages: list[HostPage], n: int) -> None:
    victims = BranchCountEviction().victims(pages, n)
    unpinned = sorted((p for p in pages if not p.pinned), key=lambda p: (p.count > 0, p.last_access, p.page))
    assert victims == [p.page for p in unpinned[:n]]
    chosen = set(victims)
    assert not any(p.pinned and p.page in chosen for p in pages)
    if any(p.count > 0 and p.page in chosen for p in pages):
        assert all(p.page in chosen for p in pages if p.count == 0 and not p.pinned)


@given(pages=host_pages, n=st.integers(0, 35))
def test_lru_order_is_a_prefix_of_the_unpinned_pages_by_last_access(pages: list[HostPage], n: int) -> None:
    victims = LruEviction().victims(pages, n)
    unpinned = sorted((p for p in pages if not p.pinned), key=lambda p: (p.last_access, p.page))
    assert victims == [p.page for p in unpinned[:n]]


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([0.0, 1.0, 2.0]), st.integers(0, 5)),
        min_size=1, max_size=30, unique_by=lambda t: t,
    ),
    st.integers(1, 30),
)
def test_ties_of_equal_key_go_deepest_first_then_by_hash(rows: list[tuple[int, float, int]], n: int) -> None:
    """Among pages of equal key the deeper goes first (a chain keeps its prefix); the key always comes first."""
    pages = [HostPage(PageHash(i + 1), count, last, depth=depth) for i, (count, last, depth) in enumerate(rows)]
    for policy in (BranchCountEviction(), LruEviction()):
        got = policy.victims(pages, n)
        by = {p.page: p for p in pages}
        assert got == sorted(got, key=lambda h: (*policy.key(by[h]), -by[h].depth, h))
        rest = [p for p in pages if p.page not in got]
        if rest and got:  # nothing left behind precedes the last victim
            last = by[got[-1]]
            assert all((*policy.key(p), -p.depth, p.page) > (*policy.key(last), -last.depth, last.page) for p in rest)


def test_a_chain_released_at_once_loses_its_end_first() -> None:
    chain = [HostPage(PageHash(h), 0, 7.0, depth=d) for d, h in enumerate((50, 10, 40, 20, 30))]
    assert LruEviction().victims(chain, 2) == [PageHash(30), PageHash(20)]
    whole = [PageHash(h) for h in (30, 20, 40, 10, 50)]
    assert BranchCountEviction().victims(chain, 5) == whole
