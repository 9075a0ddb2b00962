"""The checks of the directory's count pushes (every count an int >= 0: `checked_counts`, `checked_groups`), and the
set tables' dict of branch counts (page -> count > 0) updated from a push (`update_counts`): which pages flip
between uncounted and counted, found with C-level passes over the push. (The id tables keep their counts by id:
`PageIds.set_counts`, `set_count_groups`.) Telling the tiers is the pool's (`KvPool.set_counts`).

Boundary: checks and the counts dict only; no tier, id or event here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from itertools import compress, filterfalse
from operator import ne, not_

from evolving_infra.core.pages import PageHash


def _bad(page: PageHash, count: object) -> ValueError:
    return ValueError(f"branch count of page {page:#x} must be an integer >= 0, got {count!r}")


def update_counts(counts: dict[PageHash, int], updates: Mapping[PageHash, int]) -> list[PageHash]:
    """Apply `updates` to `counts` (0 forgets a page; checked first, nothing changed on a bad count): the pages whose
    count went from 0 to positive or back, in the order of `updates`."""
    pages, given = checked_counts(updates)
    zero = 0 in given
    if zero and max(given) == 0:  # all zeros (pages leaving): the counted ones flip, and are forgotten
        flipped = list(filter(counts.__contains__, pages))
        deque(map(counts.__delitem__, flipped), maxlen=0)
        return flipped
    if zero:  # the page-by-page rule by C-level passes (each page is once in `updates`)
        flipped = list(compress(pages, map(ne, map(counts.__contains__, pages), map(bool, given))))
        gone = list(filter(counts.__contains__, compress(pages, map(not_, given))))
        counts.update(compress(updates.items(), given))
        deque(map(counts.__delitem__, gone), maxlen=0)
        return flipped
    # all positive (the usual case): the new ones flip, and one C-level update; none flips when every page is
    # counted already (a C-level keys-view check that stops at the first new page, so it costs little otherwise)
    flipped = [] if counts.keys() >= updates.keys() else list(filterfalse(counts.__contains__, pages))
    counts.update(updates)
    return flipped


def checked_counts(updates: Mapping[PageHash, int]) -> tuple[list[PageHash], list[int]]:
    """The pages and counts of `updates`, once every count is checked to be an int >= 0 (`ValueError` else)."""
    values = list(updates.values())
    if not (set(map(type, values)) <= {int} and min(values, default=0) >= 0):
        for page, count in updates.items():
            if not isinstance(count, int) or count < 0:
                raise _bad(page, count)
    return list(updates), values


def checked_groups(groups: Sequence[tuple[Sequence[PageHash], int]]) -> Sequence[tuple[Sequence[PageHash], int]]:
    """`groups` (stretches of pages with one count each), once every count is checked to be an int >= 0."""
    for pages, count in groups:
        if not isinstance(count, int) or count < 0:
            raise _bad(pages[0], count)
    return groups
