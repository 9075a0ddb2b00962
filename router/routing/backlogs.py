"""Per prefill node, the backlog kept up to date as its queue changes, and its closed-form pricing.

`BacklogStore.entry(node, kind, model, parts)` answers the node's backlog: its `Backlog` summary (the
chunked-prefill replay of `queue_replay.py`) and, for nodes whose model is linear in eq. 1's features
(`linear_coefficients()`), its row (the summary's fields as numbers, for `append_columns`). One entry per node:
- the same state objects and model as last time (the common case: nothing changed since the previous
  decision): the stored entry, O(1);
- the same model, the same leading parts and a last part that extends the stored one (requests were sent to
  the node since): the stored summary extended by the new jobs (`extend_backlog`, bit-identical to a replay),
  or, where the summary was not needed yet, the row extended in closed form (`row_after`);
- anything else (a new report, a finished or handed-back request, a new model): for a linear model, the row in
  closed form from the jobs (`row_after`: O(1) arithmetic per job instead of a replay of every chunked
  iteration) and the replay deferred until the summary itself is read (`_Entry.backlog`: a router reads it
  only for the few nodes it prices exactly); for any other model, one full replay.
So a routing decision costs O(1) per unchanged node and O(its jobs) arithmetic per changed one; a replay of a
node's whole queue is paid only when that node is priced exactly.

`append_columns` prices one new job per node with array arithmetic: eq. 1 summed in closed form over the
job's chunks (the arithmetic series of its contexts). It and the closed-form rows equal the replay
(`append_job` on the replayed summary) up to floating-point rounding; `APPEND_BOUND` bounds the difference
(tested), so a caller can pick exactly by re-pricing only the nodes within the bound of the best.

Boundary: pure; no views, no policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from evolving_infra.core.itermodel import PrefillCoefficients
from evolving_infra.core.types import NodeId
from evolving_infra.router.routing.nodemodel import PrefillNodeModel
from evolving_infra.router.routing.queue_replay import Backlog, ReplayJob, extend_backlog, replay_chunked_prefill

APPEND_BOUND = 1e-9
"""|closed form - append_job| <= APPEND_BOUND * (1 + finish) seconds, the closed form being `append_columns` on
a row from the replayed summary (`_row`) or from `row_after`. Each sums eq. 1 in float64 (relative rounding about
1e-16 per operation) over at most one term per iteration (the replay) or per job (`row_after`), so for queues
below a million iterations the true difference is below 1e-10 relative; the bound leaves a margin and is
checked by tests."""

JobsOf = Callable[[object, tuple[Sequence[object], ...]], list[ReplayJob]]
"""(kind, parts) -> the replay jobs of the whole backlog, in order."""
JobOf = Callable[[Any], ReplayJob]
"""An item of the last part (a policy's queue entry, opaque here) -> its one replay job."""


def linear_coefficients(model: PrefillNodeModel) -> PrefillCoefficients | None:
    """Eq. 1's coefficients if the model's iteration time is eq. 1 with them (`linear_coefficients()`), else None."""
    get = getattr(model, "linear_coefficients", None)
    return get() if get is not None else None


ROW_WIDTH = 10
"""Fields of `_Entry.row`."""


class _Entry:
    """A node's backlog under one state: its model, the parts it was computed from, its closed-form row (None for
    a model that is not linear) and its replayed summary (`backlog`), replayed when first read if the row was
    computed without it."""

    __slots__ = ("model", "parts", "row", "_backlog", "_replay")

    def __init__(self, model: PrefillNodeModel, parts: tuple[Sequence[object], ...], backlog: Backlog | None,
                 row: tuple[float, ...] | None, replay: Callable[[], Backlog] | None = None) -> None:  # fmt: skip
        if backlog is None and replay is None:
            raise ValueError("an entry needs its backlog or a way to replay it")
        self.model = model
        self.parts = parts
        self.row = row
        """(c0, c1, c2, c3, last_start, end, room, last uncached, last query-key pairs, last restored) or None."""
        self._backlog = backlog
        self._replay = replay

    @property
    def backlog(self) -> Backlog:
        """The replayed summary (replayed now if it was deferred; bit-identical to a fresh replay of the parts)."""
        backlog = self._backlog
        if backlog is None:
            assert self._replay is not None  # (one of the two is always set)
            backlog = self._backlog = self._replay()
            self._replay = None
        return backlog

    @property
    def replayed(self) -> bool:
        """Whether the summary is at hand (replayed, or extended from a replayed one)."""
        return self._backlog is not None


def _row(model: PrefillNodeModel, backlog: Backlog) -> tuple[float, ...] | None:
    coef = linear_coefficients(model)
    if coef is None:
        return None
    uc = pairs = rst = 0
    for item in backlog.last_items:
        uc += item.t_uc
        pairs += item.query_key_pairs
        rst += item.t_rst
    return (coef.c0, coef.c1, coef.c2, coef.c3, backlog.last_start, backlog.end, backlog.room, uc, pairs, rst)


def row_after(
    coef: PrefillCoefficients, row: tuple[float, ...] | None, jobs: Iterable[ReplayJob], chunk: int
) -> tuple[float, ...]:
    """The row (as `_row`) of the backlog that `row` summarizes (None: an empty one) with `jobs` appended, in
    closed form: the same schedule as `extend_backlog` (a job first fills the room of the last iteration, which
    is re-priced, then runs in chunks of `chunk` tokens; its restored tokens go to its first iteration), with the
    chunks before a job's last one summed as arithmetic series. O(1) per job, whatever its chunks; equal to the
    row of the replayed summary up to rounding (`APPEND_BOUND`), its integer fields exactly."""
    c0, c1, c2, c3 = coef.c0, coef.c1, coef.c2, coef.c3
    if row is None:
        last_start = end = 0.0
        room = uc = pairs = rst = 0
    else:
        last_start, end = row[4], row[5]
        room, uc, pairs, rst = int(row[6]), int(row[7]), int(row[8]), int(row[9])
    for job in jobs:
        left, context, restore = job.remaining_tokens, job.context_tokens, job.restore_tokens
        if room > 0:  # joins the last iteration, which is re-priced with the job's first chunk
            take = left if left < room else room
            uc += take
            pairs += take * context + take * (take + 1) // 2
            rst += restore
            left, context, restore = left - take, context + take, 0
            duration = c0 + c1 * uc + c2 * pairs + c3 * rst
            if not left:
                end = last_start + duration
                room = chunk - uc
                continue
            clock = last_start + duration
        else:
            clock = end
        full = (left - 1) // chunk  # whole chunks before the job's last one
        if full:
            before = full * chunk
            last_start = clock + (c0 * full + c1 * before + c2 * (before * context + before * (before + 1) // 2)
                                  + c3 * restore)  # fmt: skip
            left, context, restore = left - before, context + before, 0
        else:
            last_start = clock
        uc, pairs, rst = left, left * context + left * (left + 1) // 2, restore
        end = last_start + (c0 + c1 * uc + c2 * pairs + c3 * rst)
        room = chunk - uc
    return (c0, c1, c2, c3, last_start, end, room, uc, pairs, rst)


class BacklogStore:
    """The latest backlog summary per node (see the module docstring).

    `parts` are the node's job sources in replay order (e.g. running, queue, unreported); `jobs_of(kind, parts)`
    turns them into replay jobs, and the last part's items map one to one onto the last jobs (`job_of`), so
    new items at its end are new jobs at the end of the queue. A model object must not change its predictions.
    Kinds are told apart by identity (enum members, e.g. `StateSource`).
    """

    def __init__(self, chunk_tokens: int, jobs_of: JobsOf, job_of: JobOf) -> None:
        self.chunk_tokens = chunk_tokens
        self._jobs_of = jobs_of
        self._job_of = job_of
        # One table per state source, found by identity: hashing an enum member runs Python code, and this is
        # read for every node at every decision.
        self._tables: list[tuple[object, dict[NodeId, _Entry]]] = []
        self.replays = 0
        """Full replays of a node's queue (deferred ones counted when they run)."""
        self.extensions = 0

    def entry(self, node: NodeId, kind: object, model: PrefillNodeModel, parts: tuple[Sequence[object], ...]) -> _Entry:
        """The entry of `node` for state source `kind` with these parts, extended, computed or replayed as needed
        (module docstring)."""
        entries = self._table(kind)
        hit = entries.get(node)
        if hit is not None and hit.model is model:
            old = hit.parts
            if old == parts:  # item by item: identical objects compare equal at once
                hit.parts = parts
                return hit
            if len(old) == len(parts) and old[:-1] == parts[:-1]:
                before, after = old[-1], parts[-1]
                if len(after) >= len(before) and tuple(after[: len(before)]) == tuple(before):
                    jobs = [self._job_of(item) for item in after[len(before):]]
                    self.extensions += 1
                    if hit.replayed:  # (always, for a model without a row: its entries are replayed at once)
                        backlog = hit.backlog
                        for job in jobs:
                            backlog = extend_backlog(model, backlog, job)
                        entry = _Entry(model, parts, backlog, _row(model, backlog))
                    else:
                        coef = linear_coefficients(model)
                        assert coef is not None  # (a row is kept only for a linear model)
                        row = row_after(coef, hit.row, jobs, self.chunk_tokens)
                        entry = _Entry(model, parts, None, row, self._deferred(kind, model, parts))
                    entries[node] = entry
                    return entry
        coef = linear_coefficients(model)
        if coef is None:
            entry = _Entry(model, parts, self._replayed(kind, model, parts), None)
        else:
            row = row_after(coef, None, self._jobs_of(kind, parts), self.chunk_tokens)
            entry = _Entry(model, parts, None, row, self._deferred(kind, model, parts))
        entries[node] = entry
        return entry

    def _replayed(self, kind: object, model: PrefillNodeModel, parts: tuple[Sequence[object], ...]) -> Backlog:
        self.replays += 1
        return replay_chunked_prefill(model, self._jobs_of(kind, parts), self.chunk_tokens).backlog

    def _deferred(self, kind: object, model: PrefillNodeModel, parts: tuple[Sequence[object], ...]) -> Callable[[], Backlog]:
        return lambda: self._replayed(kind, model, parts)

    def table(self, kind: object) -> dict[NodeId, _Entry]:
        """The entries of state source `kind` by node (read-only for callers: an entry whose model is the node's
        and whose parts equal the node's parts now is what `entry` would answer)."""
        return self._table(kind)

    def _table(self, kind: object) -> dict[NodeId, _Entry]:
        for known, table in self._tables:
            if known is kind:
                return table
        fresh: dict[NodeId, _Entry] = {}
        self._tables.append((kind, fresh))
        return fresh

    def forget(self, node: NodeId) -> None:
        for _, table in self._tables:
            table.pop(node, None)


def append_columns(
    rows: np.ndarray,
    uncached: np.ndarray,
    context: np.ndarray,
    restore: np.ndarray,
    chunk: int,
    ints: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(start, finish) of one new job per node appended to each node's backlog (rows as `_Entry.row`; `ints`, if
    given, their integer fields (room, last uncached, last query-key pairs, last restored) as int64).

    Same schedule as `append_job`: the job first fills the room left in the backlog's last iteration (that
    iteration is re-priced with the job's item added), then runs in chunks of `chunk` tokens; restored tokens
    go to its first iteration. Integer features are exact in int64 for contexts below about 10^8 tokens.
    """
    c0, c1, c2, c3 = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    last_start, end = rows[:, 4], rows[:, 5]
    if ints is None:
        ints = rows[:, 6:].astype(np.int64)
    room, last_uc, last_pairs, last_rst = ints[:, 0], ints[:, 1], ints[:, 2], ints[:, 3]
    joins = room > 0
    take = np.minimum(uncached, room)
    joined = c0 + c1 * (last_uc + take) + c2 * (last_pairs + take * context + take * (take + 1) // 2) + c3 * (
        last_rst + restore
    )
    start = np.where(joins, last_start, end)
    clock = np.where(joins, last_start + joined, end)
    rest = uncached - take
    ctx = context + take
    rst = np.where(joins, 0, restore)
    # token t of the rest (t = 1..rest) sees ctx + t keys in whichever chunk it falls: the chunks' query-key pairs
    # sum to the same integer however the rest is cut
    pairs = rest * ctx + rest * (rest + 1) // 2
    iterations = (rest + (chunk - 1)) // chunk
    own = c0 * iterations + c1 * rest + c2 * pairs + c3 * np.where(rest > 0, rst, 0)
    return start, clock + own
