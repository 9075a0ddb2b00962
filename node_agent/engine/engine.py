"""The symmetric engine core: one scheduling loop that serves prefill, decode, or both (collocated).

Contract: the core is pure. Time is passed in (`now`, seconds, never decreasing), there is no I/O, no
thread and no global random state. Every call returns what it changed (`Effects`, `SwitchBegun`,
`StepOutput`); the driver carries those out and reports back (`fetch_completed`, `submit_decode` after a
transfer). The simulator (virtual time) and the node agent service (wall clock) drive the same object.

`step(now)` runs one iteration, or reports idle:
1. admission at `now`, first come first served per tier (decode queue, then the prefill queue: host
   admission and fetch starts, finished loads, GPU admission; see `prefill` and `decode`);
2. the iteration kind: prefill if a prefill is runnable, decode if a decode runs. A collocated node with
   both alternates (after a prefill iteration a decode iteration, and the reverse), so neither starves;
   while it switches to prefill it runs only decode iterations until its decodes are done (the switch then
   completes without waiting behind long prefill chunks);
3. the iteration's duration from the profile's ground truth (`groundtruth.IterationTimes`: eq. 1 for a
   prefill batch and eq. 2 for a decode batch plus the effects the models leave out, or eq. 1 and 2 alone
   with `exact_models=True`), plus any HiCache load stall, times seeded log-normal noise when `noise > 0`; its results (pages written,
   tokens, finished requests) are applied at once and stamped `now + duration`; the next `step` must
   come at or after that time (`EngineBusy` otherwise).

A phase switch completes `profile.switch_latency` after its drain (the last old-phase work finished); the
node runs no iteration in between, and an idle step reports that time as `wake_at`.

Invariant: each tier's pages add up (free + cached + pinned + in_use == capacity); every pin, in-use
slot and fetch belongs to a request the engine holds; an admitted request holds exactly its footprint
(pinned + loading + reserved L1 slots); checked by `check_invariants()` and, with
`check_invariants=True`, after every operation.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from evolving_infra.core.eviction import HostEvictionPolicy
from evolving_infra.core.itermodel import IterationRecord
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, NodeMode, Phase, RequestId, Tier
from evolving_infra.node_agent.engine.decode import DecodeScheduler
from evolving_infra.node_agent.engine.groundtruth import IterationTimes
from evolving_infra.node_agent.engine.errors import (
    DuplicateRequest,
    EngineBusy,
    PoolInvariantError,
    RequestTooLarge,
    TimeWentBackwards,
    UnknownRequest,
)
from evolving_infra.node_agent.engine.kvpool import KvPool
from evolving_infra.node_agent.engine.outputs import (
    DataPlane,
    DecodeFinished,
    Effects,
    EngineGauges,
    FetchStarted,
    IterationKind,
    PrefillFinished,
    PrefillStarted,
    StepOutput,
    SwitchBegun,
    SwitchReport,
    SwitchState,
)
from evolving_infra.node_agent.engine.prefill import PrefillScheduler, PrefillStage
from evolving_infra.node_agent.engine.requests import DecodeRequest, PrefillRequest, pages_needed, validate_pages
from evolving_infra.node_agent.engine.phase_switch import PhaseSwitch, serves
from evolving_infra.node_agent.profile import HardwareProfile

_TIME_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class RunningChunk:
    """A prefill running chunk by chunk: tokens still to compute, and the context its next chunk attends to."""

    request: str
    remaining_tokens: int
    context_tokens: int


@dataclass(frozen=True, slots=True)
class PrefillQueue:
    """The node's prefills (`EngineCore.prefill_queue`): those running, and the ids of the others in arrival order."""

    running: tuple[RunningChunk, ...] = ()
    queued: tuple[str, ...] = ()


_NO_PREFILLS = PrefillQueue()


class EngineCore:
    """One node's engine core (contract and invariant in the module docstring).

    report_detail: fill `StepOutput.decode_tokens` and `StepOutput.gauges` at every step (the live node agent
    streams tokens and publishes gauges; a driver that needs neither, like the simulator, turns this off and
    saves their cost every iteration: an iteration then touches only the requests whose pages complete or
    that finish in it).

    exact_models: iteration times are eq. 1 and 2 with the profile's coefficients alone (a debugging switch:
    the fitted models can then be exact); by default the profile's ground truth adds what they leave out.

    dense_labels: the pages are named by dense labels (the simulator's `PageLabels.DENSE`), which the pool's id
    tables resolve by blocks of labels (`labelblocks`); same results, less time per prompt page.
    """

    def __init__(
        self,
        node: NodeId,
        profile: HardwareProfile,
        mode: NodeMode,
        eviction: HostEvictionPolicy,
        data_plane: DataPlane = DataPlane.ASYNC_FETCH,
        noise: float = 0.0,
        rng: random.Random | None = None,
        check_invariants: bool = False,
        report_detail: bool = True,
        exact_models: bool = False,
        dense_labels: bool = False,
    ) -> None:
        if not noise >= 0:
            raise ValueError(f"noise must be >= 0 (relative standard deviation), got {noise}")
        if noise > 0 and rng is None:
            raise ValueError("noise > 0 needs a seeded random.Random passed as rng")
        self.node = node
        self.profile = profile
        self.data_plane = data_plane
        self.noise = noise
        self.rng = rng
        self._factors: deque[float] = deque()  # noise factors drawn ahead by `quiet_ahead`, used first by `_noisy`
        self.check = check_invariants
        self.pool = KvPool(node, profile.l1_pages, profile.l2_pages, eviction, check=check_invariants,
                           dense_labels=dense_labels)
        self._prefill = PrefillScheduler(node, profile, self.pool, data_plane)
        self._decode = DecodeScheduler(node, profile, self.pool)
        self._switch = PhaseSwitch(node, mode)
        self.times = IterationTimes(node, profile, exact=exact_models)
        self._now = -math.inf
        self._busy_until = -math.inf
        self._last_kind = IterationKind.IDLE
        self._known: set[str] = set()
        self._gauges: tuple[tuple[object, ...], EngineGauges] | None = None
        self.report_detail = report_detail

    # --- state ---------------------------------------------------------------------------------------
    @property
    def mode(self) -> NodeMode:
        return self._switch.mode

    @property
    def switch_state(self) -> SwitchState:
        return self._switch.state

    @property
    def last_switch(self) -> SwitchReport | None:
        return self._switch.last

    @property
    def busy_until(self) -> float:
        return self._busy_until

    def resident(self, tier: Tier) -> frozenset[PageHash]:
        """Pages resident (complete) in `tier`."""
        return self.pool.tier(tier).resident()

    def prefill_queue(self) -> PrefillQueue:
        """The prefills this node holds, as it reports them at an iteration launch (for routing)."""
        jobs = self._prefill.jobs
        if not jobs:
            return _NO_PREFILLS
        running: list[RunningChunk] = []
        queued: list[str] = []
        pt = self.profile.page_tokens
        for rid, job in jobs.items():
            if job.stage is PrefillStage.RUNNING:
                context = job.prefix_pages * pt + job.done
                running.append(RunningChunk(rid, max(0, job.req.prompt_tokens - context), context))
            else:
                queued.append(rid)
        return PrefillQueue(tuple(running), tuple(queued))

    def gauges(self) -> EngineGauges:
        running, waiting = self._prefill.stage_counts() if self._prefill.jobs else (0, 0)
        queued = len(self._prefill.jobs) - running
        decode_queued = self._decode.queued()
        decode_running = len(self._decode.jobs) - decode_queued
        pool = self.pool.gauges()
        key = (self.mode, self.switch_state, pool, queued, waiting, running, decode_queued, decode_running)
        last = self._gauges
        if last is None or key != last[0]:  # gauges are immutable: the last ones are handed out again if unchanged
            last = self._gauges = (key, EngineGauges(*key))
        return last[1]

    # --- inputs --------------------------------------------------------------------------------------
    def submit_prefill(self, req: PrefillRequest, now: float) -> Effects:
        """Queue a prefill; its fetch starts at once if host memory has room (see `Effects.fetches`)."""
        self._tick(now)
        self._switch.check_accepts(Phase.PREFILL)
        self._check_new(req.request)
        validate_pages(req, self.profile.page_tokens)
        local = self._switch.local_decode_ok()
        self._check_fits(req.request, req.prompt_tokens + (req.output_tokens if local else 0))
        self._prefill.submit(req)
        self._known.add(req.request)
        return self._effects(now)

    def submit_decode(self, req: DecodeRequest, now: float) -> Effects:
        """Accept a request whose prompt KV was transferred here; it joins the batch when its pages fit."""
        self._tick(now)
        self._switch.check_accepts(Phase.DECODE)
        self._check_new(req.request)
        validate_pages(req, self.profile.page_tokens)
        self._check_fits(req.request, req.prompt_tokens + req.output_tokens)
        self._decode.submit(req)
        self._known.add(req.request)
        return self._effects(now)

    def cancel_decode(self, request: str, now: float) -> Effects:
        """Drop a decode, queued or running, whose client went away: the full pages a running one filled are
        cached (as at its end), then its GPU pins and reserved slots are freed. `applied` is False when the node
        holds no such decode (finished or handed back)."""
        self._tick(now)
        if not self._decode.cancel(request, now):
            return Effects(self.pool.drain_events(), (), applied=False)
        return self._effects(now)

    def cancel_prefill(self, request: str, now: float) -> Effects:
        """Drop a prefill, queued or running, whose client went away: its host and GPU pins, reserved slots
        and unfinished fetch or load are released (pages it wrote stay cached), so the requests behind it
        are admitted. `applied` is False when the node holds no such prefill (finished or handed back); a
        fetch still in flight for it later completes with `applied` False."""
        self._tick(now)
        if not self._prefill.cancel(request, now):
            return Effects(self.pool.drain_events(), (), applied=False)
        return self._effects(now)

    def fetch_completed(self, request: str, now: float, failed: Iterable[PageHash] = ()) -> Effects:
        """Every fetch run of `request` has ended; the `failed` pages never arrived and are recomputed.
        `applied` is False if the engine no longer waits for it (the request was handed back, or its
        HiCache prefill already absorbed the fetch)."""
        self._tick(now)
        if request not in self._known:
            raise UnknownRequest(f"node {self.node}: fetch_completed for request {request!r}, never submitted here")
        if not self._prefill.fetch_completed(request, now, frozenset(failed)):
            return Effects(self.pool.drain_events(), (), applied=False)
        return self._effects(now)

    def fetch_expected(self, request: str, at: float) -> None:
        """The driver's current estimate of when the fetch of `request` lands (fetches share bandwidth, so it
        moves as others start and end); a HiCache prefill that starts before the fetch landed waits until
        then. Ignored when the engine no longer waits for that fetch."""
        self._prefill.fetch_expected(request, at)

    def set_load_bandwidth(self, bytes_per_s: float) -> None:
        """The host-to-GPU bandwidth loads get from now on (host memory shared with fetches, as the driver sees
        it; at most the profile's `load_bandwidth`). A load already under way keeps its time."""
        if not bytes_per_s > 0:
            raise ValueError(f"load bandwidth must be > 0 bytes/s, got {bytes_per_s}")
        self._prefill.load_bandwidth = min(bytes_per_s, self.profile.load_bandwidth)

    def set_counts(self, updates: Mapping[PageHash, int]) -> None:
        """Branch counts of this node's host pages, pushed by the directory (0 = no active branch)."""
        self.pool.set_counts(updates)

    def evict(self, tier: Tier, pages: int, now: float) -> Effects:
        """Evict up to `pages` unpinned pages of `tier` now (L1 pages are written back to L2 first)."""
        self._tick(now)
        if pages < 0:
            raise ValueError(f"pages to evict must be >= 0, got {pages}")
        self.pool.evict(tier, pages, now)
        return self._effects(now)

    def begin_switch(self, target: Phase, now: float) -> SwitchBegun:
        """Start switching to serve `target`: queued work of the old phase is handed back, running work
        finishes in place; the switch completes at once if nothing of the old phase runs."""
        self._tick(now)
        new = self._switch.begin(target, now)
        handed: list[PrefillRequest | DecodeRequest] = []
        if not serves(new, Phase.PREFILL):
            handed.extend(self._prefill.hand_back(now))
        if not serves(new, Phase.DECODE):
            handed.extend(self._decode.hand_back(now))
        self._switch.handed_back = len(handed)
        completed = self._maybe_complete_switch(now)
        self._after()
        return SwitchBegun(tuple(handed), self.pool.drain_events(), completed)

    # --- the loop ------------------------------------------------------------------------------------
    def step(self, now: float) -> StepOutput:
        """Run one iteration starting at `now`, or report idle (see the module docstring)."""
        self._tick(now)
        if now + _TIME_EPS < self._busy_until:
            raise EngineBusy(f"node {self.node}: step at {now} before the iteration ending at {self._busy_until}")
        decode, prefill, switch = self._decode, self._prefill, self._switch
        if not prefill.jobs and decode.quiet_next() and self._quiet_ok():
            return self._quiet_step(now)
        switched = self._maybe_complete_switch(now) if switch.draining else None
        decode.admit(now)
        fetches = prefill.admit(now, switch.local_decode_ok()) if prefill.jobs else ()
        kind = self._choose() if switch.ready_at is None else IterationKind.IDLE
        started: tuple[PrefillStarted, ...] = ()
        finished: list[PrefillFinished] = []
        decodes_done: list[DecodeFinished] = []
        tokens: dict[RequestId, int] = {}
        record: IterationRecord | None = None
        duration = stall = 0.0
        if kind is IterationKind.PREFILL:
            plan = prefill.plan(now, self._switch.local_decode_ok())
            if plan.chunks:
                stall = plan.stall
                duration = self._noisy(self.times.prefill(plan.items)) + stall
                end = now + duration
                for job, done in prefill.apply(plan, end):
                    finished.append(done)
                    if done.local_decode:
                        decode.adopt(job.req)
                        if job.req.output_tokens == 0:
                            decodes_done.append(decode.finish_empty(job.rid, end))
                started = tuple(plan.started)
                record = IterationRecord(self.node, Phase.PREFILL, now, duration, tuple(plan.items), 0)
            else:
                kind = IterationKind.DECODE if decode.has_running() else IterationKind.IDLE
        if kind is IterationKind.DECODE:
            batch = len(decode.running())
            context = decode.context_tokens()
            duration = self._noisy(self.times.decode(batch, context))
            tokens, decodes_done = decode.apply(now + duration, self.report_detail)
            record = IterationRecord(self.node, Phase.DECODE, now, duration, (), batch, context)
        end = now + duration
        if kind is not IterationKind.IDLE:
            self._busy_until = end
            self._last_kind = kind
        if switched is None and switch.draining:
            switched = self._maybe_complete_switch(end)
        if self.check:
            self.check_invariants()
        return StepOutput(  # (positional, in the field order: made once per iteration)
            now,
            kind,
            duration,
            record,
            self.pool.drain_events(),  # events
            tuple(fetches) if fetches else (),  # fetches_started
            started,  # prefills_started
            tuple(finished) if finished else (),  # prefills_finished
            tokens,  # decode_tokens
            tuple(decodes_done) if decodes_done else (),  # decodes_finished
            stall,  # load_stall
            switched,  # switch_completed
            self._wake_at() if kind is IterationKind.IDLE else None,  # wake_at
            self.gauges() if self.report_detail else None,  # gauges
        )

    def _quiet_ok(self) -> bool:
        """Whether nothing but the running decodes can act in the next step (no switch under way, no pending KV
        event, no per-step detail asked for): with no prefill and a quiet next decode iteration
        (`DecodeScheduler.quiet_next`), `step` is then `_quiet_step`."""
        switch = self._switch
        return (
            switch.ready_at is None
            and not switch.draining
            and not self.pool.has_events()
            and not self.report_detail
        )

    def _quiet_step(self, now: float) -> StepOutput:
        """A decode iteration in which nothing finishes and nothing is admitted: what `step`
        does for it (the same duration, record and state), without the general path's passes."""
        decode = self._decode
        batch = len(decode.running())
        context = decode.context_tokens()
        duration = self._noisy(self.times.decode(batch, context))
        decode.advance_quiet()
        self._busy_until = now + duration
        self._last_kind = IterationKind.DECODE
        record = IterationRecord(self.node, Phase.DECODE, now, duration, (), batch, context)
        if self.check:
            self.check_invariants()
        return StepOutput(now, IterationKind.DECODE, duration, record, (), (), (), (), {}, (), 0.0, None, None, None)

    # --- quiet runs (a driver in virtual time skips the events of quiet iterations) --------------------------
    def quiet_ahead(self, start: float, limit: int) -> list[float]:
        """The durations of the quiet decode iterations that would run one after the other from `start` if nothing
        came in (the iterations in which nothing finishes, `_quiet_step`), at most `limit`;
        empty if the next one is not quiet. Nothing changes but the noise draws, which are kept for the iterations
        that use them (`skip_quiet` or later steps), so the durations are the ones `step` would give."""
        decode = self._decode
        if self._prefill.jobs or not decode.quiet_next() or not self._quiet_ok():
            return []
        first = decode.iteration
        count = min(limit, decode.quiet_count())
        batch = len(decode.running())
        times, context_at = self.times, decode.context_at
        durations = [times.decode(batch, context_at(i)) for i in range(first, first + count)]
        if self.noise > 0 and self.rng is not None:
            factors = self._factors
            while len(factors) < count:
                factors.append(self._factor())
            durations = [d * f for d, f in zip(durations, factors)]  # (`_noisy`'s product, factor by factor)
        return durations

    def skip_quiet(self, starts: list[float], ends: list[float]) -> None:
        """Run the quiet iterations `quiet_ahead` gave, starting at `starts` and ending at `ends` (the first ones of
        them, in order): the state `step` would leave after them (their records are not made)."""
        k = len(starts)
        if not k:
            return
        if k != len(ends) or self._decode.quiet_count() < k:
            raise ValueError(f"node {self.node}: {k} quiet iterations asked, {self._decode.quiet_count()} ahead")
        self._tick(starts[-1])
        self._decode.advance_quiet(k)
        if self._factors:
            for _ in range(min(k, len(self._factors))):
                self._factors.popleft()
        self._busy_until = ends[-1]
        self._last_kind = IterationKind.DECODE

    def quiet_output(self, start: float, duration: float) -> StepOutput:
        """The output of a quiet decode iteration (as `_quiet_step` makes it, without its record)."""
        return StepOutput(start, IterationKind.DECODE, duration, None, (), (), (), (), {}, (), 0.0, None, None, None)

    def _choose(self) -> IterationKind:
        prefill = bool(self._prefill.jobs) and self._prefill.has_runnable()
        decode = self._decode.has_running()
        if prefill and decode:
            if self._switch.draining and Phase.DECODE in self._switch.old_phases():
                return IterationKind.DECODE  # switching to prefill: finish the decodes first, so the switch completes
            return IterationKind.DECODE if self._last_kind is IterationKind.PREFILL else IterationKind.PREFILL
        if prefill:
            return IterationKind.PREFILL
        return IterationKind.DECODE if decode else IterationKind.IDLE

    def _noisy(self, seconds: float) -> float:
        if self.noise <= 0 or self.rng is None:
            return seconds
        if self._factors:
            return seconds * self._factors.popleft()
        return seconds * self._factor()

    def _factor(self) -> float:
        """The next draw of the iteration-time noise (log-normal with mean 1)."""
        assert self.rng is not None
        return math.exp(self.rng.gauss(0.0, self.noise) - self.noise**2 / 2)

    # --- helpers -------------------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        if not -math.inf < now < math.inf:
            raise ValueError(f"node {self.node}: time must be a finite number of seconds, got {now}")
        last = self._now
        if now > last:
            self._now = now
        elif now + _TIME_EPS < last:
            raise TimeWentBackwards(f"node {self.node}: time {now} is earlier than {last}, passed before")

    def _check_new(self, request: str) -> None:
        if request in self._prefill.jobs or request in self._decode.jobs:
            raise DuplicateRequest(f"node {self.node} already holds request {request!r}")

    def _check_fits(self, request: str, tokens: int) -> None:
        need = pages_needed(tokens, self.profile.page_tokens)
        if need > self.pool.l1.capacity:
            raise RequestTooLarge(
                f"request {request!r} needs {need} GPU pages ({tokens} tokens) but node {self.node} "
                f"has {self.pool.l1.capacity} in all"
            )

    def _admit(self, now: float) -> list[FetchStarted]:
        self._decode.admit(now)
        if not self._prefill.jobs:
            return []
        return self._prefill.admit(now, self._switch.local_decode_ok())

    def _effects(self, now: float) -> Effects:
        fetches = self._admit(now)
        self._after()
        return Effects(self.pool.drain_events(), tuple(fetches))

    def _old_work_left(self) -> bool:
        old = self._switch.old_phases()
        if Phase.PREFILL in old and self._prefill.jobs:
            return True
        if Phase.DECODE in old:
            if self._decode.jobs or any(j.local_decode for j in self._prefill.running()):
                return True
        return False

    def _maybe_complete_switch(self, now: float) -> SwitchReport | None:
        """Complete the switch at `now` if its drain ended `switch_latency` ago; note the drain's end when it
        just ended."""
        sw = self._switch
        if not sw.draining:
            return None
        if sw.ready_at is None:
            if self._old_work_left():
                return None
            sw.ready_at = now + self.profile.switch_latency
        if now + _TIME_EPS < sw.ready_at:
            return None
        self.pool.release_l1(now)
        return sw.complete(now)

    def _wake_at(self) -> float | None:
        """When an idle node has something to do without new input: a load lands, or a switch completes."""
        load = self._prefill.wake_at()
        ready = self._switch.ready_at
        if ready is None:
            return load
        return ready if load is None else min(load, ready)

    def _after(self) -> None:
        if self.check:
            self.check_invariants()

    def check_invariants(self) -> None:
        """Raise `PoolInvariantError` naming the first rule that does not hold."""
        self.pool.check_invariants()
        live = set(self._prefill.jobs) | set(self._decode.jobs)
        for pool in (self.pool.l1, self.pool.l2):
            stray = pool.owners() - live
            if stray:
                raise PoolInvariantError(f"{pool.tier.value}: pins or slots held by requests not on the node: {stray}")
        pt = self.profile.page_tokens
        l1 = self.pool.l1
        footprints: list[tuple[str, int]] = [
            (j.rid, pages_needed(j.req.prompt_tokens + (j.req.output_tokens if j.footprint_output else 0), pt))
            for j in self._prefill.jobs.values()
            if j.gpu_admitted
        ]
        footprints += [
            (j.rid, pages_needed(j.prompt_tokens + j.output_tokens, pt)) for j in self._decode.running()
        ]
        for rid, want in footprints:
            held = len(l1.pinned_by(rid)) + len(l1.writes_of(rid)) + l1.reserved_by(rid)
            if held != want:
                raise PoolInvariantError(f"gpu: request {rid!r} holds {held} page slots, its footprint is {want}")
        for rid in set(self._decode.jobs) - {j.rid for j in self._decode.running()}:
            if rid in l1.owners():
                raise PoolInvariantError(f"gpu: queued decode request {rid!r} holds pages before admission")
