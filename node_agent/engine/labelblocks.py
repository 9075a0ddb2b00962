"""Page -> id for pages named by dense labels (`LabelBlocks`): the map of a node's id table (`pageids.PageIds`)
where the pages' names are small consecutive integers, as the simulator names them (`traces.content.PageLabels.DENSE`).

Why: a prompt's pages are a few runs of consecutive labels (on the generated CC workload 2,290 pages in 2.6 runs on
average), yet a dict resolves them one probe per page. Here the labels are cut into blocks of `WIDTH` consecutive
values; a block in use owns one row of a table holding the ids of its labels (-1: none), and a two-level array
indexed by block number gives each block's row (0: none; `_BlockRows`). Resolving pages given as an array is then
a few numpy passes (no Python work per page); storing and forgetting ids are array scatters. Blocks past
`NEAR_BLOCKS` (labels in a namespace's high range, or content hashes) are found through a dict instead, one probe
per run of a block.

Any integers are valid keys (the result is the same as a dict's whatever the labels); only memory and time depend on
their density: a row costs 4 * `WIDTH` bytes however few of its labels have ids, and `_BlockRows` 4 bytes per group
of 2^14 labels up to the highest in use plus 1 KiB per group in use, so content hashes (random 64-bit values, one
per row, all past `NEAR_BLOCKS`) would cost ~60x a dict's memory. `PageIds` takes this map only when told its pages
are dense.

Boundary: the mapping alone; which ids exist and what they mean is `PageIds`'.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, MutableMapping
from itertools import repeat

import numpy as np
import numpy.typing as npt

from evolving_infra.core.pages import PageHash

Ids = npt.NDArray[np.int64]

BITS = 6
WIDTH = 1 << BITS
"""Labels per block: a row is 4 * WIDTH bytes (256), and a run of consecutive labels crosses a block every WIDTH."""
_MASK = WIDTH - 1
_NONE = -1
_EMPTY_ROW = 0
"""Row 0 stays all -1: labels of blocks without a row read it."""
_U_MASK, _U_BITS = np.uint64(_MASK), np.uint64(BITS)
SHORT = 24
"""Below this many pages a lookup resolves them one by one (cheaper than the array passes' fixed cost)."""
NEAR_BLOCKS = 1 << 30
"""Blocks below this (labels below 2^36) are found through `_BlockRows`; the others through the dict."""
_GROUP_BITS = 8
_GROUP = 1 << _GROUP_BITS
_U_GROUP_BITS, _U_GROUP_MASK = np.uint64(_GROUP_BITS), np.uint64(_GROUP - 1)


class _BlockRows:
    """block -> row for blocks below `NEAR_BLOCKS`, 0 for none: groups of `_GROUP` consecutive blocks, a group in use
    owning one line of `lines` (its blocks' rows), `top` giving each group's line (0: none; line 0 stays all 0).
    Memory: 4 bytes per group up to the highest in use (`top`, one per 2^14 labels) plus 4 * `_GROUP` bytes per
    group in use, whatever the range of labels (a one-level array would cost 4 bytes per block of the range on
    every node: ~3 MB per node at a partition's 47 M labels)."""

    __slots__ = ("top", "lines", "used", "group", "free")

    def __init__(self) -> None:
        self.top = np.zeros(2, dtype=np.int32)  # (the last entry stays 0: groups past it read line 0)
        self.lines = np.zeros((2, _GROUP), dtype=np.int32)
        self.used = np.zeros(2, dtype=np.int64)  # blocks in use per line
        self.group = np.zeros(2, dtype=np.int64)  # the group of each line in use
        self.free: list[int] = [1]

    def rows(self, blocks: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
        """The row of each of `blocks` (below `NEAR_BLOCKS`; 0 for blocks without one)."""
        top = self.top
        groups = np.minimum(blocks >> _U_GROUP_BITS, len(top) - 1).astype(np.intp)
        lines = top.take(groups)
        lines <<= _GROUP_BITS
        lines |= (blocks & _U_GROUP_MASK).astype(np.int32)
        return self.lines.take(lines).astype(np.intp)  # type: ignore[no-any-return]  # (flat index into lines)

    def set(self, block: int, row: int) -> None:
        group = block >> _GROUP_BITS
        top = self.top
        if group >= len(top) - 1:
            grown = np.zeros(max(2 * len(top), group + 2), dtype=np.int32)
            grown[: len(top)] = top
            self.top = top = grown
        line = int(top[group])
        if not line:
            if not self.free:
                size = len(self.used)
                self.lines = np.concatenate((self.lines, np.zeros((size, _GROUP), dtype=np.int32)))
                self.used = np.concatenate((self.used, np.zeros(size, dtype=np.int64)))
                self.group = np.concatenate((self.group, np.zeros(size, dtype=np.int64)))
                self.free = list(range(2 * size - 1, size - 1, -1))
            line = self.free.pop()
            top[group] = line
            self.group[line] = group
        self.lines[line, block & (_GROUP - 1)] = row
        self.used[line] += 1

    def clear(self, block: int) -> None:
        group = block >> _GROUP_BITS
        line = int(self.top[group])
        self.lines[line, block & (_GROUP - 1)] = 0
        self.used[line] -= 1
        if not self.used[line]:
            self.top[group] = 0
            self.free.append(line)

    @property
    def nbytes(self) -> int:
        return int(self.top.nbytes + self.lines.nbytes + self.used.nbytes + self.group.nbytes)


def _row_counts(rows: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The distinct values of `rows` and how often each occurs (pages come in runs, so rows in stretches: counted
    by stretch, and sorted only when a row recurs after another)."""
    if len(rows) == 1:
        return rows, np.ones(1, dtype=np.intp)
    cut = np.flatnonzero(rows[1:] != rows[:-1]) + 1
    if not len(cut):
        return rows[:1], np.full(1, len(rows), dtype=np.intp)
    starts = np.concatenate(([0], cut))
    values = rows[starts]
    counts = np.diff(np.append(starts, len(rows)))
    if len(values) > 1 and not (values[1:] > values[:-1]).all():  # a row in two stretches: add them up
        values, inverse = np.unique(values, return_inverse=True)
        counts = np.bincount(inverse, weights=counts, minlength=len(values)).astype(np.intp)
    return values, counts


class LabelBlocks(MutableMapping[PageHash, int]):
    """page -> id (ids >= 0, below 2^31), stored by blocks of `WIDTH` consecutive page values."""

    __slots__ = ("_row", "_near", "_far", "_flat", "_live", "_block", "_free", "_len")

    def __init__(self, rows: int = 64) -> None:
        rows = max(rows, 2)
        self._row: dict[int, int] = {}  # block number (page >> BITS) -> its row, for every block in use
        self._near = _BlockRows()  # block -> row for blocks below NEAR_BLOCKS
        self._far = 0  # blocks in use at or past NEAR_BLOCKS (found through `_row` only)
        self._flat = np.full(rows * WIDTH, _NONE, dtype=np.int32)  # row r's ids at [r * WIDTH, (r + 1) * WIDTH)
        self._live = np.zeros(rows, dtype=np.int64)  # ids per row
        self._block = np.zeros(rows, dtype=np.uint64)  # the block of each row in use
        self._free: list[int] = list(range(rows - 1, _EMPTY_ROW, -1))  # unused rows (lowest taken first)
        self._len = 0

    # --- the mapping ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __getitem__(self, page: PageHash) -> int:
        got = self.get(page)
        if got is None:
            raise KeyError(page)
        return got

    def get(self, page: PageHash, default: int | None = None) -> int | None:  # type: ignore[override]
        row = self._row.get(page >> BITS)
        if row is None:
            return default
        i: int = self._flat.item((row << BITS) | (page & _MASK))
        return default if i < 0 else i

    def __contains__(self, page: object) -> bool:
        return isinstance(page, int) and self.get(PageHash(page)) is not None

    def __setitem__(self, page: PageHash, i: int) -> None:
        if not 0 <= i < 2**31:
            raise ValueError(f"a page id must be in [0, 2^31), got {i}")
        at = (self._row_for(page >> BITS) << BITS) | (page & _MASK)
        flat = self._flat
        if flat.item(at) < 0:
            self._live[at >> BITS] += 1
            self._len += 1
        flat[at] = i

    def __delitem__(self, page: PageHash) -> None:
        block = page >> BITS
        row = self._row.get(block)
        at = -1 if row is None else (row << BITS) | (page & _MASK)
        if row is None or self._flat[at] < 0:
            raise KeyError(page)
        self._flat[at] = _NONE
        self._len -= 1
        self._live[row] -= 1
        if not self._live[row]:
            self._release(block, row)

    def __iter__(self) -> Iterator[PageHash]:
        """The pages with ids, block by block (in the order the blocks got their rows), ascending within a block."""
        for block, row in list(self._row.items()):
            base = block << BITS
            for col in np.flatnonzero(self._flat[row << BITS : (row + 1) << BITS] >= 0).tolist():
                yield PageHash(base + col)

    # --- many pages at once ----------------------------------------------------------------------------
    def lookup(self, pages: Collection[PageHash] | npt.NDArray[np.uint64]) -> Ids:
        """The ids of `pages` (a collection, or an array of uint64), -1 for pages without one."""
        if len(pages) < SHORT and not isinstance(pages, np.ndarray):
            get = self._row.get
            at = [(get(p >> BITS, _EMPTY_ROW) << BITS) | (p & _MASK) for p in pages]
            return self._flat.take(at).astype(np.int64)
        return self._flat.take(self._slots(self._array(pages), create=False)).astype(np.int64)

    def ids(self, pages: Collection[PageHash] | npt.NDArray[np.uint64]) -> Ids:
        """The ids of `pages` (KeyError for the first without one)."""
        ids = self.lookup(pages)
        if len(ids) and ids.min() < 0:
            raise KeyError(int(self._array(pages)[int(np.flatnonzero(ids < 0)[0])]))
        return ids

    def assign(self, pages: Collection[PageHash], ids: Ids, labels: npt.NDArray[np.uint64] | None = None) -> None:
        """`self[pages[j]] = ids[j]` for pages that have no id yet (each page once; ids in [0, 2^31)); `labels`:
        the same pages as an array of uint64, where the caller has one (else made from `pages`)."""
        arr = self._array(pages) if labels is None else labels
        if not len(arr):
            return
        at = self._slots(arr, create=True)
        flat = self._flat
        if flat.take(at).max() >= 0:  # (a refused call changes nothing: rows it took for it are given back)
            had = flat[at] >= 0
            rows = np.unique(at >> BITS)
            for row in rows[self._live[rows] == 0].tolist():
                self._release(int(self._block[row]), row)
            raise ValueError(f"pages already have ids: {[hex(p) for p in arr[had][:5].tolist()]}")
        flat[at] = ids
        rows, counts = _row_counts(at >> BITS)
        self._live[rows] += counts  # (each row once)
        self._len += len(arr)

    def remove(self, pages: Collection[PageHash] | npt.NDArray[np.uint64]) -> None:
        """Forget the ids of `pages` (each has one, each page once)."""
        arr = self._array(pages)
        if not len(arr):
            return
        at = self._slots(arr, create=False)
        lost = self._flat[at] < 0
        if lost.any():
            raise KeyError(int(arr[lost][0]))
        self._flat[at] = _NONE
        touched, counts = _row_counts(at >> BITS)
        live = self._live
        live[touched] -= counts  # (each row once)
        self._len -= len(arr)
        for row in touched[live[touched] == 0].tolist():  # (all -1 again: back to the free rows)
            self._release(int(self._block[row]), row)

    def all_absent(self, pages: Collection[PageHash] | npt.NDArray[np.uint64]) -> bool:
        """Whether no page of `pages` has an id."""
        return not len(pages) or bool((self.lookup(pages) < 0).all())

    def all_present(self, pages: Collection[PageHash] | npt.NDArray[np.uint64]) -> bool:
        """Whether every page of `pages` has an id."""
        return not len(pages) or bool((self.lookup(pages) >= 0).all())

    # --- slots -----------------------------------------------------------------------------------------
    @staticmethod
    def _array(pages: Collection[PageHash] | npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        if isinstance(pages, np.ndarray):
            return pages if pages.dtype == np.uint64 else pages.astype(np.uint64)
        try:  # (int64 converts faster; labels past 2^63 take the unsigned path)
            return np.fromiter(pages, dtype=np.int64, count=len(pages)).view(np.uint64)
        except OverflowError:
            return np.fromiter(pages, dtype=np.uint64, count=len(pages))

    def _slots(self, arr: npt.NDArray[np.uint64], create: bool) -> npt.NDArray[np.intp]:
        """Per page of `arr`, its place in `_flat` (in row 0, which holds no id, for blocks without a row unless
        `create`)."""
        blocks = arr >> _U_BITS
        if self._far:
            rows = self._rows_by_dict(blocks, create)
        else:
            rows = self._near.rows(blocks)
            if create and not rows.all():  # rows for the blocks without one, then read again
                for block in np.unique(blocks[rows == 0]).tolist():
                    self._row_for(block)
                rows = self._rows_by_dict(blocks, create) if self._far else self._near.rows(blocks)
        rows <<= BITS
        rows |= (arr & _U_MASK).astype(np.intp)
        return rows

    def _rows_by_dict(self, blocks: npt.NDArray[np.uint64], create: bool) -> npt.NDArray[np.intp]:
        """Per block of `blocks`, its row through the dict: one probe per stretch of equal blocks."""
        n = len(blocks)
        if n == 0:
            return np.zeros(0, dtype=np.intp)
        cut = np.flatnonzero(blocks[1:] != blocks[:-1]) + 1  # where a new stretch of one block starts
        starts = np.concatenate(([0], cut))
        keys = blocks[starts].tolist()
        if create:
            found = [self._row_for(b) for b in keys]
        else:
            found = list(map(self._row.get, keys, repeat(_EMPTY_ROW)))
        if len(keys) == 1:
            return np.full(n, found[0], dtype=np.intp)
        ends = np.empty(len(starts), dtype=np.intp)
        ends[:-1] = cut
        ends[-1] = n
        return np.repeat(np.asarray(found, dtype=np.intp), ends - starts)

    # --- rows ------------------------------------------------------------------------------------------
    def _row_for(self, block: int) -> int:
        """The row of `block`, taken from the free rows (the table doubling when none is left) if it has none."""
        row = self._row.get(block)
        if row is not None:
            return row
        if not self._free:
            size = len(self._live)
            self._flat = np.concatenate((self._flat, np.full(size * WIDTH, _NONE, dtype=np.int32)))
            self._live = np.concatenate((self._live, np.zeros(size, dtype=np.int64)))
            self._block = np.concatenate((self._block, np.zeros(size, dtype=np.uint64)))
            self._free = list(range(2 * size - 1, size - 1, -1))
        row = self._free.pop()
        self._row[block] = row
        self._block[row] = block
        if block < NEAR_BLOCKS:
            self._near.set(block, row)
        else:
            self._far += 1
        return row

    def _release(self, block: int, row: int) -> None:
        del self._row[block]
        self._free.append(row)
        if block < NEAR_BLOCKS:
            self._near.clear(block)
        else:
            self._far -= 1

    @property
    def rows(self) -> int:
        """Rows in use (blocks with at least one id)."""
        return len(self._row)

    def memory_bytes(self) -> int:
        """The arrays' bytes (the block dict not included)."""
        return int(self._flat.nbytes + self._live.nbytes + self._block.nbytes + self._near.nbytes)
