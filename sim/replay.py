"""The agent replayer: turns a trace into the requests to issue, as the requests before them complete.

Pure and clock-free, so the simulator (virtual time) and the live local cluster (wall clock) share it: the
driver reports `start(now)` and `completed(request_id, now)`, asks `next_wakeup()` when to call `due(now)`
next, and acts on the returned effects in order.

Semantics (trace format version 1):
- A request is issued once every request in its `after` has completed and then `delay_s` has passed; with
  empty `after`, `delay_s` counts from its agent's start.
- A branch with a `branch_end` ends when that record's `after` request completes; any other branch ends when
  its agent's last request completes. Each branch ends exactly once (`BranchEnded`).
- An agent finishes when all its requests have completed (an agent without requests finishes as it starts).
- Closed loop (`ReplayMode.closed_loop(n)`): `n` agents are active; when one finishes, the next agent in file
  order starts at that moment (`start_s` is ignored). The run thins out once the trace has no agent left.
  With `skip_late_s` (`ReplayMode.closed_loop(n, skip_late_s=w)`) the loop follows the trace's schedule: a freed
  slot skips every agent whose `start_s` is more than `w` before the time since `start` (such an agent never
  starts, issues nothing and counts in `skipped_agents`), so the mix of agents started stays where the schedule
  is even when agents last longer than the trace was laid out for. Agents due later than now still start at once
  (the loop never leaves a slot empty).
  With a `mix` (`ReplayMode.closed_loop(n, mix=AgentMix(...))`) the loop also holds the share of the active agents
  each workload label has to a schedule: a freed slot goes to the label furthest below its target share of `n`
  at that moment (ties: label name), which starts its next agent in file order (agents of other labels met on
  the way wait, in file order, for their label's turn). A label with no agent left yields the slot to the next; a
  label the mix does not name has target 0. So the running mix is the schedule's from the first fill, whatever
  the tasks of each label really last.
- Open loop (`ReplayMode.open_loop(...)`): agent `i` arrives at `t0 + start_s` (or `t0 + arrivals[i]`),
  where `t0` is the time given to `start`. With `max_active`, arrivals beyond the cap wait in a FIFO
  admission queue; the wait counts toward the latency of the agent's first requests: their `since` (the
  time latency is measured from) is `arrival + delay_s` while `at` is `start + delay_s`.

Invariant: every request is issued exactly once, at a time >= (completion of its last dependency, or its
agent's start) + `delay_s`; effects come out in order of `at`; `done` once every agent has finished (or was
skipped).

With a `StreamedPlan` (closed loop only) an agent's requests are taken from the plan when the agent starts and
forgotten when it finishes (the plan is told, so the trace can drop what it holds for the agent): memory follows
the active agents, not the trace. The effects are the same as with the whole plan; only a report about a request
of an agent not started yet or already finished names no state ("no such request").

Boundary: replay state only; effects are data, and the driver does the issuing.
"""

from __future__ import annotations

import enum
import heapq
import math
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.sim.replay_mix import AgentMix
from evolving_infra.sim.replay_plan import AgentSpec, PlanError, ReplayPlan, RequestSpec, StreamedPlan, TraceLike

__all__ = [
    "AgentFinished",
    "AgentMix",
    "AgentReplayer",
    "AgentStarted",
    "BranchEnded",
    "Effect",
    "IssueRequest",
    "PlanError",
    "ReplayError",
    "ReplayKind",
    "ReplayMode",
    "ReplayPlan",
    "RequestSpec",
    "StreamedPlan",
]


class ReplayKind(enum.Enum):
    CLOSED_LOOP = "closed-loop"
    OPEN_LOOP = "open-loop"


@dataclass(frozen=True, slots=True)
class ReplayMode:
    """How agents start. Build with `ReplayMode.closed_loop(n)` or `ReplayMode.open_loop(...)`."""

    kind: ReplayKind
    concurrency: int | None = None
    """Closed loop: agents kept active."""
    max_active: int | None = None
    """Open loop: cap on active agents (None: no cap, no admission queue)."""
    arrivals: tuple[float, ...] | None = None
    """Open loop: arrival offsets replacing each agent's `start_s`, in file order (e.g. Poisson arrivals)."""
    skip_late_s: float | None = None
    """Closed loop: skip agents whose `start_s` is more than this before now (None: start every agent)."""
    mix: AgentMix | None = None
    """Closed loop: the share of the active agents per workload label over time (None: file order alone)."""

    def __post_init__(self) -> None:
        if self.kind is ReplayKind.CLOSED_LOOP:
            if not _positive_int(self.concurrency):
                raise ValueError(f"closed-loop concurrency must be an int >= 1, got {self.concurrency!r}")
            if self.max_active is not None or self.arrivals is not None:
                raise ValueError("closed loop takes only a concurrency; max_active and arrivals are open-loop options")
            late = self.skip_late_s
            if late is not None and (isinstance(late, bool) or not isinstance(late, int | float)
                                     or not math.isfinite(late) or late < 0):  # fmt: skip
                raise ValueError(f"closed-loop skip_late_s must be None or a finite number >= 0 s, got {late!r}")
            if self.mix is not None and not isinstance(self.mix, AgentMix):
                raise ValueError(f"closed-loop mix must be an AgentMix or None, got {self.mix!r}")
            return
        if self.mix is not None:
            raise ValueError("mix is a closed-loop option; open loop starts agents at their start_s")
        if self.skip_late_s is not None:
            raise ValueError("skip_late_s is a closed-loop option; open loop starts agents at their start_s")
        if self.concurrency is not None:
            raise ValueError("open loop takes no concurrency; use max_active to cap active agents")
        if self.max_active is not None and not _positive_int(self.max_active):
            raise ValueError(f"open-loop max_active must be None or an int >= 1, got {self.max_active!r}")
        if self.arrivals is not None:
            bad = [t for t in self.arrivals if not math.isfinite(t) or t < 0]
            if bad:
                raise ValueError(f"open-loop arrivals must be finite and >= 0, got {bad[0]!r}")

    @staticmethod
    def closed_loop(concurrency: int, skip_late_s: float | None = None, mix: AgentMix | None = None) -> ReplayMode:
        """Keep `concurrency` agents active, replacing each finished one with the next in file order (with
        `skip_late_s`: the next whose `start_s` is at most that long ago; with `mix`: the next of the label
        furthest below its share)."""
        return ReplayMode(ReplayKind.CLOSED_LOOP, concurrency=concurrency, skip_late_s=skip_late_s, mix=mix)

    @staticmethod
    def open_loop(max_active: int | None = None, arrivals: Sequence[float] | None = None) -> ReplayMode:
        """Start agents at their `start_s` (or `arrivals`), at most `max_active` at once."""
        offsets = None if arrivals is None else tuple(float(t) for t in arrivals)
        return ReplayMode(ReplayKind.OPEN_LOOP, max_active=max_active, arrivals=offsets)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True, slots=True)
class IssueRequest:
    """Send `request` at `at`; its TTFT and E2E latency are measured from `since` (<= at)."""

    request: RequestSpec
    at: float
    since: float


@dataclass(frozen=True, slots=True)
class BranchEnded:
    branch: str
    agent: str
    at: float


@dataclass(frozen=True, slots=True)
class AgentStarted:
    """`agent` starts at `at`; it arrived at `arrived` (earlier only when it waited for admission)."""

    agent: str
    workload: str
    at: float
    arrived: float


@dataclass(frozen=True, slots=True)
class AgentFinished:
    agent: str
    workload: str
    at: float


Effect = IssueRequest | BranchEnded | AgentStarted | AgentFinished


class ReplayError(RuntimeError):
    """The driver broke the replay protocol (unknown request, double completion, time going back)."""


class _Timer(enum.IntEnum):
    ARRIVE = 0
    ISSUE = 1


class _Req(enum.IntEnum):
    WAITING = 0
    SCHEDULED = 1
    ISSUED = 2
    COMPLETED = 3


class _Run:
    """The replay state of one loaded agent, per request by its position in `agent.requests`: its `_Req` state,
    how many of its `after` have not completed, and its dependents (positions in file order, the slice
    `children[child_at[p]:child_at[p + 1]]`). A few bytes per request in arrays, where a dict entry per request
    and field, and a list per request, cost some 250 bytes; `specs` (request id -> spec) must hold the agent's
    requests when it is built."""

    __slots__ = ("agent", "child_at", "children", "first", "left", "missing", "state", "where")

    def __init__(self, agent: AgentSpec, specs: dict[str, RequestSpec]) -> None:
        reqs = agent.requests
        n = len(reqs)
        self.agent = agent
        self.left = n
        self.first = reqs[0].index if reqs else 0
        contiguous = all(spec.index == self.first + p for p, spec in enumerate(reqs))
        self.where: dict[int, int] | None = None if contiguous else {spec.index: p for p, spec in enumerate(reqs)}
        self.state = bytearray(n)  # every request WAITING
        self.missing = array("I", [len(spec.after) for spec in reqs])
        self.child_at = array("I", bytes(4 * (n + 1)))
        for spec in reqs:
            for dep in spec.after:
                self.child_at[self.pos(specs[dep].index) + 1] += 1
        for p in range(n):
            self.child_at[p + 1] += self.child_at[p]
        self.children = array("I", bytes(4 * self.child_at[n]))
        fill = self.child_at[:n]
        for p, spec in enumerate(reqs):
            for dep in spec.after:
                q = self.pos(specs[dep].index)
                self.children[fill[q]] = p
                fill[q] += 1

    def pos(self, index: int) -> int:
        """The position in `agent.requests` of the request with trace index `index`."""
        return index - self.first if self.where is None else self.where[index]


class AgentReplayer:
    """Replay state for one run over `trace` (a `Trace`, any `TraceLike`, a prepared `ReplayPlan`, or a
    `StreamedPlan` whose agents are taken as they start)."""

    def __init__(self, trace: TraceLike | ReplayPlan | StreamedPlan, mode: ReplayMode) -> None:
        plan = trace if isinstance(trace, ReplayPlan | StreamedPlan) else ReplayPlan.from_trace(trace)
        self._plan: ReplayPlan | StreamedPlan = plan
        self._streamed = isinstance(plan, StreamedPlan)
        self._mode = mode
        if self._streamed and mode.kind is not ReplayKind.CLOSED_LOOP:
            raise ValueError("a streamed plan replays in closed loop only; open loop needs every agent's start_s")
        count = plan.agent_count
        if mode.kind is ReplayKind.OPEN_LOOP and mode.arrivals is not None and len(mode.arrivals) != count:
            raise ValueError(
                f"open-loop arrivals give {len(mode.arrivals)} times for {count} agents; give one per agent"
            )
        self._now = -math.inf
        self._t0 = 0.0
        """The time given to `start` (the origin of `start_s`)."""
        self._started_run = False
        self._timers: list[tuple[float, int, int, _Timer, str]] = []
        self._seq = 0
        self._specs: dict[str, RequestSpec] = {}
        """Request id -> spec, for the loaded agents' requests."""
        self._runs: dict[str, _Run] = {}
        """Agent id -> its replay state (loaded agents)."""
        self._ends_on: dict[str, list[str]] = {}
        self._ended: set[str] = set()
        self._arrived: dict[str, float] = {}
        self._active: set[str] = set()
        self._admission: deque[str] = deque()
        self._admitted: list[tuple[float, float]] = []
        """Open loop: (arrival, start) of every agent started, in start order (appendix D.3's admission)."""
        self._next_agent = 0
        self._waiting: dict[str, deque[AgentSpec]] = {}
        """Closed loop with a mix: agents passed over in file order, per label, until their label's turn."""
        self._active_by_label: dict[str, int] = {}
        self._finished = 0
        self._skipped = 0
        self._issued = 0
        self._in_flight = 0
        self._to_arrive = 0
        if isinstance(plan, ReplayPlan):
            for agent in plan.agents:
                self._load(agent)

    def _load(self, agent: AgentSpec) -> None:
        """Take agent's requests into the replay state (all agents at once for a whole plan)."""
        for spec in agent.requests:
            self._specs[spec.id] = spec
        self._runs[agent.agent] = _Run(agent, self._specs)
        for branch, rid in agent.branch_end_after.items():
            self._ends_on.setdefault(rid, []).append(branch)

    def _unload(self, agent: AgentSpec) -> None:
        """Forget a finished agent (streamed plans only) and tell the plan."""
        for spec in agent.requests:
            del self._specs[spec.id]
            self._ends_on.pop(spec.id, None)
        self._ended.difference_update(agent.branches)
        del self._runs[agent.agent], self._arrived[agent.agent]
        self._plan.release(agent.index)

    # -- read-only state ---------------------------------------------------------------------------------
    @property
    def plan(self) -> ReplayPlan | StreamedPlan:
        return self._plan

    @property
    def mode(self) -> ReplayMode:
        return self._mode

    @property
    def done(self) -> bool:
        """Every agent of the trace has finished."""
        return self._started_run and self._finished + self._skipped == self._plan.agent_count

    @property
    def active_agents(self) -> int:
        return len(self._active)

    @property
    def waiting_agents(self) -> int:
        """Open loop: agents that arrived and wait for admission."""
        return len(self._admission)

    def admissions(self) -> tuple[list[tuple[float, float]], list[float]]:
        """Open loop: (arrival, start) of every agent started so far, and the arrival times of the agents still
        waiting for admission, longest-waiting first (closed loop: both empty)."""
        return list(self._admitted), [self._arrived[agent] for agent in self._admission]

    @property
    def finished_agents(self) -> int:
        return self._finished

    @property
    def skipped_agents(self) -> int:
        """Closed loop with `skip_late_s`: agents never started because their time had passed."""
        return self._skipped

    @property
    def issued_requests(self) -> int:
        return self._issued

    @property
    def in_flight(self) -> int:
        """Requests issued and not yet completed."""
        return self._in_flight

    @property
    def exhausted(self) -> bool:
        """No agent is left to start (closed loop) or to arrive (open loop): from here on, active agents
        only decrease."""
        if self._mode.kind is ReplayKind.CLOSED_LOOP:
            return self._next_agent >= self._plan.agent_count and not any(self._waiting.values())
        return self._started_run and self._to_arrive == 0 and not self._admission

    def next_wakeup(self) -> float | None:
        """When `due` next has something to release (None: nothing until a request completes)."""
        return self._timers[0][0] if self._timers else None

    # -- driver calls ------------------------------------------------------------------------------------
    def start(self, now: float) -> list[Effect]:
        """Begin the run at `now` (the time origin of open-loop arrivals)."""
        if self._started_run:
            raise ReplayError("start() was already called for this replayer")
        now = self._advance(now)
        self._started_run = True
        self._t0 = now
        out: list[Effect] = []
        if self._mode.kind is ReplayKind.CLOSED_LOOP:
            self._fill(now, out)
        else:
            assert isinstance(self._plan, ReplayPlan)  # open loop takes a whole plan (checked when built)
            for agent in self._plan.agents:
                offset = agent.start_s if self._mode.arrivals is None else self._mode.arrivals[agent.index]
                self._push(now + offset, _Timer.ARRIVE, agent.agent)
            self._to_arrive = len(self._plan.agents)
        self._drain(now, out)
        return out

    def completed(self, request_id: str, now: float) -> list[Effect]:
        """Request `request_id` completed at `now`; returns every effect due by `now`, in order."""
        self._require_started()
        spec = self._specs.get(request_id)
        if spec is None:
            raise ReplayError(f"completed({request_id!r}): no such request in the trace")
        run = self._runs[spec.agent]
        p = run.pos(spec.index)
        if run.state[p] != _Req.ISSUED:
            state = _Req(run.state[p]).name.lower()
            raise ReplayError(f"completed({request_id!r}): the request is {state}; only issued requests complete")
        now = self._advance(now)
        out: list[Effect] = []
        self._drain(now, out)
        run.state[p] = _Req.COMPLETED
        self._in_flight -= 1
        for branch in self._ends_on.get(request_id, ()):
            self._end_branch(branch, spec.agent, now, out)
        missing = run.missing
        for k in range(run.child_at[p], run.child_at[p + 1]):
            child = run.children[k]
            missing[child] -= 1
            if missing[child] == 0:
                self._schedule_issue(run, child, now)
        run.left -= 1
        if run.left == 0:
            self._finish(run.agent, now, out)
            self._fill(now, out)
        self._drain(now, out)
        return out

    def due(self, now: float) -> list[Effect]:
        """Effects whose time has come by `now` (issues after delays, open-loop arrivals), in order."""
        self._require_started()
        now = self._advance(now)
        out: list[Effect] = []
        self._drain(now, out)
        return out

    # -- internals ---------------------------------------------------------------------------------------
    def _advance(self, now: float) -> float:
        now = float(now)
        if not math.isfinite(now):
            raise ReplayError(f"time must be finite, got {now!r}")
        if now < self._now:
            raise ReplayError(f"time went backwards: {now} after {self._now}")
        self._now = now
        return now

    def _require_started(self) -> None:
        if not self._started_run:
            raise ReplayError("call start(now) before reporting completions or asking for due effects")

    def _push(self, at: float, kind: _Timer, key: str) -> None:
        heapq.heappush(self._timers, (at, int(kind), self._seq, kind, key))
        self._seq += 1

    def _drain(self, now: float, out: list[Effect]) -> None:
        while self._timers and self._timers[0][0] <= now:
            at, _, _, kind, key = heapq.heappop(self._timers)
            if kind is _Timer.ISSUE:
                spec = self._specs[key]
                run = self._runs[spec.agent]
                run.state[run.pos(spec.index)] = _Req.ISSUED
                self._issued += 1
                self._in_flight += 1
                # Root requests of an agent that waited for admission count latency from its arrival.
                since = self._arrived[spec.agent] + spec.delay_s if not spec.after else at
                out.append(IssueRequest(request=spec, at=at, since=since))
            else:
                self._arrive(self._runs[key].agent, at, out)

    def _arrive(self, agent: AgentSpec, at: float, out: list[Effect]) -> None:
        self._arrived[agent.agent] = at
        self._to_arrive -= 1
        self._admission.append(agent.agent)
        self._fill(at, out)

    def _fill(self, at: float, out: list[Effect]) -> None:
        """Start agents while there is room: the next in file order (closed loop) or the longest-waiting
        arrival (open loop). Agents without requests finish at once and free their slot again."""
        if self._mode.kind is ReplayKind.CLOSED_LOOP:
            assert self._mode.concurrency is not None
            if self._mode.mix is not None:
                self._fill_mix(self._mode.mix, self._mode.concurrency, at, out)
                return
            while len(self._active) < self._mode.concurrency and not self.exhausted:
                agent = self._plan.agent(self._next_agent)
                self._next_agent += 1
                if self._too_late(agent, at):
                    self._skip(agent)
                    continue
                if self._streamed:
                    self._load(agent)
                self._arrived[agent.agent] = at
                self._start_agent(agent, at, out)
        else:
            cap = self._mode.max_active
            while self._admission and (cap is None or len(self._active) < cap):
                agent = self._runs[self._admission.popleft()].agent
                self._admitted.append((self._arrived[agent.agent], at))
                self._start_agent(agent, at, out)

    def _fill_mix(self, mix: AgentMix, n: int, at: float, out: list[Effect]) -> None:
        """Closed loop with a mix: each free slot to the label furthest below its target share (ties: name)."""
        targets = mix.at(at - self._t0)
        while len(self._active) < n:
            tried: set[str] = set()
            agent: AgentSpec | None = None
            while agent is None:
                labels = (set(targets) | set(self._waiting) | set(self._active_by_label)) - tried
                if not labels:  # every label known is out of agents, so the whole file was read: none is left
                    return
                label = min(labels, key=lambda lab: (self._active_by_label.get(lab, 0) - targets.get(lab, 0.0) * n,
                                                     lab))
                tried.add(label)
                agent = self._take(label, at)
            if self._streamed:
                self._load(agent)
            self._arrived[agent.agent] = at
            self._start_agent(agent, at, out)

    def _take(self, label: str, at: float) -> AgentSpec | None:
        """The next agent of `label` not too late to start, passing over (and keeping, per label) the agents of
        other labels on the way; None when none is left (the whole file has then been read)."""
        queue = self._waiting.get(label)
        while queue:
            agent = queue.popleft()
            if self._too_late(agent, at):
                self._skip(agent)
                continue
            return agent
        while self._next_agent < self._plan.agent_count:
            agent = self._plan.agent(self._next_agent)
            self._next_agent += 1
            if self._too_late(agent, at):
                self._skip(agent)
            elif agent.workload == label:
                return agent
            else:
                self._waiting.setdefault(agent.workload, deque()).append(agent)
        return None

    def _too_late(self, agent: AgentSpec, at: float) -> bool:
        """Closed loop with `skip_late_s`: `agent` was due more than that long before `at`."""
        late = self._mode.skip_late_s
        return late is not None and agent.start_s + late < at - self._t0

    def _skip(self, agent: AgentSpec) -> None:
        """An agent never started: counted, and forgotten by a streamed plan."""
        self._skipped += 1
        if self._streamed:
            self._plan.release(agent.index)

    def _start_agent(self, agent: AgentSpec, at: float, out: list[Effect]) -> None:
        self._active.add(agent.agent)
        self._active_by_label[agent.workload] = self._active_by_label.get(agent.workload, 0) + 1
        out.append(AgentStarted(agent.agent, agent.workload, at, self._arrived[agent.agent]))
        if not agent.requests:
            self._finish(agent, at, out)
            return
        run = self._runs[agent.agent]
        for p, spec in enumerate(agent.requests):
            if not spec.after:
                self._schedule_issue(run, p, at)

    def _schedule_issue(self, run: _Run, p: int, ready: float) -> None:
        spec = run.agent.requests[p]
        run.state[p] = _Req.SCHEDULED
        self._push(ready + spec.delay_s, _Timer.ISSUE, spec.id)

    def _end_branch(self, branch: str, agent: str, at: float, out: list[Effect]) -> None:
        if branch not in self._ended:
            self._ended.add(branch)
            out.append(BranchEnded(branch, agent, at))

    def _finish(self, agent: AgentSpec, at: float, out: list[Effect]) -> None:
        for branch in agent.branches:
            self._end_branch(branch, agent.agent, at, out)
        self._active.discard(agent.agent)
        self._active_by_label[agent.workload] -= 1
        self._finished += 1
        out.append(AgentFinished(agent.agent, agent.workload, at))
        if self._streamed:
            self._unload(agent)
