"""The event kernel: total order (time, priority, FIFO), determinism, cancellation, stopping, progress."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.sim.kernel import (
    Cancel,
    Event,
    Kernel,
    Priority,
    Progress,
    StopReason,
    StopRun,
)


def _recorder(log: list[str]):
    def action(event: Event) -> None:
        log.append(event.label)

    return action


def test_orders_by_time_then_priority_then_acceptance() -> None:
    log: list[str] = []
    rec = _recorder(log)
    kernel = Kernel()
    kernel.schedule_all(
        [
            Event(2.0, Priority.ARRIVAL, rec, "t2-arrival"),
            Event(1.0, Priority.OBSERVE, rec, "t1-observe"),
            Event(1.0, Priority.SCHEDULE, rec, "t1-schedule-a"),
            Event(1.0, Priority.COMPLETION, rec, "t1-completion"),
            Event(1.0, Priority.SCHEDULE, rec, "t1-schedule-b"),
            Event(0.5, Priority.OBSERVE, rec, "t0.5-observe"),
        ]
    )
    result = kernel.run()
    assert log == [
        "t0.5-observe",
        "t1-completion",
        "t1-schedule-a",
        "t1-schedule-b",
        "t1-observe",
        "t2-arrival",
    ]
    assert result.reason is StopReason.EMPTY
    assert result.processed == 6 and kernel.processed == 6 and kernel.now == 2.0


def test_events_returned_by_handlers_are_scheduled_fifo_among_equals() -> None:
    log: list[str] = []
    rec = _recorder(log)

    def spawn(event: Event) -> list[Event]:
        log.append(event.label)
        # Same time and priority as an event accepted earlier: runs after it.
        return [Event(event.time, Priority.SCHEDULE, rec, "child-1"), Event(event.time, Priority.SCHEDULE, rec, "child-2")]

    kernel = Kernel()
    kernel.schedule(Event(1.0, Priority.COMPLETION, spawn, "parent"))
    kernel.schedule(Event(1.0, Priority.SCHEDULE, rec, "sibling"))
    kernel.run()
    assert log == ["parent", "sibling", "child-1", "child-2"]


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(list(Priority))),
        min_size=1,
        max_size=40,
    )
)
def test_processing_order_is_sorted_by_time_priority_counter(specs: list[tuple[int, Priority]]) -> None:
    seen: list[tuple[float, int, int]] = []
    kernel = Kernel(observer=lambda counter, ev: seen.append((ev.time, int(ev.priority), counter)))
    for t, p in specs:
        kernel.schedule(Event(float(t), p, lambda ev: None))
    kernel.run()
    assert seen == sorted(seen)
    assert len(seen) == len(specs)


def _random_run(seed: int) -> list[tuple[int, float, str]]:
    """A small branching process whose handlers draw from a seeded generator they were given."""
    rng = random.Random(seed)
    trace: list[tuple[int, float, str]] = []
    kernel = Kernel(observer=lambda counter, ev: trace.append((counter, ev.time, ev.label)))

    def grow(event: Event) -> list[Event]:
        depth = event.payload
        if depth >= 4:
            return []
        return [
            Event(event.time + rng.choice([0.0, 0.5, 1.0]), rng.choice(list(Priority)), grow, f"d{depth + 1}-{i}", payload=depth + 1)
            for i in range(rng.randint(0, 3))
        ]

    kernel.schedule(Event(0.0, Priority.ARRIVAL, grow, "root", payload=0))
    kernel.run()
    return trace


@given(st.integers(0, 2**32 - 1))
def test_same_seed_gives_the_same_event_trace(seed: int) -> None:
    assert _random_run(seed) == _random_run(seed)


def test_different_seeds_give_different_traces() -> None:
    assert len({tuple(_random_run(s)) for s in range(20)}) > 1


def test_cancel_by_token_drops_every_pending_event_with_it() -> None:
    log: list[str] = []
    rec = _recorder(log)
    kernel = Kernel()
    kernel.schedule(Event(1.0, Priority.ARRIVAL, rec, "a", token="x"))
    kernel.schedule(Event(2.0, Priority.ARRIVAL, rec, "b", token="x"))
    kernel.schedule(Event(1.5, Priority.ARRIVAL, rec, "c", token="y"))
    assert kernel.pending == 3
    assert kernel.cancel("x") == 2
    assert kernel.cancel("x") == 0
    assert kernel.cancel("never") == 0
    assert kernel.pending == 1
    kernel.run()
    assert log == ["c"]
    assert kernel.cancelled == 2 and kernel.processed == 1


def test_handler_cancels_a_timeout_through_a_command() -> None:
    log: list[str] = []
    rec = _recorder(log)

    def finish(event: Event) -> list:
        log.append("finish")
        return [Cancel(("timeout", "job-1"))]

    kernel = Kernel()
    kernel.schedule(Event(5.0, Priority.CONTROL, rec, "timeout", token=("timeout", "job-1")))
    kernel.schedule(Event(3.0, Priority.COMPLETION, finish, "finish"))
    kernel.run()
    assert log == ["finish"]


def test_a_token_can_be_reused_after_its_event_ran() -> None:
    log: list[str] = []
    rec = _recorder(log)

    def again(event: Event) -> list:
        log.append(event.label)
        if event.payload < 2:
            return [Event(event.time + 1, Priority.ARRIVAL, again, f"tick{event.payload + 1}", token="tick", payload=event.payload + 1)]
        return []

    kernel = Kernel()
    kernel.schedule(Event(0.0, Priority.ARRIVAL, again, "tick0", token="tick", payload=0))
    kernel.schedule(Event(1.5, Priority.CONTROL, lambda ev: [Cancel("tick")], "cancel"))
    kernel.run()
    assert log == ["tick0", "tick1"]


def test_run_until_is_inclusive_and_advances_the_clock() -> None:
    log: list[str] = []
    rec = _recorder(log)
    kernel = Kernel()
    for t in (1.0, 2.0, 3.0):
        kernel.schedule(Event(t, Priority.ARRIVAL, rec, f"t{t:g}"))
    result = kernel.run(until=2.0)
    assert log == ["t1", "t2"] and result.reason is StopReason.UNTIL and kernel.now == 2.0
    result = kernel.run(until=10.0)
    assert log == ["t1", "t2", "t3"] and result.reason is StopReason.EMPTY and kernel.now == 10.0
    with pytest.raises(ValueError, match="until"):
        kernel.run(until=5.0)


def test_stop_from_a_handler_and_from_outside() -> None:
    log: list[str] = []
    rec = _recorder(log)
    kernel = Kernel()
    kernel.schedule(Event(1.0, Priority.ARRIVAL, lambda ev: [StopRun("enough")], "stopper"))
    kernel.schedule(Event(2.0, Priority.ARRIVAL, rec, "later"))
    result = kernel.run()
    assert result.reason is StopReason.STOPPED and result.detail == "enough" and log == []
    assert kernel.now == 1.0
    kernel.stop()
    assert kernel.run().reason is StopReason.STOPPED and log == []
    assert kernel.run().reason is StopReason.EMPTY and log == ["later"]


def test_max_events_and_progress_hook() -> None:
    reports: list[Progress] = []
    kernel = Kernel(progress=reports.append, progress_every=3)
    for t in range(10):
        kernel.schedule(Event(float(t), Priority.ARRIVAL, lambda ev: None))
    result = kernel.run(max_events=7)
    assert result.reason is StopReason.MAX_EVENTS and result.processed == 7
    assert [r.processed for r in reports] == [3, 6, 7]
    assert reports[-1].pending == 3 and reports[-1].now == 6.0
    kernel.run()
    assert kernel.processed == 10


def test_skipped_events_count_and_progress_reports_step_over_them() -> None:
    """A handler that stands for events it never scheduled (`count_skipped`): they count as processed (and their
    inline steps as inlined), and a report due among them comes after the event that skipped them."""
    reports: list[Progress] = []
    kernel = Kernel(progress=reports.append, progress_every=4)
    assert not kernel.may_skip()  # (only inside a run)
    seen: list[bool] = []

    def skip(ev: Event) -> None:
        seen.append(kernel.may_skip())
        kernel.count_skipped(6, 3)

    for t in range(3):
        kernel.schedule(Event(float(t), Priority.ARRIVAL, skip))
    kernel.run()
    assert seen == [True, True, True]
    assert kernel.processed == 21 and kernel.inlined == 9
    assert [r.processed for r in reports] == [7, 14, 21, 21]  # (each past a multiple of 4, then the final one)
    with pytest.raises(ValueError, match="skipped events"):
        kernel.count_skipped(1, 2)
    assert Kernel(observer=lambda c, e: None).may_skip() is False


def test_progress_hook_may_stop_the_run() -> None:
    kernels: list[Kernel] = []

    def hook(p: Progress) -> None:
        if p.processed >= 4:
            kernels[0].stop("progress said so")

    kernel = Kernel(progress=hook, progress_every=2)
    kernels.append(kernel)
    for t in range(10):
        kernel.schedule(Event(float(t), Priority.ARRIVAL, lambda ev: None))
    result = kernel.run()
    assert result.reason is StopReason.STOPPED and kernel.processed == 4


def test_rejects_events_in_the_past_and_bad_values() -> None:
    kernel = Kernel(start=10.0)
    with pytest.raises(ValueError, match="before the current time"):
        kernel.schedule(Event(9.0, Priority.ARRIVAL, lambda ev: None, "late"))
    with pytest.raises(ValueError, match="non-finite"):
        kernel.schedule(Event(float("nan"), Priority.ARRIVAL, lambda ev: None))
    with pytest.raises(TypeError, match="Priority"):
        kernel.schedule(Event(11.0, 3, lambda ev: None))  # type: ignore[arg-type]
    kernel.schedule(Event(11.0, Priority.ARRIVAL, lambda ev: ["oops"]))
    with pytest.raises(TypeError, match="allowed are Event, Cancel and StopRun"):
        kernel.run()


@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(list(Priority))), min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 2), st.sampled_from(list(Priority)), st.booleans()), max_size=40),
)
def test_events_run_inline_in_the_order_the_queue_would_give(
    starts: list[tuple[int, Priority]], spawns: list[tuple[int, Priority, bool]]
) -> None:
    """A handler that would return one event may ask `run_inline` and carry it out at once: the actions run in
    the same order as with every event through the queue, and the counters end the same (a spawn is a later
    time offset, a priority, and whether the handler asks)."""

    def play(inline: bool) -> tuple[list[str], int, int, int]:
        log: list[str] = []
        todo = list(spawns)
        kernel = Kernel()

        def act(event: Event) -> list[Event]:
            event_now = event
            while True:
                log.append(event_now.label)
                if not todo:
                    return []
                dt, prio, ask = todo.pop(0)
                child = Event(event_now.time + dt, prio, act, f"{event_now.label}>{len(todo)}")
                if inline and ask and kernel.run_inline(child.time, child.priority):
                    event_now = child  # carried out here, as the queue would have done next
                    continue
                return [child]

        kernel.schedule_all(Event(float(t), p, act, f"s{i}") for i, (t, p) in enumerate(starts))
        kernel.run()
        return log, kernel.processed, kernel._counter, kernel.inlined

    queued, inlined = play(False), play(True)
    assert inlined[:3] == queued[:3]
    assert queued[3] == 0


def test_run_inline_says_no_outside_a_plain_run() -> None:
    """Not between runs, not with an observer or an event budget, not for a time other than now, and not
    while an earlier event is due."""
    kernel = Kernel()
    assert not kernel.run_inline(0.0, Priority.SCHEDULE)
    answers: list[bool] = []

    def ask(event: Event) -> None:
        answers.append(kernel.run_inline(event.time, Priority.SCHEDULE))
        answers.append(kernel.run_inline(event.time + 1.0, Priority.SCHEDULE))

    kernel.schedule(Event(1.0, Priority.ARRIVAL, ask, "alone"))
    kernel.run()
    kernel.schedule_all([Event(2.0, Priority.ARRIVAL, ask, "first"), Event(2.0, Priority.COMPLETION, lambda e: None, "x")])
    kernel.run()
    kernel.schedule_all([Event(3.0, Priority.ARRIVAL, ask, "a"), Event(3.0, Priority.SCHEDULE, lambda e: None, "b")])
    kernel.run()
    kernel.schedule(Event(4.0, Priority.ARRIVAL, ask, "budget"))
    kernel.run(max_events=5)
    assert answers == [True, False, True, False, False, False, False, False]
    assert kernel.inlined == 2


def test_a_handler_carries_out_the_next_event_itself() -> None:
    log: list[str] = []
    kernel = Kernel()

    def first(event: Event) -> list[Event]:
        log.append(event.label)
        if kernel.run_inline(event.time, Priority.SCHEDULE):
            log.append("next, inline")
            return []
        return [Event(event.time, Priority.SCHEDULE, lambda e: log.append("next, queued"), "next")]

    kernel.schedule_all([Event(1.0, Priority.ARRIVAL, first, "a"), Event(1.0, Priority.CONTROL, first, "b")])
    result = kernel.run()
    # a's next step is due before b (SCHEDULE < CONTROL): inline; b's would be the last event: inline too
    assert log == ["a", "next, inline", "b", "next, inline"]
    assert result.processed == kernel.processed == 4 and kernel.inlined == 2
