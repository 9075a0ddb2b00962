"""Page depths of the L1/L2 pools (the eviction tie-break): `new_depths`' C-level chain path against the
page-by-page rule, and the minimum rank `floor` uses against its definition."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.evictindex import _min_rank
from evolving_infra.node_agent.engine.tierruns import new_depths


def _page_by_page(items: dict[PageHash, PageHash | None], depth: dict[PageHash, int]) -> dict[PageHash, int]:
    known = dict(depth)
    out: dict[PageHash, int] = {}
    for page, parent in items.items():
        if page not in known:
            known[page] = out[page] = known.get(parent, -1) + 1  # type: ignore[arg-type]
    return out


@st.composite
def _runs(draw: st.DrawFn) -> tuple[dict[PageHash, PageHash | None], dict[PageHash, int]]:
    pages = draw(st.lists(st.integers(1, 40), min_size=0, max_size=20, unique=True))
    known = draw(st.dictionaries(st.integers(1, 40), st.integers(0, 50), max_size=15))
    chain = draw(st.booleans())
    items: dict[PageHash, PageHash | None] = {}
    for i, page in enumerate(pages):
        if chain:
            parent = pages[i - 1] if i else draw(st.one_of(st.none(), st.integers(1, 40)))
        else:
            parent = draw(st.one_of(st.none(), st.integers(1, 40)))
        items[PageHash(page)] = None if parent is None else PageHash(parent)
    return items, {PageHash(p): d for p, d in known.items()}


@given(_runs())
def test_new_depths_equal_the_page_by_page_rule(case: tuple[dict[PageHash, PageHash | None], dict[PageHash, int]]) -> None:
    items, depth = case
    assert new_depths(items, depth) == _page_by_page(items, depth)


@given(st.dictionaries(st.integers(0, 2**64 - 1), st.integers(0, 3000), max_size=30))
def test_min_rank_orders_deeper_pages_first_then_by_hash(depths: dict[int, int]) -> None:
    pages = [PageHash(p) for p in depths]
    expected = min(((-depths[p], p) for p in pages), default=None)
    got = _min_rank(pages, {PageHash(p): d for p, d in depths.items()})
    if expected is None:
        assert got == math.inf
    else:
        assert got == expected[1] - (-expected[0] << 64)
