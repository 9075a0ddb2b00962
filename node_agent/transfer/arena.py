"""`KvArena`: a node's host KV memory (L2) as one contiguous buffer of fixed-size page slots.

The buffer is an anonymous memory map (page-aligned, zero pages until touched) so a transport can
register it once and peers can read slots directly. A page hash maps to at most one slot. Slot states:

    FREE --reserve--> RESERVED --commit--> READY --release--> FREE
                         \\--abort--> FREE

A READY page has the xxh3-64 checksum its bytes had when committed; `commit` can check the written
bytes against an expected checksum (what a transport does after every transfer). Readers that copy
bytes out (the gRPC page stream) pin pages for the copy; a pinned page cannot be released. One-sided
readers (Mooncake) cannot pin and rely on the checksum instead.

Invariant: free + reserved + ready == slots, and each slot holds at most one page (`check_invariants`).
Thread safety: state changes take one lock; bytes are written and read outside it (a slot is owned by
its reserver until commit, and read-only while ready).

Boundary: memory and bookkeeping only; which pages to keep is the engine's and eviction policy's call.
"""

from __future__ import annotations

import heapq
import mmap
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.transfer.content import BytesLike, emulated_page, page_checksum
from evolving_infra.node_agent.transfer.errors import (
    ArenaFull,
    ChecksumMismatch,
    PageAlreadyPresent,
    PageNotResident,
    PagePinned,
    WrongSlotState,
)

MAX_ARENA_BYTES = 1 << 40


@dataclass(frozen=True, slots=True)
class ArenaGauges:
    """Slot counts: free + reserved + ready == slots; `pinned` counts ready pages being read."""

    slots: int
    free: int
    reserved: int
    ready: int
    pinned: int


@dataclass(frozen=True, slots=True)
class PageSlot:
    """Where a ready page lies in the arena, and its checksum."""

    page: PageHash
    slot: int
    checksum: int


class KvArena:
    """Host KV memory of one node: `slots` slots of `page_bytes` bytes each (see the module docstring)."""

    def __init__(self, slots: int, page_bytes: int) -> None:
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"arena slots must be a positive integer, got {slots!r}")
        if not isinstance(page_bytes, int) or page_bytes < 1:
            raise ValueError(f"arena page_bytes must be a positive integer, got {page_bytes!r}")
        if slots * page_bytes > MAX_ARENA_BYTES:
            raise ValueError(f"arena of {slots} x {page_bytes} bytes exceeds the {MAX_ARENA_BYTES} byte limit")
        self.slots = slots
        self.page_bytes = page_bytes
        self.nbytes = slots * page_bytes
        self._map = mmap.mmap(-1, self.nbytes)
        self._buffer = np.frombuffer(self._map, dtype=np.uint8)
        self.base_address: int = self._buffer.ctypes.data
        self._lock = threading.Lock()
        self._free: list[int] = list(range(slots))  # a heap: lowest slot first keeps runs contiguous
        self._ready: dict[PageHash, PageSlot] = {}
        self._reserved: dict[PageHash, int] = {}
        self._pins: dict[PageHash, int] = {}

    # --- queries ----------------------------------------------------------------------------------
    def __contains__(self, page: object) -> bool:
        return page in self._ready

    def __len__(self) -> int:
        return len(self._ready)

    def pages(self) -> tuple[PageHash, ...]:
        """Ready pages, in no particular order."""
        with self._lock:
            return tuple(self._ready)

    def locate(self, page: PageHash) -> PageSlot:
        """Slot and checksum of a ready page (PageNotResident otherwise)."""
        found = self._ready.get(page)
        if found is None:
            raise PageNotResident([page])
        return found

    def locate_many(self, pages: Iterable[PageHash]) -> tuple[list[PageSlot], list[PageHash]]:
        """(locations of the ready pages, pages that are not ready), both in the given order."""
        found: list[PageSlot] = []
        missing: list[PageHash] = []
        with self._lock:
            for page in pages:
                slot = self._ready.get(page)
                if slot is None:
                    missing.append(page)
                else:
                    found.append(slot)
        return found, missing

    def offset_of(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} outside the arena's 0..{self.slots - 1}")
        return slot * self.page_bytes

    def address_of(self, slot: int) -> int:
        """Virtual address of a slot in this process (what a one-sided transport reads or writes)."""
        return self.base_address + self.offset_of(slot)

    def slot_view(self, slot: int) -> np.ndarray:
        """The bytes of one slot (a writable view: only a slot's reserver writes into it)."""
        start = self.offset_of(slot)
        return self._buffer[start : start + self.page_bytes]

    def read(self, page: PageHash) -> bytes:
        """A copy of a ready page's bytes."""
        return self.slot_view(self.locate(page).slot).tobytes()

    def verify(self, page: PageHash) -> bool:
        """Whether a ready page's bytes still match its checksum."""
        where = self.locate(page)
        return page_checksum(self.slot_view(where.slot)) == where.checksum

    def gauges(self) -> ArenaGauges:
        with self._lock:
            return ArenaGauges(self.slots, len(self._free), len(self._reserved), len(self._ready), len(self._pins))

    def check_invariants(self) -> None:
        """Raise AssertionError unless the slot counts add up and no slot is owned twice."""
        with self._lock:
            owned = [s.slot for s in self._ready.values()] + list(self._reserved.values()) + list(self._free)
            assert len(owned) == self.slots, f"slots add up to {len(owned)}, not {self.slots}"
            assert len(set(owned)) == self.slots, "a slot is owned twice"
            assert not set(self._ready) & set(self._reserved), "a page is both ready and reserved"
            assert set(self._pins) <= set(self._ready), "a pinned page is not ready"

    # --- writes -----------------------------------------------------------------------------------
    def reserve(self, pages: Sequence[PageHash]) -> list[int]:
        """Reserve one slot per page for an incoming write, lowest free slots first (all or none)."""
        with self._lock:
            if len(set(pages)) != len(pages):
                raise ValueError("pages to reserve repeat")
            for page in pages:
                if page in self._ready or page in self._reserved:
                    raise PageAlreadyPresent(page)
            if len(pages) > len(self._free):
                raise ArenaFull(len(pages), len(self._free), self.slots)
            slots = [heapq.heappop(self._free) for _ in pages]
            self._reserved.update(zip(pages, slots, strict=True))
            return slots

    def reserved_slot(self, page: PageHash) -> int:
        slot = self._reserved.get(page)
        if slot is None:
            raise WrongSlotState(f"page {page:#018x} is not reserved")
        return slot

    def commit(self, page: PageHash, expected: int | None = None, *, source: str = "a transfer") -> PageSlot:
        """Make a reserved page ready. With `expected`, its bytes must have that checksum: on a mismatch
        the reservation is freed and ChecksumMismatch raised."""
        slot = self.reserved_slot(page)
        actual = page_checksum(self.slot_view(slot))
        if expected is not None and actual != expected:
            self.abort(page)
            raise ChecksumMismatch(page, expected, actual, source)
        with self._lock:
            if self._reserved.pop(page, None) != slot:
                raise WrongSlotState(f"page {page:#018x} was committed or aborted concurrently")
            where = PageSlot(page, slot, actual)
            self._ready[page] = where
            return where

    def abort(self, page: PageHash) -> None:
        """Free a reserved page's slot (a transfer into it failed)."""
        with self._lock:
            slot = self._reserved.pop(page, None)
            if slot is None:
                raise WrongSlotState(f"page {page:#018x} is not reserved")
            heapq.heappush(self._free, slot)

    def store(self, page: PageHash, data: BytesLike) -> PageSlot:
        """Write a whole page and make it ready."""
        array = np.frombuffer(data, dtype=np.uint8)
        if array.size != self.page_bytes:
            raise ValueError(f"page {page:#018x} has {array.size} bytes; this arena's pages have {self.page_bytes}")
        (slot,) = self.reserve([page])
        self.slot_view(slot)[:] = array
        return self.commit(page)

    def store_emulated(self, page: PageHash) -> PageSlot:
        """Write a page's emulated content (deterministic from its hash) and make it ready."""
        return self.store(page, emulated_page(page, self.page_bytes))

    def release(self, page: PageHash) -> None:
        """Free a ready page's slot (eviction). Refused while a reader has it pinned."""
        with self._lock:
            where = self._ready.get(page)
            if where is None:
                raise PageNotResident([page])
            pins = self._pins.get(page, 0)
            if pins:
                raise PagePinned(page, pins)
            del self._ready[page]
            heapq.heappush(self._free, where.slot)

    @contextmanager
    def pinned(self, pages: Sequence[PageHash]) -> Iterator[list[PageSlot]]:
        """Pin ready pages for reading (all or none: PageNotResident names the missing ones)."""
        with self._lock:
            missing = [p for p in pages if p not in self._ready]
            if missing:
                raise PageNotResident(missing)
            found = [self._ready[p] for p in pages]
            for page in pages:
                self._pins[page] = self._pins.get(page, 0) + 1
        try:
            yield found
        finally:
            with self._lock:
                for page in pages:
                    left = self._pins[page] - 1
                    if left:
                        self._pins[page] = left
                    else:
                        del self._pins[page]
