"""What a run records, for `evolving_infra.sim.metrics` to score: one record per finished request, plus
phase switches, split changes and per-node busy time.

Token counts of a request: `cached_tokens` are prompt tokens whose KV was reused rather than computed
(from the node's own GPU or host memory, or fetched from another node); `fetched_tokens` are the part of
them fetched from another node; `uncached_tokens = prompt_tokens - cached_tokens` were prefilled.

Times of a request, in order: `since` (latency origin: the issue time, or earlier when the agent waited for
admission) <= `issued` (sent by the harness) <= `queued` (entered the prefill node's queue) <=
`prefill_start` <= `first_token` <= `finish`.

Boundary: plain validated values; no aggregation here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evolving_infra.core.types import Phase


class RecordError(ValueError):
    """A record is inconsistent: the message names the record, the field and what is allowed."""


def _finite(where: str, **values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RecordError(f"{where}: {name} must be a finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    agent: str
    workload: str
    branch: str
    issued: float
    prefill_node: str
    decode_node: str
    queued: float
    prefill_start: float
    first_token: float
    finish: float
    prompt_tokens: int
    cached_tokens: int
    fetched_tokens: int
    output_tokens: int
    since: float | None = None
    """Latency origin; None means `issued`."""
    pause_s: float = 0.0
    """Pause before the request (tool, sub-agent or user time: the trace's `delay_s`), for Little's law."""

    def __post_init__(self) -> None:
        where = f"request record {self.request_id!r}"
        origin = self.issued if self.since is None else self.since
        _finite(
            where,
            since=origin,
            issued=self.issued,
            queued=self.queued,
            prefill_start=self.prefill_start,
            first_token=self.first_token,
            finish=self.finish,
            pause_s=self.pause_s,
        )
        order = [
            ("since", origin),
            ("issued", self.issued),
            ("queued", self.queued),
            ("prefill_start", self.prefill_start),
            ("first_token", self.first_token),
            ("finish", self.finish),
        ]
        for (a, ta), (b, tb) in zip(order, order[1:]):
            if tb < ta:
                raise RecordError(f"{where}: {b}={tb} precedes {a}={ta}; times must not decrease in this order")
        if self.pause_s < 0:
            raise RecordError(f"{where}: pause_s must be >= 0, got {self.pause_s}")
        if self.prompt_tokens < 0:
            raise RecordError(f"{where}: prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise RecordError(
                f"{where}: cached_tokens={self.cached_tokens} must lie in [0, prompt_tokens={self.prompt_tokens}]"
            )
        if not 0 <= self.fetched_tokens <= self.cached_tokens:
            raise RecordError(
                f"{where}: fetched_tokens={self.fetched_tokens} must lie in [0, cached_tokens={self.cached_tokens}]"
                " (fetched KV is part of the cached prefix)"
            )
        if self.output_tokens < 1:
            raise RecordError(f"{where}: output_tokens must be >= 1, got {self.output_tokens}")

    @property
    def origin(self) -> float:
        return self.issued if self.since is None else self.since

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.origin

    @property
    def e2e_s(self) -> float:
        return self.finish - self.origin

    @property
    def queue_s(self) -> float:
        """Time waiting in the prefill node's queue."""
        return self.prefill_start - self.queued

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (finish - first_token) / (output_tokens - 1); None for a
        single-token output."""
        if self.output_tokens < 2:
            return None
        return (self.finish - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """Node `node` switched from `from_phase` to `to_phase`: decided at `decided`, serving its new phase at
    `completed` (including the drain of its running requests)."""

    node: str
    from_phase: Phase
    to_phase: Phase
    decided: float
    completed: float

    def __post_init__(self) -> None:
        where = f"switch record of node {self.node!r}"
        _finite(where, decided=self.decided, completed=self.completed)
        if self.completed < self.decided:
            raise RecordError(f"{where}: completed={self.completed} precedes decided={self.decided}")
        if self.from_phase is self.to_phase:
            raise RecordError(f"{where}: from_phase and to_phase are both {self.to_phase.value}")

    @property
    def duration_s(self) -> float:
        return self.completed - self.decided


@dataclass(frozen=True, slots=True)
class SplitRecord:
    """From `at` on, `prefill` nodes serve prefill and `decode` nodes serve decode."""

    at: float
    prefill: int
    decode: int
    collocated: int = 0
    """Nodes serving both phases (the collocated warmup)."""

    def __post_init__(self) -> None:
        _finite("split record", at=self.at)
        if self.prefill < 0 or self.decode < 0 or self.collocated < 0:
            raise RecordError(f"split record at t={self.at}: node counts must be >= 0, got {self.label}")

    @property
    def label(self) -> str:
        if self.collocated and not self.prefill and not self.decode:
            return f"{self.collocated}C"
        return f"{self.prefill}P{self.decode}D" + (f"+{self.collocated}C" if self.collocated else "")


@dataclass(frozen=True, slots=True)
class NodeSpan:
    """Node `node` served `phase` during [start, end) and its GPUs were busy `busy_s` of that time.

    When a span straddles the edge of the scored window, its busy time is counted pro rata; drivers emit
    spans at every phase change and at least once a minute, so the approximation stays small.
    """

    node: str
    phase: Phase
    start: float
    end: float
    busy_s: float

    def __post_init__(self) -> None:
        where = f"span of node {self.node!r}"
        _finite(where, start=self.start, end=self.end, busy_s=self.busy_s)
        if self.end < self.start:
            raise RecordError(f"{where}: end={self.end} precedes start={self.start}")
        if not 0 <= self.busy_s <= self.end - self.start + 1e-9:
            raise RecordError(
                f"{where}: busy_s={self.busy_s} must lie in [0, end - start = {self.end - self.start}]"
            )


@dataclass(frozen=True, slots=True)
class ScoreWindow:
    """The measured part of a run, [start, end): requests issued before `start` (warmup) or at/after `end`
    are not scored. `end=None` means the latest finish among the records."""

    start: float = 0.0
    end: float | None = None

    def __post_init__(self) -> None:
        _finite("score window", start=self.start)
        if self.end is not None:
            _finite("score window", end=self.end)
            if self.end <= self.start:
                raise RecordError(f"score window: end={self.end} must be after start={self.start}")
