"""`EvictionOrder._sorted` (a bucket's live entries in descending rank) against its definition, sorting by
`rank`: with depths all distinct (one sort by depth) and with tied depths (hash sort, then depth sort)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.evictindex import EvictionOrder

_HASHES = st.integers(0, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(
    depths=st.dictionaries(_HASHES, st.integers(0, 40), max_size=60),
    distinct=st.booleans(),
    stale=st.sets(_HASHES, max_size=10),
    lru=st.booleans(),
)
def test_sorted_is_descending_rank(depths: dict[int, int], distinct: bool, stale: set[int], lru: bool) -> None:
    if distinct:  # one chain's pages: every depth once
        depths = {page: i for i, page in enumerate(depths)}
    depth = {PageHash(page): d for page, d in depths.items()}
    cached = set(depth)
    access = dict.fromkeys(depth, 1.0)
    order = EvictionOrder(LruEviction() if lru else BranchCountEviction(), cached, access, {}, depth)
    members = cached | {PageHash(page) for page in stale if page not in depth}  # entries of evicted pages
    order._size = len(members)
    key = (1.0,) if lru else (0.0, 1.0)
    got = order._sorted(members, key)
    assert got == sorted(cached, key=order.rank, reverse=True)
    assert members == cached and order._size == len(cached)
