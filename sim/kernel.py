"""A deterministic discrete-event kernel in virtual time.

Invariant: events are processed in the total order of `(time, priority, counter)`, where `counter` is the
order in which the kernel accepted them; the same initial events and the same handlers therefore give the
same sequence of processed events, run after run. Virtual time never goes backwards.

Handlers never touch the queue: an event's `action(event)` returns commands (new `Event`s to schedule,
`Cancel(token)`, `StopRun()`), and the kernel applies them in the order returned. The kernel never reads a
clock and owns no random state; a caller that needs randomness passes seeded generators to its handlers
(see `evolving_infra.sim.rng`).

Boundary: ordering, cancellation, stopping and progress reporting; no domain knowledge.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple


class Priority(enum.IntEnum):
    """Order of events at the same virtual time (lower first).

    Completions free capacity before new work arrives; arrivals are all in before a scheduling step looks
    at the queues; control decisions (planner, switches) see the state after scheduling; observers sample
    the settled state last.
    """

    COMPLETION = 10
    ARRIVAL = 20
    SCHEDULE = 30
    CONTROL = 40
    OBSERVE = 50


class _EventFields(NamedTuple):
    time: float
    priority: Priority
    action: Callable[[Event], Iterable[Command] | None]
    label: str = ""
    token: Hashable | None = None
    payload: Any = None


class Event(_EventFields):
    """Something that happens at `time`: the kernel calls `action(self)` and applies the commands it returns.

    `token` (any hashable value, optional) names the event for cancellation; several pending events may
    share a token and are then cancelled together. `payload` is free for the handler's use; `label` names
    the event in traces and diagnostics.

    An immutable named tuple compared by identity (two events with equal fields are still two events); a
    simulation makes one or more per engine iteration, and a frozen dataclass is slower to make.
    """

    __slots__ = ()
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__


@dataclass(frozen=True, slots=True)
class Cancel:
    """Command: drop every pending event that carries `token` (nothing happens if none does)."""

    token: Hashable


@dataclass(frozen=True, slots=True)
class StopRun:
    """Command: end the current `run` after the event that returned it."""

    reason: str = "stopped by a handler"


Command = Event | Cancel | StopRun


class StopReason(enum.Enum):
    """Why `Kernel.run` returned."""

    EMPTY = "empty"
    """No pending event is left."""
    UNTIL = "until"
    """The next pending event lies after `until`."""
    STOPPED = "stopped"
    """`stop()` was called or a handler returned `StopRun`."""
    MAX_EVENTS = "max-events"
    """`max_events` events were processed in this call."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What the progress hook receives: virtual time and counts. Rates are the caller's business."""

    now: float
    processed: int
    pending: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class RunResult:
    reason: StopReason
    now: float
    processed: int
    """Events processed in this call to `run`."""
    detail: str = ""


_Entry = tuple[float, Priority, int, Event]
"""(time, priority, counter, event): counters are unique, so events are never compared."""


class Kernel:
    """The event queue and virtual clock.

    `observer(counter, event)` (optional) sees every processed event in order, before its action runs: a
    hook for event traces and determinism checks. `progress(Progress)` (optional) is called every
    `progress_every` processed events and once when `run` returns.
    """

    def __init__(
        self,
        start: float = 0.0,
        *,
        progress: Callable[[Progress], None] | None = None,
        progress_every: int = 100_000,
        observer: Callable[[int, Event], None] | None = None,
    ) -> None:
        if not math.isfinite(start):
            raise ValueError(f"start time must be finite, got {start!r}")
        if progress_every < 1:
            raise ValueError(f"progress_every must be >= 1, got {progress_every}")
        self._now = float(start)
        self._queue: list[_Entry] = []
        self._counter = 0
        self._by_token: dict[Hashable, set[int]] = {}
        self._dead: set[int] = set()
        self._processed = 0
        self._cancelled = 0
        self._stop: str | None = None
        self._progress = progress
        self._progress_every = progress_every
        self._observer = observer
        self._inline = False  # whether `run_inline` may say yes (inside `run` without an event budget)
        self._inlined = 0

    # -- state -------------------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._now

    @property
    def processed(self) -> int:
        """Events processed since the kernel was made (cancelled ones are not counted)."""
        return self._processed

    @property
    def inlined(self) -> int:
        """Events carried out by their scheduling handler at once (`run_inline`), counted in `processed`."""
        return self._inlined

    @property
    def cancelled(self) -> int:
        """Pending events dropped by cancellation so far."""
        return self._cancelled

    @property
    def pending(self) -> int:
        """Events scheduled and neither processed nor cancelled."""
        return len(self._queue) - len(self._dead)

    def peek(self) -> float | None:
        """Time of the next pending event, or None when there is none."""
        self._drop_dead_head()
        return self._queue[0][0] if self._queue else None

    # -- commands ----------------------------------------------------------------------------------------
    def schedule(self, event: Event) -> None:
        """Accept `event`; it must not lie in the past."""
        if not isinstance(event, Event):
            raise TypeError(f"can only schedule Event, got {type(event).__name__}")
        self._push(event)

    def _push(self, event: Event) -> None:
        time = event.time
        if not self._now <= time < math.inf or type(event.priority) is not Priority:
            self._reject(event)
        counter = self._counter
        self._counter = counter + 1
        heapq.heappush(self._queue, (time, event.priority, counter, event))
        token = event.token
        if token is not None:
            live = self._by_token.get(token)
            if live is None:
                self._by_token[token] = {counter}
            else:
                live.add(counter)

    def _reject(self, event: Event) -> None:
        if not math.isfinite(event.time):
            raise ValueError(f"event {event.label or event!r} has a non-finite time {event.time!r}")
        if event.time < self._now:
            raise ValueError(
                f"event {event.label or '(unlabelled)'} at t={event.time} lies before the current time "
                f"t={self._now}; events may only be scheduled at or after now"
            )
        raise TypeError(f"event priority must be a Priority, got {event.priority!r}")

    def schedule_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.schedule(event)

    def cancel(self, token: Hashable) -> int:
        """Drop every pending event carrying `token`; returns how many were dropped."""
        counters = self._by_token.pop(token, None)
        if not counters:
            return 0
        self._dead.update(counters)
        self._cancelled += len(counters)
        return len(counters)

    def stop(self, reason: str = "stop() called") -> None:
        """End the current (or next) `run` before it processes another event."""
        self._stop = reason

    def apply(self, commands: Iterable[Command] | None) -> None:
        """Apply handler commands in order (also usable by a driver between runs)."""
        if commands is None:
            return
        for command in commands:
            kind = type(command)
            if kind is Event or isinstance(command, Event):
                self._push(command)  # type: ignore[arg-type]  # `kind is Event` is the fast path of the isinstance
            elif isinstance(command, Cancel):
                self.cancel(command.token)
            elif isinstance(command, StopRun):
                self._stop = command.reason
            else:
                raise TypeError(
                    f"a handler returned {command!r}; allowed are Event, Cancel and StopRun"
                )

    def run_inline(self, time: float, priority: Priority) -> bool:
        """Whether an event that the running handler would schedule at (`time`, `priority`) as its only command
        is the very next one `run` would process: it lies at the current time, no pending event comes before
        it, and nothing watches or limits the run event by event (an observer, an event budget, a progress
        report due, a stop). If so it counts as scheduled and processed (the counters move as if it had been),
        and the handler carries it out at once instead of returning it: the same order of actions, without
        the event's round trip through the queue."""
        if not self._inline or time != self._now or self._stop is not None:
            return False
        if self._dead:
            self._drop_dead_head()
        queue = self._queue
        if queue:
            head_time, head_priority = queue[0][0], queue[0][1]
            if head_time < time or (head_time == time and head_priority <= priority):
                return False  # (an equal key with a smaller counter goes first)
        processed = self._processed + 1
        if self._progress is not None and processed % self._progress_every == 0:
            return False
        self._counter += 1
        self._processed = processed
        self._inlined += 1
        return True

    def may_skip(self) -> bool:
        """Whether a handler may stand for events it works out itself (`count_skipped`): as `run_inline`, only
        inside `run` with nothing watching or limiting the run event by event."""
        return self._inline and self._stop is None

    def count_skipped(self, events: int, inlined: int) -> None:
        """A handler (or the driver, after a run) carried out `events` events that were never scheduled (`inlined`
        of them steps run at once), as their actions would have: they count as scheduled and processed."""
        if not 0 <= inlined <= events:
            raise ValueError(f"skipped events must be >= their inline ones >= 0, got {events} and {inlined}")
        self._counter += events
        self._processed += events
        self._inlined += inlined

    # -- running -----------------------------------------------------------------------------------------
    def step(self) -> Event | None:
        """Process the next pending event and return it (None when the queue is empty)."""
        self._inline = False  # (one event: its handler carries out nothing more)
        self._drop_dead_head()
        if not self._queue:
            return None
        return self._process(heapq.heappop(self._queue))

    def _process(self, entry: _Entry) -> Event:
        time, _, counter, event = entry
        token = event.token
        if token is not None:
            live = self._by_token.get(token)
            if live is not None:
                live.discard(counter)
                if not live:
                    del self._by_token[token]
        self._now = time
        self._processed += 1
        if self._observer is not None:
            self._observer(counter, event)
        self.apply(event.action(event))
        return event

    def run(self, until: float | None = None, *, max_events: int | None = None) -> RunResult:
        """Process events in order until the queue is empty, the next event lies after `until`, `stop()`
        is called, or `max_events` have been processed in this call.

        Events at exactly `until` are processed. When the run ends because of `until` or an empty queue and
        `until` is given, the clock advances to `until`.
        """
        if until is not None and (not math.isfinite(until) or until < self._now):
            raise ValueError(f"until must be finite and >= now ({self._now}), got {until!r}")
        if max_events is not None and max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        limit = math.inf if until is None else until
        budget = -1 if max_events is None else max_events
        self._inline = self._observer is None and max_events is None
        first = self._processed
        queue, dead, pop, process = self._queue, self._dead, heapq.heappop, self._process
        progress, every = self._progress, self._progress_every
        report_at = (self._processed // every + 1) * every  # (skipped events may step over a multiple)
        done = 0
        reason = StopReason.EMPTY
        detail = ""
        while True:
            if self._stop is not None:
                reason, detail = StopReason.STOPPED, self._stop
                break
            if done == budget:
                reason = StopReason.MAX_EVENTS
                break
            if dead:
                self._drop_dead_head()
            if not queue:
                reason = StopReason.EMPTY
                break
            if queue[0][0] > limit:
                reason = StopReason.UNTIL
                break
            process(pop(queue))
            done += 1
            if progress is not None and self._processed >= report_at:
                progress(self._report())
                report_at = (self._processed // every + 1) * every
        self._stop = None
        self._inline = False
        if until is not None and reason in (StopReason.EMPTY, StopReason.UNTIL):
            self._now = float(until)
        if progress is not None:
            progress(self._report())
        return RunResult(reason=reason, now=self._now, processed=self._processed - first, detail=detail)

    def _report(self) -> Progress:
        return Progress(
            now=self._now, processed=self._processed, pending=self.pending, cancelled=self._cancelled
        )

    def _drop_dead_head(self) -> None:
        while self._queue and self._queue[0][2] in self._dead:
            self._dead.discard(heapq.heappop(self._queue)[2])
