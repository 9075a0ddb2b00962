"""Replay of a prefill node's chunked-prefill iterations, to predict when each request starts and ends.

Schedule (as the engine runs it): every iteration takes up to `chunk_tokens` uncached tokens from the
jobs in order (running requests first, then the queue in arrival order); the job at the head gives as
many tokens as it has left or as the budget allows, then the next job fills the rest, so several
requests share an iteration and at most one request is split at the end of an iteration. A chunk
attends to the job's context (cached prefix plus its earlier chunks); a job's restored tokens are charged
to the iteration of its first chunk. Each iteration lasts `model.prefill_iteration_time(items)` (eq. 1).

Invariant: iterations are contiguous in time from 0; every job with tokens left appears in consecutive
iterations from its start to its finish; the tokens of all iterations sum to the jobs' tokens; no
iteration exceeds the budget.

`append_job` gives the same answer for one more job from a `Backlog` summary, so a router can replay a
node's backlog once and price every new request against it; `extend_backlog` gives the summary of the backlog
with one more job, bit-identical to replaying the longer queue, so a summary can be kept up to date as
requests are sent (`backlogs.py`).

Boundary: pure; times are relative to the moment of the replay (0 = now).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.core.itermodel import PrefillItem
from evolving_infra.core.types import RequestId
from evolving_infra.router.routing.nodemodel import PrefillNodeModel

DEFAULT_CHUNK_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """A request's outstanding prefill: tokens to compute, context before them, tokens it restores."""

    request: RequestId
    remaining_tokens: int
    context_tokens: int
    restore_tokens: int = 0

    def __post_init__(self) -> None:
        if self.remaining_tokens < 1:
            raise ValueError(f"job {self.request}: remaining_tokens must be >= 1, got {self.remaining_tokens}")
        if self.context_tokens < 0 or self.restore_tokens < 0:
            raise ValueError(f"job {self.request}: context_tokens and restore_tokens must be >= 0")


@dataclass(frozen=True, slots=True)
class JobTiming:
    """When a job's first chunk's iteration starts and its last chunk's iteration ends (s from now)."""

    request: RequestId
    start: float
    finish: float

    @property
    def service(self) -> float:
        return self.finish - self.start


@dataclass(frozen=True, slots=True)
class ReplayIteration:
    start: float
    duration: float
    items: tuple[PrefillItem, ...]
    requests: tuple[RequestId, ...]


@dataclass(frozen=True, slots=True)
class Backlog:
    """A replayed backlog, summarized so that one more job can be appended without replaying it again:
    its last iteration (which the next job joins if it has budget left) and when that iteration starts."""

    chunk_tokens: int
    last_start: float = 0.0
    last_duration: float = 0.0
    last_items: tuple[PrefillItem, ...] = ()

    @property
    def end(self) -> float:
        return self.last_start + self.last_duration

    @property
    def room(self) -> int:
        """Budget left in the last iteration (0 when there is none)."""
        if not self.last_items:
            return 0
        return self.chunk_tokens - sum(item.t_uc for item in self.last_items)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    timings: tuple[JobTiming, ...]
    iterations: tuple[ReplayIteration, ...]
    backlog: Backlog

    @property
    def last(self) -> JobTiming:
        return self.timings[-1]


def _duration(model: PrefillNodeModel, items: Sequence[PrefillItem]) -> float:
    duration = model.prefill_iteration_time(items)
    if not (math.isfinite(duration) and duration >= 0):
        raise ValueError(f"node model returned an invalid iteration time {duration!r} for {list(items)}")
    return duration


def replay_chunked_prefill(
    model: PrefillNodeModel,
    jobs: Sequence[ReplayJob],
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    keep_iterations: bool = False,
) -> ReplayResult:
    """Replay `jobs` in order; returns each job's timing (and the iterations if `keep_iterations`)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    remaining = [job.remaining_tokens for job in jobs]
    context = [job.context_tokens for job in jobs]
    starts: list[float] = [0.0] * len(jobs)
    timings: list[JobTiming] = []
    iterations: list[ReplayIteration] = []
    clock = 0.0
    head = 0
    last = Backlog(chunk_tokens)
    while head < len(jobs):
        budget = chunk_tokens
        items: list[PrefillItem] = []
        members: list[int] = []
        i = head
        while budget > 0 and i < len(jobs):
            take = min(remaining[i], budget)
            first = remaining[i] == jobs[i].remaining_tokens
            items.append(PrefillItem(t_uc=take, t_c=context[i], t_rst=jobs[i].restore_tokens if first else 0))
            members.append(i)
            if first:
                starts[i] = clock
            remaining[i] -= take
            context[i] += take
            budget -= take
            i += 1
        duration = _duration(model, items)
        if keep_iterations:
            iterations.append(
                ReplayIteration(clock, duration, tuple(items), tuple(jobs[m].request for m in members))
            )
        last = Backlog(chunk_tokens, clock, duration, tuple(items))
        clock += duration
        while head < len(jobs) and remaining[head] == 0:
            timings.append(JobTiming(jobs[head].request, starts[head], clock))
            head += 1
    return ReplayResult(tuple(timings), tuple(iterations), last)


def append_job(model: PrefillNodeModel, backlog: Backlog, job: ReplayJob) -> JobTiming:
    """The timing `job` would get if appended after the jobs `backlog` summarizes.

    Equal to `replay_chunked_prefill(model, jobs + [job]).last` for the same model and chunk size, at the
    cost of the job's own iterations only.
    """
    chunk = backlog.chunk_tokens
    remaining, context, restore = job.remaining_tokens, job.context_tokens, job.restore_tokens
    room = backlog.room
    if room > 0:
        take = min(remaining, room)
        start = backlog.last_start
        clock = start + _duration(model, (*backlog.last_items, PrefillItem(take, context, restore)))
        remaining, context, restore = remaining - take, context + take, 0
    else:
        start = clock = backlog.end
    while remaining > 0:
        take = min(remaining, chunk)
        clock += _duration(model, (PrefillItem(take, context, restore),))
        remaining, context, restore = remaining - take, context + take, 0
    return JobTiming(job.request, start, clock)


def extend_backlog(model: PrefillNodeModel, backlog: Backlog, job: ReplayJob) -> Backlog:
    """The summary of `backlog` with `job` appended: equal (bit for bit) to
    `replay_chunked_prefill(model, jobs + [job]).backlog`, at the cost of the job's own iterations."""
    chunk = backlog.chunk_tokens
    remaining, context, restore = job.remaining_tokens, job.context_tokens, job.restore_tokens
    room = backlog.room
    if room > 0:
        take = min(remaining, room)
        items: tuple[PrefillItem, ...] = (*backlog.last_items, PrefillItem(take, context, restore))
        start, duration = backlog.last_start, _duration(model, items)
        remaining, context, restore = remaining - take, context + take, 0
    else:
        start, duration, items = backlog.last_start, backlog.last_duration, backlog.last_items
    while remaining > 0:
        start += duration
        take = min(remaining, chunk)
        items = (PrefillItem(take, context, restore),)
        duration = _duration(model, items)
        remaining, context, restore = remaining - take, context + take, 0
    return Backlog(chunk, start, duration, items)
