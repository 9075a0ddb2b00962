"""`ArenaSync`: keeps the host KV arena (real bytes) in step with the engine's host tier (page accounting).

A page is *held* when the engine's L2 holds it, and *kept* when it is held, or the engine's L2 is
writing it (a fetch landing: its transport writes the bytes), or a decode has *staged* it (its prompt
KV, pulled here by the decode path and kept until the decode ends), or a finished prefill has *exposed* it
(`expose`: a page of its prompt that only the engine's L1 holds, because L2 evicted it while L1 kept it,
is written into the arena and kept until the decode node had time to pull it, as a transfer engine reads a
prefill's KV from GPU memory). `reconcile(pages)` makes the arena agree for the given pages: it releases
pages that are not kept, then writes the emulated bytes of held pages the arena lacks (pages a transport is
writing are left to it). A release refused because a peer is reading the page is retried later, as is a
write refused because the arena is full; `retry()` retries both.

Invariant: after `reconcile(P)` with no readers pinning pages and room in the arena, for every page p in
P: held(p) => p is in the arena => kept(p); a page `expose` stored stays there until it is unexposed.
Property-tested in tests/node_agent/test_service_units.py.

Boundary: arena bookkeeping only; called from the event loop thread (transports write concurrently into
slots they reserved, which the arena's own lock protects).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.transfer.arena import KvArena
from evolving_infra.node_agent.transfer.errors import ArenaFull, PageAlreadyPresent, PageNotResident, PagePinned


@dataclass(slots=True)
class SyncStats:
    """Pages written, released, and still waiting (a reader pins them, or no free slot)."""

    stored: int = 0
    released: int = 0
    deferred: int = 0
    unsynced: int = 0


@dataclass(frozen=True, slots=True)
class Exposure:
    """The pages one `ArenaSync.expose` kept, for its `unexpose`."""

    pages: tuple[PageHash, ...]
    epoch: int


class ArenaSync:
    """Arena <-> engine host tier (see the module docstring): `holds(p)` whether the engine's L2 holds
    p, `writing(p)` whether it is writing p (default: never), `gpu_holds(p)` whether its L1 holds p
    (default: never)."""

    def __init__(
        self,
        arena: KvArena,
        holds: Callable[[PageHash], bool],
        writing: Callable[[PageHash], bool] = lambda _page: False,
        gpu_holds: Callable[[PageHash], bool] = lambda _page: False,
    ) -> None:
        self.arena = arena
        self.holds = holds
        self.writing = writing
        self.gpu_holds = gpu_holds
        self._staged: Counter[PageHash] = Counter()
        self._exposed: Counter[PageHash] = Counter()
        self._epoch = 0  # exposures before the last `drop_exposed` are void
        self._retry: set[PageHash] = set()
        self.stats = SyncStats()

    def kept(self, page: PageHash) -> bool:
        return page in self._staged or page in self._exposed or self.holds(page) or self.writing(page)

    def staged(self) -> frozenset[PageHash]:
        return frozenset(self._staged)

    # --- decode staging ------------------------------------------------------------------------------
    def stage(self, pages: Iterable[PageHash]) -> None:
        """Keep `pages` in the arena until `unstage` (counted: two decodes may stage one page)."""
        self._staged.update(set(pages))

    def unstage(self, pages: Iterable[PageHash]) -> None:
        distinct = set(pages)
        for page in distinct:
            left = self._staged[page] - 1
            if left > 0:
                self._staged[page] = left
            else:
                self._staged.pop(page, None)
        self.reconcile(distinct)

    # --- a finished prefill's prompt, until its decode node pulls it ----------------------------------
    def expose(self, pages: Iterable[PageHash]) -> Exposure:
        """Keep the pages of `pages` that only the engine's L1 holds readable until `unexpose`: they are written
        into the arena (a full arena leaves a page out; the others follow L2 as always, so an exposure costs
        slots only for L1-only pages), or are exposed already. Returns the pages kept (counted: two prefills
        may expose one page), for `unexpose`."""
        kept: list[PageHash] = []
        for page in set(pages):
            if page in self._exposed:  # exposed already (another prefill's prompt): kept one more time
                kept.append(page)
                continue
            if page in self.arena or not self.gpu_holds(page):
                continue
            try:
                self.arena.store_emulated(page)
                self.stats.stored += 1
            except PageAlreadyPresent:
                pass  # a transport is writing it: it lands, and is kept from then on
            except ArenaFull:
                continue
            kept.append(page)
        self._exposed.update(kept)
        return Exposure(tuple(kept), self._epoch)

    def unexpose(self, exposure: Exposure) -> None:
        """End `exposure` (one of an earlier `drop_exposed` was ended by it: nothing to do)."""
        if exposure.epoch != self._epoch:
            return
        distinct = set(exposure.pages)
        for page in distinct:
            left = self._exposed[page] - 1
            if left > 0:
                self._exposed[page] = left
            else:
                self._exposed.pop(page, None)
        self.reconcile(distinct)

    def drop_exposed(self) -> None:
        """Forget every exposure (the node dropped its KV: a relaunch, or a switch that strands it); the pages
        leave the arena unless kept otherwise (later `unexpose` calls of them change nothing)."""
        pages = set(self._exposed)
        self._exposed.clear()
        self._epoch += 1
        self.reconcile(pages)

    # --- reconciling ---------------------------------------------------------------------------------
    def apply_events(self, events: Iterable[KvEvent]) -> None:
        """Reconcile every host page the events name (a host or all-tier clear: every arena page)."""
        pages: set[PageHash] = set()
        for event in events:
            if isinstance(event, KvStored | KvRemoved):
                if event.tier is Tier.HOST:
                    pages.update(event.pages)
            elif isinstance(event, KvCleared) and event.tier in (None, Tier.HOST):
                pages.update(self.arena.pages())
                if event.tier is None:  # the engine's memory is gone (a relaunch): so are its exposed prompts
                    self.drop_exposed()
        self.reconcile(pages)

    def reconcile(self, pages: Iterable[PageHash]) -> None:
        todo = set(pages) | self._retry
        self._retry = set()
        release = [p for p in todo if p in self.arena and not self.kept(p)]
        store = [p for p in todo if p not in self.arena and self.holds(p)]
        for page in release:
            try:
                self.arena.release(page)
                self.stats.released += 1
            except PagePinned:
                self._retry.add(page)
                self.stats.deferred += 1
            except PageNotResident:
                pass
        for page in store:
            try:
                self.arena.store_emulated(page)
                self.stats.stored += 1
            except PageAlreadyPresent:
                pass  # a transport is writing it; `fetch_settled` reconciles it once the transfer ends
            except ArenaFull:
                self._retry.add(page)
                self.stats.unsynced += 1

    def retry(self) -> None:
        if self._retry:
            self.reconcile(())

    @property
    def pending(self) -> frozenset[PageHash]:
        """Pages whose reconciliation is waiting for a reader or for room."""
        return frozenset(self._retry)
