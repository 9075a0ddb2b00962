"""`engine.scan`'s C-level prompt scans against the page-by-page loops they replaced in admission."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.scan import host_walk, missing_pairs, split_prefix

pages_st = st.lists(st.integers(0, 15).map(PageHash), max_size=24)
set_st = st.frozensets(st.integers(0, 15).map(PageHash), max_size=16)


@given(pages_st, set_st, set_st)
def test_split_prefix_is_the_walk(prefix: list[PageHash], first: frozenset[PageHash], second: frozenset[PageHash]) -> None:
    a: list[PageHash] = []
    b: list[tuple[int, PageHash]] = []
    for i, page in enumerate(prefix):
        if page in first:
            a.append(page)
        elif page in second:
            b.append((i, page))
        else:
            break
    assert split_prefix(tuple(prefix), first, second) == (a, b)


@given(pages_st, set_st, st.lists(set_st, max_size=2), set_st, st.integers(0, 30))
def test_host_walk_is_the_walk(
    prefix: list[PageHash],
    host: frozenset[PageHash],
    skipped: list[frozenset[PageHash]],
    fetchable: frozenset[PageHash],
    limit: int,
) -> None:
    pins: list[PageHash] = []
    fetch: list[PageHash] = []
    for page in prefix:
        if len(pins) + len(fetch) >= limit:
            break
        if page in host:
            pins.append(page)
        elif any(page in s for s in skipped):
            continue
        elif page in fetchable:
            fetch.append(page)
        else:
            break
    assert host_walk(tuple(prefix), host, skipped, fetchable, limit) == (pins, fetch)


@given(pages_st, set_st)
def test_missing_pairs_is_the_filter(pages: list[PageHash], present: frozenset[PageHash]) -> None:
    expected = [(p, q) for p, q in zip(pages, (None, *pages)) if p not in present]
    assert missing_pairs(tuple(pages), present) == expected
