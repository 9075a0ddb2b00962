"""Planning-window slices: what the planner measures on each slice i (w̄_i, q̄_i of eq. 6).

Invariant: a slice carries counts and sums, never averages. Per slice it holds the number of requests that
arrived in it (routed for the first time) with the sums of their t_uc, t_c and A = t_uc t_c + t_uc (t_uc + 1) / 2 as the
router counted them; the corrections of those sums measured when prefills started in it (the cached tokens a prefill
node actually reused minus those the router counted at arrival: a prefix can be evicted while its request waits in
a prefill queue); the number of requests that finished in it with the sums of their measured t_out and decode iterations (t_out / accepted
tokens per step); and the time integral of the number of requests in decode together with the time it covers, and
over the same time the integral of the prefill backlog (requests sent to prefill nodes whose prefill has not ended).

No oracle: a request's output length is known only when it finished, so the decode half of w̄ comes from the
requests that finished in the slice (`record_decode`), never from a declared or traced output length. Merging two slices adds these fields, so a
merge equals the slice recorded over the union, and averages (w̄, q̄) are only ever formed at the end.

Refinement of "evaluate eq. 3 with w̄": eq. 3 is linear in t_uc, A and t_c, and eq. 4 (at a fixed batch) is
linear in t_out / t_acc. The mean service time over a slice's requests is therefore exactly eq. 3 evaluated
on the means of t_uc, A and t_c, and eq. 4 on the mean of t_out / t_acc. `MeanWork` carries those means; it
differs from evaluating the equations on the mean request (A of the mean tokens is not the mean A).

Boundary: pure accumulation with time passed in; no clock, no models.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from evolving_infra.core.types import Work


@dataclass(frozen=True, slots=True)
class MeanWork:
    """Per-request means of the terms eq. 3 and eq. 4 are linear in.

    t_uc, t_c: mean uncached and cached prefill tokens; query_key_pairs: mean A; decode_iterations: mean
    t_out / t_acc (decode iterations a request needs); t_out: mean output tokens (for reports only).
    """

    t_uc: float
    t_c: float
    query_key_pairs: float
    decode_iterations: float
    t_out: float = 0.0

    def __post_init__(self) -> None:
        for name in ("t_uc", "t_c", "query_key_pairs", "decode_iterations", "t_out"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"MeanWork.{name} must be a finite number >= 0, got {value}")

    @classmethod
    def of(cls, work: Work) -> MeanWork:
        """The terms of a single request."""
        return cls(
            t_uc=float(work.t_uc),
            t_c=float(work.t_c),
            query_key_pairs=float(work.query_key_pairs),
            decode_iterations=work.t_out / work.t_acc,
            t_out=float(work.t_out),
        )


@dataclass(frozen=True, slots=True)
class WindowConfig:
    """A planning window of `window_s` seconds divided into `slices` equal slices (paper: 600 s, 10)."""

    window_s: float = 600.0
    slices: int = 10

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s must be a finite number > 0, got {self.window_s}")
        if self.slices < 1:
            raise ValueError(f"slices must be >= 1, got {self.slices}")

    @property
    def slice_s(self) -> float:
        return self.window_s / self.slices


@dataclass(frozen=True, slots=True)
class SliceStats:
    """Counts and sums over the time span [start, end)."""

    start: float
    end: float
    requests: int = 0
    sum_t_uc: int = 0
    sum_t_c: int = 0
    sum_query_key_pairs: int = 0
    sum_t_out: int = 0
    sum_decode_iterations: float = 0.0
    decode_request_seconds: float = 0.0
    decode_observed_s: float = 0.0
    finished: int = 0
    """Requests that finished in the slice (the sums of t_out and decode iterations are theirs)."""
    backlog_request_seconds: float = 0.0
    """Time integral of the prefill backlog over the same observed time as the decode occupancy."""
    measured: int = 0
    """Prefills that started in the slice and corrected the arrivals' sums (the three corrections are theirs)."""
    correction_t_uc: int = 0
    correction_t_c: int = 0
    correction_query_key_pairs: int = 0
    """Measured minus counted t_uc, t_c and A of the prefills that started in the slice (either sign)."""

    def __post_init__(self) -> None:
        if not self.end >= self.start:
            raise ValueError(f"slice end {self.end} must be >= start {self.start}")
        if (self.requests < 0 or self.finished < 0 or self.decode_request_seconds < 0 or self.decode_observed_s < 0
                or self.backlog_request_seconds < 0 or self.measured < 0):  # fmt: skip
            raise ValueError(f"slice [{self.start}, {self.end}) has a negative count or integral: {self}")

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def mean_work(self) -> MeanWork | None:
        """w̄ of the slice as the means eq. 3 and eq. 4 need: prefill terms over the requests that arrived in it,
        with the corrections measured as prefills started in it (each sum at least 0), decode terms over those
        that finished in it; None without either."""
        if self.requests == 0 or self.finished == 0:
            return None
        n, f = self.requests, self.finished
        return MeanWork(
            t_uc=max(0, self.sum_t_uc + self.correction_t_uc) / n,
            t_c=max(0, self.sum_t_c + self.correction_t_c) / n,
            query_key_pairs=max(0, self.sum_query_key_pairs + self.correction_query_key_pairs) / n,
            decode_iterations=self.sum_decode_iterations / f,
            t_out=self.sum_t_out / f,
        )

    @property
    def mean_decode_requests(self) -> float | None:
        """q̄ of the slice: time integral of requests in decode over the time it covers; None if uncovered."""
        if self.decode_observed_s <= 0:
            return None
        return self.decode_request_seconds / self.decode_observed_s

    @property
    def mean_prefill_backlog(self) -> float | None:
        """Mean number of requests sent to prefill nodes and not yet prefilled over the observed time; None if
        uncovered."""
        if self.decode_observed_s <= 0:
            return None
        return self.backlog_request_seconds / self.decode_observed_s

    def merge(self, other: SliceStats) -> SliceStats:
        """The slice over both spans: every count and sum adds. The spans must not overlap."""
        if self.start < other.end and other.start < self.end:
            raise ValueError(
                f"cannot merge overlapping slices [{self.start}, {self.end}) and [{other.start}, {other.end})"
            )
        return SliceStats(
            start=min(self.start, other.start),
            end=max(self.end, other.end),
            requests=self.requests + other.requests,
            sum_t_uc=self.sum_t_uc + other.sum_t_uc,
            sum_t_c=self.sum_t_c + other.sum_t_c,
            sum_query_key_pairs=self.sum_query_key_pairs + other.sum_query_key_pairs,
            sum_t_out=self.sum_t_out + other.sum_t_out,
            sum_decode_iterations=self.sum_decode_iterations + other.sum_decode_iterations,
            decode_request_seconds=self.decode_request_seconds + other.decode_request_seconds,
            decode_observed_s=self.decode_observed_s + other.decode_observed_s,
            finished=self.finished + other.finished,
            backlog_request_seconds=self.backlog_request_seconds + other.backlog_request_seconds,
            measured=self.measured + other.measured,
            correction_t_uc=self.correction_t_uc + other.correction_t_uc,
            correction_t_c=self.correction_t_c + other.correction_t_c,
            correction_query_key_pairs=self.correction_query_key_pairs + other.correction_query_key_pairs,
        )


def merge_slices(slices: Iterable[SliceStats]) -> SliceStats:
    """One slice over all given (non-overlapping) slices."""
    items = sorted(slices, key=lambda s: s.start)
    if not items:
        raise ValueError("merge_slices needs at least one slice")
    merged = items[0]
    for item in items[1:]:
        merged = merged.merge(item)
    return merged


class _Open:
    """Mutable sums of the slice being recorded."""

    __slots__ = (
        "requests", "t_uc", "t_c", "pairs", "finished", "t_out", "iters", "busy", "observed", "backlog", "measured",
        "d_uc", "d_c", "d_pairs",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.finished = 0
        self.t_uc = 0
        self.t_c = 0
        self.pairs = 0
        self.t_out = 0
        self.iters = 0.0
        self.busy = 0.0
        self.observed = 0.0
        self.backlog = 0.0
        self.measured = 0
        self.d_uc = 0
        self.d_c = 0
        self.d_pairs = 0


def _pairs(t_uc: int, t_c: int) -> int:
    """A = t_uc t_c + t_uc (t_uc + 1) / 2: query-key pairs of a prefill of t_uc new tokens after t_c cached ones."""
    return t_uc * t_c + t_uc * (t_uc + 1) // 2


class SliceRecorder:
    """Records requests and decode occupancy into consecutive slices aligned to `origin + k * slice_s`.

    Time never goes backwards. The number of requests in decode is piecewise constant: a value given by
    `record_decode_occupancy(count, now)` holds from `now` until the next call; so is the prefill backlog
    (`record_prefill_backlog`, integrated over the same observed time; 0 until first given). Occupancy is integrated only
    from the first such call on (before it the slice's decode time is not observed). Keeps the last `keep`
    completed slices.
    """

    def __init__(self, origin: float, slice_s: float = 60.0, keep: int = 10) -> None:
        if not (math.isfinite(slice_s) and slice_s > 0):
            raise ValueError(f"slice_s must be a finite number > 0, got {slice_s}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if not math.isfinite(origin):
            raise ValueError(f"origin must be finite, got {origin}")
        self._origin = origin
        self._slice_s = slice_s
        self._index = 0
        self._open = _Open()
        self._done: deque[SliceStats] = deque(maxlen=keep)
        self._now = origin
        self._count: int | None = None
        self._backlog = 0
        self._count_since = origin

    @classmethod
    def for_window(cls, config: WindowConfig, origin: float) -> SliceRecorder:
        return cls(origin, slice_s=config.slice_s, keep=config.slices)

    @property
    def slice_s(self) -> float:
        return self._slice_s

    def _bounds(self, index: int) -> tuple[float, float]:
        return self._origin + index * self._slice_s, self._origin + (index + 1) * self._slice_s

    def _integrate(self, until: float) -> None:
        if self._count is not None and until > self._count_since:
            span = until - self._count_since
            self._open.busy += self._count * span
            self._open.backlog += self._backlog * span
            self._open.observed += span
        self._count_since = until

    def advance(self, now: float) -> None:
        """Close every slice that ends at or before `now`."""
        if not now >= self._now:
            raise ValueError(f"time went backwards: now={now} is before the last event at {self._now}")
        self._now = now
        while True:
            start, end = self._bounds(self._index)
            if now < end:
                return
            self._integrate(end)
            o = self._open
            self._done.append(
                SliceStats(start, end, o.requests, o.t_uc, o.t_c, o.pairs, o.t_out, o.iters, o.busy, o.observed,
                           o.finished, o.backlog, o.measured, o.d_uc, o.d_c, o.d_pairs)
            )
            self._index += 1
            self._open = _Open()

    def record_prefill(self, t_uc: int, t_c: int, now: float) -> None:
        """A request arrived at `now` with `t_uc` uncached and `t_c` cached tokens (those the router can reuse)."""
        self.advance(now)
        o = self._open
        o.requests += 1
        o.t_uc += t_uc
        o.t_c += t_c
        o.pairs += _pairs(t_uc, t_c)

    def correct_prefill(self, prompt_tokens: int, counted_cached: int, cached: int, now: float) -> None:
        """A prefill started at `now` reusing `cached` of its `prompt_tokens`, where its arrival was recorded with
        `counted_cached` (`record_prefill`, t_uc = prompt_tokens - counted_cached): the difference corrects the
        open slice's sums."""
        if not (0 <= counted_cached <= prompt_tokens and 0 <= cached <= prompt_tokens):
            raise ValueError(
                f"cached tokens must lie in [0, prompt_tokens={prompt_tokens}], got counted {counted_cached}, "
                f"measured {cached}"
            )
        self.advance(now)
        o = self._open
        o.measured += 1
        o.d_uc += counted_cached - cached
        o.d_c += cached - counted_cached
        o.d_pairs += _pairs(prompt_tokens - cached, cached) - _pairs(prompt_tokens - counted_cached, counted_cached)

    def record_decode(self, t_out: int, iterations: float, now: float) -> None:
        """A request finished at `now` after producing `t_out` tokens in `iterations` decode iterations (both
        measured)."""
        if t_out < 0 or not (math.isfinite(iterations) and iterations >= 0):
            raise ValueError(f"a finished request needs t_out >= 0 and finite iterations >= 0, got {t_out}, {iterations}")
        self.advance(now)
        o = self._open
        o.finished += 1
        o.t_out += t_out
        o.iters += iterations

    def record_request(self, work: Work, now: float) -> None:
        """Both halves of one request at once (tests and offline tools that know a request's whole work)."""
        self.record_prefill(work.t_uc, work.t_c, now)
        self.record_decode(work.t_out, work.t_out / work.t_acc, now)

    def record_decode_occupancy(self, count: int, now: float) -> None:
        """From `now` on, `count` requests are in decode across the cluster."""
        if count < 0:
            raise ValueError(f"decode occupancy must be >= 0, got {count} at t={now}")
        self.advance(now)
        self._integrate(now)
        self._count = count

    def record_prefill_backlog(self, count: int, now: float) -> None:
        """From `now` on, `count` requests are sent to prefill nodes and not yet prefilled."""
        if count < 0:
            raise ValueError(f"prefill backlog must be >= 0, got {count} at t={now}")
        self.advance(now)
        self._integrate(now)
        self._backlog = count

    def completed(self, now: float) -> tuple[SliceStats, ...]:
        """The last `keep` slices completed by `now`, oldest first."""
        self.advance(now)
        return tuple(self._done)
