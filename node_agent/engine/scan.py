"""Scans of a prompt's pages against tier residency, done with C-level passes (`map` over a set's
`__contains__`, `itertools.compress`, `list.index`) instead of a Python step per page.

A CC prompt is thousands of pages, and admission reads each page's residency in a tier or two: the page-by-page
loops these replace cost about ten times more per page. Each function returns exactly what the page-by-page loop
it names returns (checked against those loops by hypothesis tests in `tests/node_agent/test_scan.py`).

Boundary: pure functions over page sequences and read-only membership views; no pool state changes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import chain, compress
from operator import not_, or_

from evolving_infra.core.pages import PageHash

Pair = tuple[PageHash, PageHash | None]


def _leading(flags: list[bool]) -> int:
    """The length of the leading stretch of True in `flags`."""
    try:
        return flags.index(False)
    except ValueError:
        return len(flags)


def split_prefix(
    prefix: Sequence[PageHash], first: AbstractSet[PageHash], second: AbstractSet[PageHash]
) -> tuple[list[PageHash], list[tuple[int, PageHash]]]:
    """Walk `prefix` up to its first page in neither `first` nor `second`: the pages in `first`, and
    (index, page) of the others (all in `second`), in order. The loop it replaces:

        for i, page in enumerate(prefix):
            if page in first: a.append(page)
            elif page in second: b.append((i, page))
            else: break
    """
    in_first = list(map(first.__contains__, prefix))
    if all(in_first):
        return list(prefix), []
    ok = list(map(or_, in_first, map(second.__contains__, prefix)))
    gap = _leading(ok)
    head = in_first[:gap]
    return list(compress(prefix, head)), list(compress(enumerate(prefix), map(not_, head)))


def host_walk(
    prefix: Sequence[PageHash],
    host: AbstractSet[PageHash],
    skipped: Sequence[AbstractSet[PageHash]],
    fetchable: AbstractSet[PageHash],
    limit: int,
) -> tuple[list[PageHash], list[PageHash]]:
    """Host admission's walk over `prefix`: (pages to pin, pages to fetch). A page in `host` is pinned, else a
    page in one of `skipped` (GPU memory, pages arriving) is passed over, else a page in `fetchable` is
    fetched, else the walk ends; it also ends once `limit` pages are pinned or fetched. The loop it replaces:

        for page in prefix:
            if len(pins) + len(fetch) >= limit: break
            if page in host: pins.append(page)
            elif any(page in s for s in skipped): continue
            elif page in fetchable: fetch.append(page)
            else: break
    """
    in_host = list(map(host.__contains__, prefix))
    ok = in_host
    skip: list[bool] | None = None  # in one of `skipped` (read only where not in `host`)
    for other in skipped:
        if all(ok):
            break
        flags = list(map(other.__contains__, prefix))
        skip = flags if skip is None else list(map(or_, skip, flags))
        ok = list(map(or_, ok, flags))
    if fetchable and not all(ok):
        ok = list(map(or_, ok, map(fetchable.__contains__, prefix)))
    gap = _leading(ok)
    hosted = in_host[:gap]
    # within the walk every page is pinned, passed over or fetched: taken = pinned or not passed over
    take = [True] * gap if skip is None else list(map(or_, hosted, map(not_, skip[:gap])))
    limit = max(0, limit)
    taken = list(compress(prefix, take))[:limit]
    taken_hosted = list(compress(hosted, take))[:limit]
    return list(compress(taken, taken_hosted)), list(compress(taken, map(not_, taken_hosted)))


def missing_pairs(pages: Sequence[PageHash], present: AbstractSet[PageHash]) -> list[Pair]:
    """(page, parent) of each page of the chain `pages` (the first page's parent None) not in `present`,
    in order: `[(p, q) for p, q in zip(pages, (None, *pages)) if p not in present]`."""
    pairs = zip(pages, chain((None,), pages))
    if not present:
        return list(pairs)
    return list(compress(pairs, map(not_, map(present.__contains__, pages))))
