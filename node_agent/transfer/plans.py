"""Pure plans for moving pages: stream chunks for the gRPC transport, slot runs for one-sided reads.

- `plan_chunks`: cut a sequence of equal-sized pages into stream messages of at most `chunk_bytes` of
  data; a message holds consecutive pieces in page order. Invariant: the pieces of each page cover it
  exactly once, in order, and every message but the last is full (`chunk_bytes` of data).
- `coalesce_runs`: merge (local slot, remote slot) pairs into runs that are consecutive on both sides,
  so one transfer moves a whole run, cut at `max_count` slots (several mid-sized transfers run in
  parallel, one huge one does not). Invariant: expanding the runs gives back the pairs, in order, and
  no run exceeds `max_count`.

Boundary: arithmetic only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes [offset, offset + length) of the page at `index` in the requested order."""

    index: int
    offset: int
    length: int


def plan_chunks(pages: int, page_bytes: int, chunk_bytes: int) -> Iterator[list[Piece]]:
    """Messages (lists of pieces) that stream `pages` pages of `page_bytes` in `chunk_bytes` messages."""
    if page_bytes < 1 or chunk_bytes < 1:
        raise ValueError(f"page_bytes and chunk_bytes must be >= 1, got {page_bytes} and {chunk_bytes}")
    message: list[Piece] = []
    room = chunk_bytes
    for index in range(pages):
        offset = 0
        while offset < page_bytes:
            length = min(page_bytes - offset, room)
            message.append(Piece(index, offset, length))
            offset += length
            room -= length
            if room == 0:
                yield message
                message, room = [], chunk_bytes
    if message:
        yield message


@dataclass(frozen=True, slots=True)
class SlotRun:
    """`count` consecutive slots starting at `local` here and at `remote` on the peer."""

    local: int
    remote: int
    count: int


def coalesce_runs(pairs: Sequence[tuple[int, int]], max_count: int | None = None) -> list[SlotRun]:
    """Runs of (local slot, remote slot) pairs that advance by one on both sides, in the given order,
    each of at most `max_count` slots (None: unbounded)."""
    if max_count is not None and max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count}")
    runs: list[SlotRun] = []
    for local, remote in pairs:
        if runs:
            last = runs[-1]
            full = max_count is not None and last.count >= max_count
            if not full and local == last.local + last.count and remote == last.remote + last.count:
                runs[-1] = SlotRun(last.local, last.remote, last.count + 1)
                continue
        runs.append(SlotRun(local, remote, 1))
    return runs
