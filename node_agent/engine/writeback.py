"""L1 write-backs whose room in L2 evicts pages of the same write-back, planned at once (`plan_write_back`).

When L1 evicts a run of pages, each page L2 lacks is written back on its way out (`KvPool._into_l2`, page by
page): it takes a free slot, or else evicts L2's first cached page in eviction order. That first page can be
one of the run's own pages:
- one the write-back already wrote or touched (its key is now "accessed now"): in a host tier full of pages
  the active branches count, the run's uncounted pages sort before every counted page, so they evict one
  another;
- one the write-back reaches later: L1's least recently used pages are often L2's too (they were written
  through together), so L2 evicts a page of the run that is then written again at its turn.
`TierRuns.room_for_run` plans only runs where neither can happen. This plans the others exactly: the page-by-page
sequence replayed as a merge of the tier's eviction order (taken out lazily, ascending) with a heap of the run's
pages already written or touched, keyed as accessed now (a touched page that was read at a later time keeps that
time). A few Python steps per page replace a victim search, a removal and a KV event per page.

The plan names the L2 evictions that happen before the pages that cause them are written (`before`: pages of the
order, including pages of the run not yet reached), the pages L2 lacks when their turn comes (`missing`: written
back), and the pages of the run evicted after their own turn (`after` those written then, `touched_after` those
L2 held then). Applied as: `before` and `touched_after` removed, the other held pages touched, the missing pages
but `after` inserted, each tier ends in the page-by-page state; its KV events (one removal: `before` and
`touched_after`; the stored chains of every missing page; one removal: `after`) replay to the same resident set
and name the same removed pages, each as often.

Boundary: the merge only; the tiers (`TierRuns.plan_write_back`, `IdTierPool.plan_write_back`) supply the order,
the pages' keys and their residency, and `KvPool` applies the plan.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evolving_infra.core.pages import PageHash

Place = tuple[tuple[float, ...], int]
"""A cached page's place in eviction order: (policy key, rank), ascending."""


@dataclass(slots=True)
class WriteBackPlan:
    """What writing a run back page by page does to L2 (see the module docstring)."""

    before: list[PageHash]
    missing: set[PageHash]
    after: list[PageHash]
    """The pages of the run evicted after their own turn that L2 lacked then (written, then evicted)."""
    touched_after: list[PageHash]
    """The pages of the run evicted after their own turn that L2 held then (touched, then evicted)."""
    taken: list[PageHash]
    """Pages taken out of the order and not evicted: the caller enters them again (after applying the plan, so
    that they enter under their keys then)."""
    complete: bool = True
    """False where a page would find no room (page by page drops it): nothing is planned, and `taken` holds
    every page taken out of the order (the caller enters them again and goes page by page)."""


def plan_write_back(
    pages: Sequence[PageHash],
    held: Sequence[bool],
    cached: Sequence[bool],
    places: Sequence[Place],
    written: Sequence[Place],
    free: int,
    take: Callable[[int], list[tuple[PageHash, Place]]],
) -> WriteBackPlan:
    """Replay writing `pages` (distinct, in order) back one at a time. Per page: whether L2 holds it now
    (`held`), whether it is cached there then (`cached`: not pinned; only read for held pages), its place once
    touched now (`places`: a page keeps a later last access it has) and once written now (`written`). `free`: L2's
    free slots; `take(k)`: the next (up to) `k` cached pages of the order with their places, ascending, taken out
    of the order."""
    index = {page: i for i, page in enumerate(pages)}
    in_l2 = list(held)
    heap: list[tuple[Place, int]] = []  # the run's pages written or touched so far (cached in L2)
    queue: list[tuple[PageHash, Place]] = []  # pages taken from the order, ascending; `head` the next one
    head = 0
    skipped: list[PageHash] = []  # taken, but a page of the run reached since (its entry there is stale)
    before: list[PageHash] = []
    after: list[PageHash] = []
    touched_after: list[PageHash] = []
    missing: set[PageHash] = set()
    need = sum(1 for h in held if not h) - free
    for i, page in enumerate(pages):
        if in_l2[i]:  # (a page of the run evicted before its turn is not: it is written again)
            if cached[i]:
                heapq.heappush(heap, (places[i], i))
            continue
        missing.add(page)
        if free:
            free -= 1
        else:
            while True:  # the order's next page that is not a page of the run already reached
                if head == len(queue):  # first what the pages L2 lacks need, then more by doubling
                    more = take(max(need, len(queue), 1))
                    need = 0
                    if not more:
                        break
                    queue += more
                j = index.get(queue[head][0])
                if j is None or j > i:  # (pages of the run up to `i` are reached)
                    break
                skipped.append(queue[head][0])
                head += 1
            old = queue[head] if head < len(queue) else None
            if heap and (old is None or heap[0][0] < old[1]):
                j = heapq.heappop(heap)[1]
                (after if pages[j] in missing else touched_after).append(pages[j])
                in_l2[j] = False
            elif old is not None:
                head += 1
                before.append(old[0])
                j = index.get(old[0])
                if j is not None:
                    in_l2[j] = False  # a page of the run not reached yet: written again at its turn
            else:  # no cached page left: page by page drops this one
                return WriteBackPlan([], set(), [], [], [page for page, _ in queue] + skipped, complete=False)
        in_l2[i] = True
        heapq.heappush(heap, (written[i], i))
    return WriteBackPlan(before, missing, after, touched_after, [page for page, _ in queue[head:]] + skipped)
