"""A node's KV-event outbox: the `KvStored` and `KvRemoved` events of its two tiers since the last drain, recorded
as its pool reports residency changes and coalesced on the way in.

Coalescing: a store joins its tier's latest event when that is a store at the same time whose chain the page
continues (its parent is the event's last page); a removal joins its tier's latest event when that is a removal at
the same time; otherwise the change opens a new event. Events keep the order in which they were opened, across
tiers, so replaying them per tier gives the changes in the order they happened. The run helpers (`stored_run`,
`stored_items`, `removed_all`) record a whole run with exactly the events of its page-by-page calls.

Boundary: records and coalesces KV events for the directory, and builds them at a drain; it knows nothing of the
tiers' residency or branch counts (which pages changed, and when, is the pool's to say: `KvPool`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from operator import ne

from evolving_infra.core.kv_events import KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine.chainrun import ChainRun, pages_and_parents

Entry = tuple[str, Tier, PageHash | None, list[PageHash], float]  # ("S" or "R", tier, parent, pages, time)


class KvOutbox:
    """The KV events of one node's tiers since the last drain (rules in the module docstring). `entries` (oldest
    first; a list that is cleared, never replaced) and `last` (each tier's latest entry, by index) are its state."""

    __slots__ = ("node", "entries", "last")

    def __init__(self, node: NodeId) -> None:
        self.node = node
        self.entries: list[Entry] = []
        self.last: dict[Tier, int] = {}  # index in `entries` of each tier's latest event

    def stored(self, tier: Tier, page: PageHash, parent: PageHash | None, time: float) -> None:
        """`page` (child of `parent`) became resident in `tier` at `time`."""
        last = self.last.get(tier)
        if last is not None:
            kind, _, _, pages, last_time = self.entries[last]
            if kind == "S" and last_time == time and pages[-1] == parent:
                pages.append(page)
                return
        self.last[tier] = len(self.entries)
        self.entries.append(("S", tier, parent, [page], time))

    def removed(self, tier: Tier, page: PageHash, time: float) -> None:
        """`page` left `tier` at `time`."""
        last = self.last.get(tier)
        if last is not None:
            kind, _, _, pages, last_time = self.entries[last]
            if kind == "R" and last_time == time:
                pages.append(page)
                return
        self.last[tier] = len(self.entries)
        self.entries.append(("R", tier, None, [page], time))

    def stored_run(
        self, tier: Tier | None, items: Iterable[tuple[PageHash, PageHash | None]], missing: set[PageHash], time: float
    ) -> None:
        """For each (page, parent) of `items` in order: `stored` in `tier` (unless None), then in L2 if the
        page is in `missing` (write-through). Each tier's latest event grows while its chain continues."""
        first: list[PageHash] | None = None  # page lists of each tier's latest event, once this run made one
        host: list[PageHash] | None = None
        outbox, last = self.entries, self.last
        for page, parent in items:
            if tier is None:
                pass
            elif first is not None and first[-1] == parent:
                first.append(page)
            else:
                self.stored(tier, page, parent, time)
                first = outbox[last[tier]][3]
            if page in missing:
                if host is not None and host[-1] == parent:
                    host.append(page)
                else:
                    self.stored(Tier.HOST, page, parent, time)
                    host = outbox[last[Tier.HOST]][3]

    def stored_chain(self, tier: Tier, pages: Sequence[PageHash], parent: PageHash | None, time: float) -> None:
        """`stored` for each page of the chain `pages` (non-empty; each the parent of the next, the first's
        `parent`), in order: all but the first join the event the first one joins."""
        self.stored(tier, pages[0], parent, time)
        if len(pages) > 1:
            self.entries[self.last[tier]][3].extend(pages[1:])

    def stored_items(self, tier: Tier, items: Iterable[tuple[PageHash, PageHash | None]] | ChainRun,
                     run: Mapping[PageHash, PageHash | None], missing: set[PageHash], time: float) -> None:  # fmt: skip
        """`stored_run(tier, items, missing, time)` for a run `items` made resident in `tier` (`run`: the
        same as a mapping, no page twice; a `ChainRun` is known to be a chain). A chain joins the tier's events
        at once, then each stretch of its pages that L2 lacks joins L2's: per page, the tier's event comes
        before L2's, and a chain grows the tier's event from its first page on, before L2's first event."""
        pages, parents, chain = pages_and_parents(run)
        if not chain:
            assert not isinstance(items, ChainRun)  # (a chain run is a chain)
            self.stored_run(tier, items, missing, time)
            return
        self.stored_chain(tier, pages, parents[0], time)
        if not missing:
            return
        n = len(pages)
        if len(missing) == n:
            self.stored_chain(Tier.HOST, pages, parents[0], time)
            return
        lacks = list(map(missing.__contains__, pages))
        edges = [0, *compress(range(1, n), map(ne, lacks[1:], lacks[:-1])), n]  # where a stretch begins
        for lo, hi in zip(edges, edges[1:]):
            if lacks[lo]:
                self.stored_chain(Tier.HOST, pages[lo:hi], parents[lo], time)

    def removed_all(self, tier: Tier, pages: list[PageHash], time: float) -> None:
        """`removed` for each page of `pages` (non-empty), in order: they all join one event."""
        self.removed(tier, pages[0], time)
        self.entries[self.last[tier]][3].extend(pages[1:])

    def has_events(self) -> bool:
        """Whether `drain` would return any."""
        return bool(self.entries)

    def drain(self) -> tuple[KvEvent, ...]:
        """The KV events since the last drain, oldest first; the outbox is empty after."""
        if not self.entries:
            return ()
        out: list[KvEvent] = []
        for kind, tier, parent, pages, time in self.entries:
            if kind == "S":
                out.append(KvStored(self.node, tier, parent, tuple(pages), time))
            else:
                out.append(KvRemoved(self.node, tier, tuple(pages), time))
        self.entries.clear()
        self.last.clear()
        return tuple(out)
