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
