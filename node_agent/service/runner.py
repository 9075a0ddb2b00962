"""`EngineRunner`: drives one `EngineCore` on the wall clock in a single asyncio task.

The node clock (`NodeClock`) is emulated time: seconds since start, running `speed_up` times faster than
the wall clock, never decreasing. The loop steps the engine when it has work, sleeps for the iteration's
duration (divided by `speed_up`) and wakes early only when idle (new submissions, landed fetches, a
switch). Peer fetches the engine starts run at once as tasks (`KvMover` in a worker thread), then report
`fetch_completed`.

Invariant (publication order): everything the engine produces (KV events, iteration records, tokens,
finished requests, switch reports) reaches the sink in the order the engine produced it, and nothing an
iteration produced is published before that iteration's end on the node clock, except its prefill starts:
they are facts at the iteration's launch (the router binds a decode node on them), so they are published
when it launches, after everything published before. While an iteration is in flight, outputs of other
calls (submissions, landed fetches) are held and published after it, in order.

Boundary: timing and effect dispatch; what the outputs mean for the arena, streams, events and metrics
is the sink's (`node.NodeAgent`).

Reports: at every step (an iteration's launch, or an idle step) the runner hands the sink the engine's prefill
queue as it stood before the step (`queue_report`), as the simulator records it, so routing sees fresh queues
while the node holds prefills.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from evolving_infra.core.itermodel import IterationRecord
from evolving_infra.core.kv_events import KvEvent
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Phase, Tier
from evolving_infra.node_agent.engine import (
    DecodeFinished,
    DecodeRequest,
    Effects,
    EngineCore,
    EngineGauges,
    FetchStarted,
    IterationKind,
    PrefillFinished,
    PrefillQueue,
    PrefillRequest,
    PrefillStarted,
    StepOutput,
    SwitchBegun,
    SwitchReport,
)

log = logging.getLogger(__name__)


class NodeClock:
    """Emulated seconds since start: `speed_up` times the wall clock, never decreasing."""

    def __init__(self, speed_up: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        if not speed_up > 0:
            raise ValueError(f"speed_up must be > 0, got {speed_up}")
        self.speed_up = speed_up
        self._monotonic = monotonic
        self._t0 = monotonic()
        self._floor = 0.0

    def now(self) -> float:
        self._floor = max(self._floor, (self._monotonic() - self._t0) * self.speed_up)
        return self._floor

    def advance_to(self, t: float) -> None:
        """Never report a time before `t` again (an iteration ended at `t`)."""
        self._floor = max(self._floor, t)

    def wall_delay(self, until: float) -> float:
        """Wall seconds until the node clock reads `until` (0 if it already does)."""
        return max(0.0, (until - self.now()) / self.speed_up)


class RunnerSink(Protocol):
    """Where the runner publishes engine outputs, in order (see the module docstring)."""

    def kv_events(self, events: tuple[KvEvent, ...]) -> None: ...
    def iteration(self, record: IterationRecord) -> None: ...
    def decode_tokens(self, request: str, new: int, time: float) -> None: ...
    def decode_finished(self, done: DecodeFinished) -> None: ...
    def prefill_started(self, started: PrefillStarted) -> None: ...
    def prefill_finished(self, done: PrefillFinished) -> None: ...
    def switch_completed(self, report: SwitchReport) -> None: ...
    def gauges(self, gauges: EngineGauges) -> None: ...
    def fetch_settled(self, pages: Sequence[PageHash]) -> None: ...
    def queue_report(self, queue: PrefillQueue, time: float) -> None: ...


class FetchExecutor(Protocol):
    """Pulls a request's fetch runs into the local arena; returns the pages that did not arrive."""

    async def fetch(self, request: str, runs: Sequence[FetchStarted], addresses: Mapping[NodeId, str]) -> frozenset[PageHash]: ...


@dataclass(frozen=True, slots=True)
class _Switched:
    report: SwitchReport


_Output = StepOutput | Effects | tuple[KvEvent, ...] | _Switched


class EngineRunner:
    """Runs `engine` on `clock`, publishing to `sink` and fetching with `fetcher` (module docstring)."""

    def __init__(self, engine: EngineCore, clock: NodeClock, sink: RunnerSink, fetcher: FetchExecutor) -> None:
        self.engine = engine
        self.clock = clock
        self.sink = sink
        self.fetcher = fetcher
        self._wake = asyncio.Event()
        self._holding = False
        self._held: list[_Output] = []
        self._task: asyncio.Task[None] | None = None
        self._fetches: dict[str, asyncio.Task[None]] = {}
        self._addresses: dict[str, dict[NodeId, str]] = {}
        self.failure: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self.halted = False
        """Set by `halt`: nothing more reaches the sink."""

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"engine-{self.engine.node}")

    async def stop(self) -> None:
        for task in list(self._fetches.values()):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def halt(self) -> None:
        """Publish nothing from now on (a relaunch terminates the engine: what it produced since its last
        publication, and the iteration in flight, are lost); `stop()` then ends the loop and the fetches."""
        self.halted = True
        self._held = []

    def busy(self) -> bool:
        """Whether any accepted work is left (queued, running, or a fetch in flight)."""
        g = self.engine.gauges()
        work = g.prefill_queued + g.prefill_running + g.decode_queued + g.decode_running
        return bool(work or self._fetches or self._held)

    # --- inputs (each is applied to the engine at once; outputs follow the publication order) --------
    def submit_prefill(self, req: PrefillRequest, addresses: Mapping[NodeId, str]) -> int:
        """Queue a prefill; returns the number of prefills queued ahead of it. Raises engine errors."""
        ahead = self.engine.gauges().prefill_queued
        effects = self.engine.submit_prefill(req, self.clock.now())
        if req.fetch:
            self._addresses[req.request] = dict(addresses)
        self._effects(effects)
        return ahead

    def submit_decode(self, req: DecodeRequest) -> int:
        """Queue a decode whose prompt KV is local; returns decodes queued ahead of it (0: admitted)."""
        before = self.engine.gauges().decode_queued
        effects = self.engine.submit_decode(req, self.clock.now())
        queued = self.engine.gauges().decode_queued > before
        self._effects(effects)
        return before if queued else 0

    def cancel_decode(self, request: str) -> bool:
        """Drop a decode whose client went away (queued or running); False if the engine no longer holds it."""
        effects = self.engine.cancel_decode(request, self.clock.now())
        self._effects(effects)
        return effects.applied

    def cancel_prefill(self, request: str) -> bool:
        """Drop a prefill whose client went away (queued or running); False if the engine no longer holds it.
        A fetch in flight for it runs out (its pages' slots are already released) and is then ignored."""
        effects = self.engine.cancel_prefill(request, self.clock.now())
        if effects.applied:
            self._addresses.pop(request, None)
        self._effects(effects)
        return effects.applied

    def begin_switch(self, target: Phase) -> SwitchBegun:
        begun = self.engine.begin_switch(target, self.clock.now())
        for req in begun.handed_back:
            self._addresses.pop(getattr(req, "request", ""), None)
        self._emit(begun.events)
        if begun.completed is not None:
            self._emit(_Switched(begun.completed))
        self._wake.set()
        return begun

    def set_counts(self, counts: Mapping[PageHash, int]) -> None:
        self.engine.set_counts(counts)

    def clear_counts(self) -> None:
        self.engine.pool.clear_counts()

    def drop_cached_kv(self) -> None:
        """Evict every page no request holds, GPU (written back) then host memory (a switch that strands KV)."""
        now, pool = self.clock.now(), self.engine.pool
        self._effects(self.engine.evict(Tier.GPU, pool.l1.capacity, now))
        self._effects(self.engine.evict(Tier.HOST, pool.l2.capacity, now))

    # --- effects -------------------------------------------------------------------------------------
    def _effects(self, effects: Effects) -> None:
        self._start_fetches(effects.fetches)
        self._emit(effects)
        self._wake.set()

    def _start_fetches(self, fetches: Sequence[FetchStarted]) -> None:
        by_request: dict[str, list[FetchStarted]] = {}
        for run in fetches:
            by_request.setdefault(run.request, []).append(run)
        loop = asyncio.get_running_loop()
        for request, runs in by_request.items():
            addresses = self._addresses.pop(request, {})
            task = loop.create_task(self._fetch(request, runs, addresses), name=f"fetch-{request}")
            self._fetches[request] = task

    async def _fetch(self, request: str, runs: list[FetchStarted], addresses: Mapping[NodeId, str]) -> None:
        failed: frozenset[PageHash] = frozenset()
        try:
            failed = await self.fetcher.fetch(request, runs, addresses)
        except asyncio.CancelledError:
            raise
        except Exception:  # transfer errors are handled by the fetcher; anything else is reported here
            log.warning("fetch of %s failed unexpectedly", request, exc_info=True)
            failed = frozenset(p for run in runs for p in run.pages)
        finally:
            self._fetches.pop(request, None)
        effects = self.engine.fetch_completed(request, self.clock.now(), failed)
        self._effects(effects)
        self.sink.fetch_settled([p for run in runs for p in run.pages])

    def _emit(self, output: _Output) -> None:
        if self.halted:
            return
        if self._holding:
            self._held.append(output)
        else:
            self._publish(output)

    def _publish(self, output: _Output, starts: bool = True) -> None:
        if self.halted:
            return
        sink = self.sink
        if isinstance(output, _Switched):
            sink.switch_completed(output.report)
            return
        if isinstance(output, Effects):
            if output.events:
                sink.kv_events(output.events)
            return
        if not isinstance(output, StepOutput):  # KV events alone (a step output is a named tuple too)
            if output:
                sink.kv_events(output)
            return
        if output.events:
            sink.kv_events(output.events)
        if starts:
            for started in output.prefills_started:
                sink.prefill_started(started)
        if output.record is not None:
            sink.iteration(output.record)
        for request, new in output.decode_tokens.items():
            if new:
                sink.decode_tokens(request, new, output.end)
        for done in output.prefills_finished:
            self._addresses.pop(done.request, None)
            sink.prefill_finished(done)
        for finished in output.decodes_finished:
            sink.decode_finished(finished)
        if output.switch_completed is not None:
            sink.switch_completed(output.switch_completed)
        if output.gauges is not None:
            sink.gauges(output.gauges)

    # --- the loop ------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while not self.halted:
                self._wake.clear()
                now = self.clock.now()
                queue = self.engine.prefill_queue()
                out = self.engine.step(now)
                self._start_fetches(out.fetches_started)
                if out.kind is IterationKind.IDLE:
                    self._publish(out)
                    self.sink.queue_report(queue, now)
                    timeout = self.clock.wall_delay(out.wake_at) if out.wake_at is not None else None
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    except TimeoutError:
                        pass
                    continue
                for started in out.prefills_started:  # published at launch (module docstring)
                    self.sink.prefill_started(started)
                self.sink.queue_report(queue, now)
                self._holding = True
                self._held.append(out)
                try:
                    await asyncio.sleep(self.clock.wall_delay(out.end))
                finally:
                    if not self.halted:  # a terminated engine's iteration never ends
                        self.clock.advance_to(out.end)
                    self._holding = False
                    held, self._held = self._held, []
                    for item in held:
                        self._publish(item, starts=item is not out)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # an engine bug: stop serving loudly rather than run on corrupt state
            log.exception("engine loop of node %s failed", self.engine.node)
            self.failure = error
            if self.on_failure is not None:
                self.on_failure(error)
