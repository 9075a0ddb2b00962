"""The host KV arena (slot states add up, bytes and checksums stay with their page, pinned pages stay)
and the pure transfer plans (stream chunks, slot runs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.transfer import (
    ArenaFull,
    ChecksumMismatch,
    KvArena,
    PageAlreadyPresent,
    PageNotResident,
    PagePinned,
    TransportKind,
    TransportSettings,
    WrongSlotState,
    demo_chain,
    emulated_checksum,
    emulated_page,
    page_checksum,
)
from evolving_infra.node_agent.transfer.plans import coalesce_runs, plan_chunks

SLOTS, PAGE_BYTES = 6, 64
HASHES = st.integers(0, 15).map(PageHash)


class ArenaMachine(RuleBasedStateMachine):
    """Random reserve / write / commit / abort / store / release / pin sequences against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.arena = KvArena(SLOTS, PAGE_BYTES)
        self.ready: dict[PageHash, bytes] = {}
        self.reserved: dict[PageHash, int] = {}
        self.pins: list = []

    @rule(page=HASHES)
    def store(self, page: PageHash) -> None:
        if page in self.ready or page in self.reserved:
            with pytest.raises(PageAlreadyPresent):
                self.arena.store_emulated(page)
        elif len(self.ready) + len(self.reserved) == SLOTS:
            with pytest.raises(ArenaFull):
                self.arena.store_emulated(page)
        else:
            self.arena.store_emulated(page)
            self.ready[page] = emulated_page(page, PAGE_BYTES).tobytes()

    @rule(page=HASHES, corrupt=st.booleans())
    def reserve_write_commit(self, page: PageHash, corrupt: bool) -> None:
        if page in self.ready or page in self.reserved or len(self.ready) + len(self.reserved) == SLOTS:
            return
        (slot,) = self.arena.reserve([page])
        data = emulated_page(page, PAGE_BYTES).copy()
        expected = page_checksum(data)
        if corrupt:
            data[0] ^= 0xFF
        self.arena.slot_view(slot)[:] = data
        if corrupt:
            with pytest.raises(ChecksumMismatch):
                self.arena.commit(page, expected)
        else:
            self.arena.commit(page, expected)
            self.ready[page] = data.tobytes()

    @rule(page=HASHES)
    def reserve_only(self, page: PageHash) -> None:
        if page in self.ready or page in self.reserved or len(self.ready) + len(self.reserved) == SLOTS:
            return
        (self.reserved[page],) = self.arena.reserve([page])

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        if not self.reserved:
            with pytest.raises(WrongSlotState):
                self.arena.abort(PageHash(99))
            return
        page = data.draw(st.sampled_from(sorted(self.reserved)))
        self.arena.abort(page)
        del self.reserved[page]

    @rule(page=HASHES)
    def release(self, page: PageHash) -> None:
        pinned = any(page in pages for pages, _ in self.pins)
        if page not in self.ready:
            with pytest.raises(PageNotResident):
                self.arena.release(page)
        elif pinned:
            with pytest.raises(PagePinned):
                self.arena.release(page)
        else:
            self.arena.release(page)
            del self.ready[page]

    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        pages = data.draw(st.lists(HASHES, max_size=3))
        context = self.arena.pinned(pages)
        if all(p in self.ready for p in pages):
            located = context.__enter__()
            assert [s.page for s in located] == pages
            self.pins.append((pages, context))
        else:
            with pytest.raises(PageNotResident):
                context.__enter__()

    @rule()
    def unpin(self) -> None:
        if self.pins:
            _, context = self.pins.pop()
            context.__exit__(None, None, None)

    @invariant()
    def slots_add_up_and_bytes_stay_with_their_page(self) -> None:
        self.arena.check_invariants()
        gauges = self.arena.gauges()
        assert gauges.free + gauges.reserved + gauges.ready == SLOTS
        assert (gauges.ready, gauges.reserved) == (len(self.ready), len(self.reserved))
        assert set(self.arena.pages()) == set(self.ready)
        for page, content in self.ready.items():
            assert self.arena.read(page) == content
            assert self.arena.verify(page)


TestArenaMachine = ArenaMachine.TestCase


def test_emulated_content_is_a_function_of_the_hash() -> None:
    a, b = demo_chain(2)
    assert np.array_equal(emulated_page(a, 4096), emulated_page(a, 4096))
    assert not np.array_equal(emulated_page(a, 4096), emulated_page(b, 4096))
    assert emulated_checksum(a, 4096) == page_checksum(emulated_page(a, 4096).tobytes())


def test_a_page_changed_in_place_no_longer_verifies() -> None:
    arena = KvArena(2, 128)
    where = arena.store_emulated(PageHash(7))
    assert arena.verify(PageHash(7))
    arena.slot_view(where.slot)[5] ^= 1
    assert not arena.verify(PageHash(7))


def test_a_failed_commit_frees_the_slot() -> None:
    arena = KvArena(1, 32)
    arena.reserve([PageHash(1)])
    with pytest.raises(ChecksumMismatch, match="does not match"):
        arena.commit(PageHash(1), expected=12345)
    assert arena.gauges().free == 1


def test_store_refuses_a_page_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="has 10 bytes; this arena's pages have 32"):
        KvArena(1, 32).store(PageHash(1), b"0123456789")


@pytest.mark.parametrize(
    ("slots", "page_bytes", "match"), [(0, 8, "slots"), (4, 0, "page_bytes"), (1 << 30, 1 << 20, "limit")]
)
def test_bad_arena_sizes_are_refused(slots: int, page_bytes: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KvArena(slots, page_bytes)


def test_slot_addresses_lie_inside_the_buffer() -> None:
    arena = KvArena(4, 4096)
    assert arena.address_of(3) == arena.base_address + 3 * 4096
    assert arena.base_address % 4096 == 0, "the memory map is page-aligned"
    with pytest.raises(ValueError, match="outside the arena"):
        arena.address_of(4)


@given(st.integers(0, 40), st.integers(1, 300), st.integers(1, 700))
def test_chunks_cover_every_page_once_in_order(pages: int, page_bytes: int, chunk: int) -> None:
    messages = list(plan_chunks(pages, page_bytes, chunk))
    sizes = [sum(p.length for p in m) for m in messages]
    assert all(size == chunk for size in sizes[:-1]) and all(0 < s <= chunk for s in sizes)
    pieces = [p for m in messages for p in m]
    covered: dict[int, int] = {}
    for piece in pieces:
        assert piece.offset == covered.get(piece.index, 0), "pieces of a page arrive in order, no gap"
        covered[piece.index] = piece.offset + piece.length
    assert covered == dict.fromkeys(range(pages), page_bytes)
    assert [p.index for p in pieces] == sorted(p.index for p in pieces)


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=30), st.none() | st.integers(1, 5))
def test_runs_expand_back_to_the_pairs(pairs: list[tuple[int, int]], max_count: int | None) -> None:
    runs = coalesce_runs(pairs, max_count)
    expanded = [(r.local + i, r.remote + i) for r in runs for i in range(r.count)]
    assert expanded == pairs
    assert all(r.count >= 1 and (max_count is None or r.count <= max_count) for r in runs)


def test_consecutive_slots_coalesce_into_one_run() -> None:
    assert len(coalesce_runs([(i, 10 + i) for i in range(8)])) == 1
    assert len(coalesce_runs([(i, 10 + i) for i in range(8)], max_count=3)) == 3


def test_transport_settings_bound_their_fields() -> None:
    assert TransportSettings().kind is TransportKind.MOONCAKE_TCP
    assert TransportSettings.model_validate({"kind": "grpc"}).kind is TransportKind.GRPC
    with pytest.raises(ValueError, match="chunk_bytes"):
        TransportSettings(chunk_bytes=1)
    with pytest.raises(ValueError, match="extra"):
        TransportSettings.model_validate({"kind": "grpc", "chunk": 5})
