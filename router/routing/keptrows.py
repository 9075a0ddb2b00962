"""The TTFT policy's per-node backlog rows kept between decisions, recomputed only for nodes whose state changed.

`KeptRows.refresh` answers, for every node of a candidate set, the `BacklogStore` entry of its current state
(and the entry's closed-form row, stacked as one float64 table): it compares the set's `StateStamps` with those
of the previous call, array against array, and asks `recompute(i, fresh)` only for the nodes whose holders,
versions, model or state source (fresh report or router record) differ. A decision whose nodes mostly did not
change (the common case: one request was sent since the last one) so costs a few array operations plus one
store lookup per changed node, instead of reading and comparing every node's queue.

Boundary: bookkeeping only; what a row means and how it is priced are `backlogs.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import is_not

import numpy as np

from evolving_infra.core.types import NodeId
from evolving_infra.router.routing.backlogs import ROW_WIDTH, _Entry
from evolving_infra.router.routing.inputs import StateStamps


class KeptRows:
    """Entries and rows of the last candidate set, with the stamps they were computed under."""

    __slots__ = ("_ids", "_holders", "_versions", "_models", "_fresh", "entries", "table", "ints", "linear",
                 "recomputed")  # fmt: skip

    def __init__(self) -> None:
        self._ids: tuple[NodeId, ...] | None = None
        self._holders: tuple[Sequence[object], ...] = ()
        self._versions = np.zeros((0, 0), np.int64)
        self._models: list[object] = []
        self._fresh = np.zeros(0, bool)
        self.entries: list[_Entry] = []
        self.table = np.zeros((0, ROW_WIDTH))
        """Row i: `entries[i].row`, or zeros where it is None (see `linear`)."""
        self.ints = np.zeros((0, ROW_WIDTH - 6), np.int64)
        """The integer fields of `table` (its last four columns) as int64."""
        self.linear = np.zeros(0, bool)
        """Whether `entries[i]` has a closed-form row."""
        self.recomputed = 0
        """Nodes recomputed over all calls (for tests and benchmarks)."""

    @property
    def ids(self) -> tuple[NodeId, ...] | None:
        """The node ids of the last refresh that completed (None before one)."""
        return self._ids

    def refresh(
        self,
        ids: tuple[NodeId, ...],
        stamps: StateStamps,
        fresh: np.ndarray,
        recompute: Callable[[int, bool], _Entry],
    ) -> None:
        """Bring `entries`, `table` and `linear` up to date for the nodes `ids` (see the module docstring)."""
        n = len(ids)
        if self._ids != ids or len(self._holders) != len(stamps.holders) or self._versions.shape != stamps.versions.shape:
            changed = np.ones(n, bool)
            self.entries = [None] * n  # type: ignore[list-item]  # all filled below
            self.table = np.zeros((n, ROW_WIDTH))
            self.ints = np.zeros((n, ROW_WIDTH - 6), np.int64)
            self.linear = np.zeros(n, bool)
        else:
            changed = (stamps.versions != self._versions).any(axis=1) | (fresh != self._fresh)
            for new, old in zip(stamps.holders, self._holders, strict=True):
                changed |= np.fromiter(map(is_not, new, old), bool, n)
            changed |= np.fromiter(map(is_not, stamps.models, self._models), bool, n)
        self._ids = None  # until every changed node is recomputed (a recompute may raise)
        entries, table, ints, linear = self.entries, self.table, self.ints, self.linear
        for i in np.flatnonzero(changed).tolist():
            entry = recompute(i, bool(fresh[i]))
            entries[i] = entry
            row = entry.row
            if row is None:
                linear[i] = False
                table[i] = 0.0
                ints[i] = 0
            else:
                linear[i] = True
                table[i] = row
                ints[i] = row[6:]
            self.recomputed += 1
        self._ids, self._holders, self._versions = ids, stamps.holders, stamps.versions
        self._models, self._fresh = stamps.models, fresh
