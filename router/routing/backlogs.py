"""Per prefill node, the replayed backlog kept up to date as its queue changes, and its closed-form pricing.

`BacklogStore.get(node, model, parts)` returns the `Backlog` summary of replaying the node's jobs (the
chunked-prefill replay of `queue_replay.py`). It keeps one entry per node:
- the same state objects and model as last time (the common case: nothing changed since the previous
  decision): the stored summary, O(1);
- the same model, the same leading parts and a last part that extends the stored one (requests were sent to
  the node since): the stored summary extended by the new jobs (`extend_backlog`, bit-identical to a replay);
- anything else (a new report, a finished or handed-back request, a new model): one full replay.
So a routing decision costs O(1) per node, and a replay is paid once per change of a node's reported state.

`append_columns` prices one new job per node with array arithmetic: eq. 1 summed in closed form over the
job's chunks (the arithmetic series of its contexts), for nodes whose model is linear in eq. 1's features
(`linear_coefficients()`). It equals `append_job` up to floating-point rounding; `APPEND_BOUND` bounds the
difference (tested), so a caller can pick exactly by re-pricing only the nodes within the bound of the best.

Boundary: pure; no views, no policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evolving_infra.core.itermodel import PrefillCoefficients
from evolving_infra.core.types import NodeId
from evolving_infra.router.routing.nodemodel import PrefillNodeModel
from evolving_infra.router.routing.queue_replay import Backlog, ReplayJob, extend_backlog, replay_chunked_prefill

APPEND_BOUND = 1e-9
"""|closed form - append_job| <= APPEND_BOUND * (1 + finish) seconds. Both sum eq. 1 over at most a few
thousand iterations in float64 (relative rounding about 1e-16 per operation), so the true difference is
below 1e-12 relative; the bound leaves a wide margin and is checked by tests."""

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


@dataclass(slots=True)
class _Entry:
    model: PrefillNodeModel
    parts: tuple[Sequence[object], ...]
    backlog: Backlog
    row: tuple[float, ...] | None
    """(c0, c1, c2, c3, last_start, end, room, last uncached, last query-key pairs, last restored) or None."""


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
        self.extensions = 0

    def entry(self, node: NodeId, kind: object, model: PrefillNodeModel, parts: tuple[Sequence[object], ...]) -> _Entry:
        """The entry of `node` for state source `kind` with these parts, replayed or extended as needed."""
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
                    backlog = hit.backlog
                    for item in after[len(before):]:
                        backlog = extend_backlog(model, backlog, self._job_of(item))
                    self.extensions += 1
                    entry = _Entry(model, parts, backlog, _row(model, backlog))
                    entries[node] = entry
                    return entry
        backlog = replay_chunked_prefill(model, self._jobs_of(kind, parts), self.chunk_tokens).backlog
        self.replays += 1
        entry = _Entry(model, parts, backlog, _row(model, backlog))
        entries[node] = entry
        return entry

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
