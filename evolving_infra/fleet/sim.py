"""A fleet in the simulator: one simulated cluster per partition, users bound by the global router's binding.

    partitions = load_partitions(["examples/fleet-d2/fleet-1of8.yaml"])
    workload = FleetWorkload.generated(FleetParams(), concurrency=3_840, seed=0)
    tasks = partition_tasks(partitions, workload, FleetOptions(duration_s=5_400))
    results = [run_partition(task) for task in tasks]  # or on any executor: `fleet.runs`

How a fleet run goes:

1. **Partitions** come from the AgentServingCluster objects a user applies (`fleet.partitions`): each one's node
   count, hardware profile, initial split, planner (mode, policy, window, slices, cooldown, bounds, warmup) and
   routing (prefill policy with its fetch model, decode binder, eviction) become one `SimConfig` through the
   same renderer the operator uses for the live router (`operator.rendered.chosen_policies`: the typed fields'
   settings with `planner.settings`, `routing.prefillSettings` and `routing.decodeSettings` over them). The data plane is ours (`evolving` preset: shared pool, async fetch, fitted models).
2. **Binding**: every task of the workload belongs to a user (its agent record's `user`, or the agent id when it
   has none, as the gateway falls back to the branch id) with optional `requires` labels; tasks are bound in file
   order with `fleet.binding.Binder` over the partitions' binding view (labels, GPUs as weight). A user keeps its
   partition for the whole run (users are never released in a run).
3. **Concurrency**: the fleet's concurrent agents (the trace header's `fleet.concurrency`, or `agents`) are
   split over the partitions in proportion to their GPUs; each partition replays its own tasks in file order in
   closed loop at its share. The replay follows the workload's schedule: a freed slot skips tasks whose `start_s`
   is more than one slice of the header's `fleet.schedule` in the past (`FleetOptions.skip_late_s` to set it,
   `follow_schedule=False` to start every task however late), and, where the header carries `fleet.mix` (the
   share of each workload label among a region's running agents over time), a freed slot goes to the label
   furthest below its share (`sim.replay.AgentMix`), so a partition's running mix is the schedule's from the
   first minute and moves when the schedule says, whatever each workload's tasks really last.
4. **Runs**: one `PartitionTask` per partition (picklable: the config, the tasks' records or, for a generated
   workload, only their slots, generated in the worker), executed by any `fleet.executors` executor. A task's
   result is a pure function of the task, so the fleet's result is the same for every executor and worker count,
   and equals running each partition alone with `sim.run.simulate` on the same bound trace (tested).

Each `PartitionResult` carries the run's metrics, a digest of every request record, and a time series in
buckets of `bucket_s` (requests issued and finished, uncached prompt and output tokens, prefill queueing sums,
the split at the bucket's end) from which `fleet.sim_report` builds the fleet's tables and figure.

Boundary: building and running partition simulations; running many of them (executors, stored results,
progress) is `fleet.runs`, printing is `fleet.sim_cli`.
"""

from __future__ import annotations

import hashlib
import json
import math
import resource
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from evolving_infra.fleet import progress as fleet_progress
from evolving_infra.fleet.binding import Binder, BindingError, Requirements
from evolving_infra.fleet.partitions import FleetPartition
from evolving_infra.operator.rendered import chosen_policies
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.records import RequestRecord, SplitRecord
from evolving_infra.sim.run import simulate
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.growing import GrowingTrace
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Trace
from evolving_infra.workloads.common import Record
from evolving_infra.workloads.dist import apportion
from evolving_infra.workloads.fleet import AgentSlot, FleetParams, agent_records, prefix_records

SYSTEM = "evolving"
"""The data plane every partition runs (the CR chooses planner and routing, not the engine's data plane)."""


class FleetRunError(ValueError):
    """A fleet run that cannot start: a task no partition admits, no concurrency given, a bad option."""


@dataclass(frozen=True)
class FleetOptions:
    """Run-wide settings; `None` means "as the partition's CR says"."""

    duration_s: float | None = None
    """Scored seconds after the warmup (None: until every partition's tasks have finished)."""
    warmup_s: float | None = None
    """Warmup of every partition (None: each CR's `planner.warmupSeconds`)."""
    planner: str | None = None
    """Run every partition with this planner instead of its CR's (e.g. `static`, the baseline of D.2)."""
    agents: int | None = None
    """The fleet's concurrent agents (None: the trace header's `fleet.concurrency`)."""
    follow_schedule: bool = True
    """Replay each partition's tasks on the workload's schedule: a freed slot skips tasks whose start is more than
    `skip_late_s` past (`SimConfig.skip_late_s`); False: every task, in file order, however late."""
    skip_late_s: float | None = None
    """How late a task may start (None: one slice of the trace header's `fleet.schedule`; no skipping without one)."""
    seed: int = 0
    bucket_s: float = 300.0
    """Width of the time-series buckets (s)."""
    drain_s: float | None = None
    keep_records: bool = False
    """Return every request record (tests; large fleets should not)."""

    def __post_init__(self) -> None:
        if self.duration_s is not None and not self.duration_s > 0:
            raise FleetRunError(f"duration must be > 0 s, got {self.duration_s}")
        if self.warmup_s is not None and self.warmup_s < 0:
            raise FleetRunError(f"warmup must be >= 0 s, got {self.warmup_s}")
        if self.agents is not None and self.agents < 1:
            raise FleetRunError(f"agents must be >= 1, got {self.agents}")
        if not self.bucket_s > 0:
            raise FleetRunError(f"bucket_s must be > 0, got {self.bucket_s}")
        if self.skip_late_s is not None and not (math.isfinite(self.skip_late_s) and self.skip_late_s >= 0):
            raise FleetRunError(f"skip_late_s must be a finite number >= 0, got {self.skip_late_s}")


@dataclass(frozen=True)
class FleetTask:
    """One task of the workload as the binder sees it."""

    agent: str
    user: str
    requires: Mapping[str, str]


@dataclass
class FleetWorkload:
    """The tasks of a fleet: either records (a trace file, in memory) or generated slots (records made per worker)."""

    header: Record | None
    prefixes: list[Record]
    tasks: list[FleetTask]
    records: dict[str, list[Record]] | None = None
    """Per agent, its records in file order (None for a generated workload)."""
    generator: tuple[FleetParams, dict[str, AgentSlot], int] | None = None
    """(params, slot per agent, seed) of a generated workload."""

    @property
    def concurrency(self) -> int | None:
        fleet = (self.header or {}).get("fleet")
        value = fleet.get("concurrency") if isinstance(fleet, dict) else None
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def slice_s(self) -> float | None:
        """One slice of the header's schedule (`fleet.span_s` over the schedule's steps), None without one."""
        fleet = (self.header or {}).get("fleet")
        if not isinstance(fleet, dict):
            return None
        span, schedule = fleet.get("span_s"), fleet.get("schedule")
        if not isinstance(span, int | float) or not span > 0 or not isinstance(schedule, dict) or not schedule:
            return None
        steps = {len(points) - 1 for points in schedule.values() if isinstance(points, list)}
        if len(steps) != 1 or min(steps) < 1:
            return None
        return float(span) / steps.pop()

    def mix_for(self, tasks: Sequence[FleetTask], opts: FleetOptions) -> tuple[dict[str, list[float]], float] | None:
        """The share of the running agents per workload label over time for a partition running `tasks` (the
        header's `fleet.mix` of their regions, averaged by task count where they come from several), and the step
        between its points: `(shares, step_s)`. None without a schedule to follow (`follow_schedule` off, no
        `fleet.mix`, or tasks of a region it does not name)."""
        fleet = (self.header or {}).get("fleet")
        step = self.slice_s
        if not opts.follow_schedule or not isinstance(fleet, dict) or step is None or not tasks:
            return None
        mix, label = fleet.get("mix"), fleet.get("region_label")
        if not isinstance(mix, dict) or not isinstance(label, str):
            return None
        counts: dict[str, int] = {}
        for task in tasks:
            region = task.requires.get(label)
            if region is None or region not in mix:
                return None
            counts[region] = counts.get(region, 0) + 1
        labels = sorted({lab for region in counts for lab in mix[region]})
        points = {len(v) for region in counts for v in mix[region].values()}
        if len(points) != 1:
            raise FleetRunError(f"the header's fleet.mix has schedules of different lengths: {sorted(points)}")
        n, total = points.pop(), len(tasks)
        if len(counts) == 1:
            (only,) = counts
            return {lab: [float(v) for v in mix[only][lab]] for lab in labels}, step
        shares = {lab: [sum(counts[r] * float(mix[r].get(lab, [0.0] * n)[i]) for r in counts) / total
                        for i in range(n)] for lab in labels}
        return shares, step

    def skip_late_s(self, opts: FleetOptions) -> float | None:
        """How late a task may start in this workload's replay under `opts` (None: every task starts)."""
        if not opts.follow_schedule:
            return None
        return opts.skip_late_s if opts.skip_late_s is not None else self.slice_s

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> FleetWorkload:
        """A fleet trace's records (a header is optional; agent records may carry `user` and `requires`)."""
        header: Record | None = None
        prefixes: list[Record] = []
        tasks: list[FleetTask] = []
        per_agent: dict[str, list[Record]] = {}
        branch_agent: dict[str, str] = {}
        for i, record in enumerate(records, start=1):
            kind = record.get("kind")
            if kind == "header":
                header = record
            elif kind == "prefix":
                prefixes.append(record)
            elif kind == "agent":
                agent = str(record["agent"])
                tasks.append(FleetTask(agent, str(record.get("user") or agent), _requires(record, i)))
                per_agent[agent] = [record]
            else:  # a request names its agent; a branch end belongs to its branch's agent
                agent = str(record["agent"]) if "agent" in record else branch_agent.get(str(record.get("branch")), "")
                if agent not in per_agent:
                    raise FleetRunError(f"record {i} ({kind}) belongs to no agent defined before it")
                if kind == "request":
                    branch_agent.setdefault(str(record.get("branch")), agent)
                per_agent[agent].append(record)
        return cls(header, prefixes, tasks, records=per_agent)

    @classmethod
    def generated(cls, params: FleetParams, concurrency: int, seed: int) -> FleetWorkload:
        """The `fleet` workload kind for `concurrency` agents (the tasks that fill the span: `tasks_for`), generated
        lazily: slots here, records in the partitions' workers; the same tasks as `generate_with("fleet",
        tasks_for(p, concurrency), seed, p)` with `p.concurrency = concurrency`."""
        from dataclasses import replace

        from evolving_infra.workloads.fleet import fleet_header, fleet_plan, tasks_for

        params = replace(params, concurrency=concurrency)
        agents = tasks_for(params, concurrency)
        slots = fleet_plan(params, agents, seed)
        tasks = [FleetTask(s.agent, s.user, s.requires) for s in slots]
        return cls(fleet_header(params, agents, seed, slots), prefix_records(params), tasks,
                   generator=(params, {s.agent: s for s in slots}, seed))


def _requires(record: Record, line: int) -> dict[str, str]:
    value = record.get("requires") or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise FleetRunError(f"record {line}: 'requires' must map label names to values, got {value!r}")
    return dict(value)


def bind_tasks(partitions: Sequence[FleetPartition], tasks: Sequence[FleetTask]) -> dict[str, str]:
    """Agent id -> partition key, binding each task's user in file order with the gateway's `Binder`."""
    binder = Binder([p.to_binding() for p in partitions])
    out: dict[str, str] = {}
    for task in tasks:
        requirements = Requirements({k: frozenset([v]) for k, v in task.requires.items()})
        try:
            out[task.agent] = binder.bind(task.user, requirements).partition
        except BindingError as exc:
            raise FleetRunError(f"agent {task.agent} (user {task.user}): {exc}") from None
    return out


def partition_concurrency(partitions: Sequence[FleetPartition], fleet_agents: int) -> dict[str, int]:
    """The fleet's concurrent agents split over the partitions in proportion to their GPUs (at least 1 each)."""
    if fleet_agents < len(partitions):
        raise FleetRunError(f"{fleet_agents} concurrent agents cannot fill {len(partitions)} partitions")
    shares = apportion(fleet_agents - len(partitions), [p.gpus for p in partitions])
    return {p.key: 1 + n for p, n in zip(partitions, shares, strict=True)}


def partition_config(p: FleetPartition, opts: FleetOptions, agents: int, skip_late_s: float | None = None,
                     mix: tuple[dict[str, list[float]], float] | None = None) -> SimConfig:
    """The simulator's config for one partition: its CR's nodes, profile, split, planner and routing; its tasks
    replayed in closed loop at `agents`, skipping those more than `skip_late_s` late (None: none skipped), holding
    the running agents' mix of workloads to `mix` (`(shares per label, step_s)`; None: file order alone)."""
    spec = p.spec
    chosen_planner, prefill, decode = chosen_policies(spec)  # the live router's settings, free-form ones included
    planner, settings = chosen_planner.name, chosen_planner.settings
    if opts.planner is not None and opts.planner != planner:
        planner = opts.planner
        settings = {"interval_s": float(spec.planner.window_seconds)} if planner == "static" else {}
    warmup = float(spec.planner.warmup_seconds) if opts.warmup_s is None else opts.warmup_s
    overrides: dict[str, Any] = {
        "nodes": spec.node_count,
        "split": f"{spec.initial_split.prefill}P{spec.initial_split.decode}D",
        "planner": planner, "planner_settings": settings,
        "prefill_routing": prefill.name, "routing_settings": prefill.settings,
        "decode_routing": decode.name, "decode_settings": decode.settings, "eviction": spec.eviction.policy.value,
        "agents": agents, "seed": opts.seed, "warmup_s": warmup, "duration_s": opts.duration_s,
        "drain_s": opts.drain_s,
    }
    if skip_late_s is not None:
        overrides["skip_late_s"] = skip_late_s
    if mix is not None:
        overrides["agent_mix"], overrides["agent_mix_step_s"] = mix
    if spec.engine.profile is not None:
        overrides["profile"] = spec.engine.profile
    if warmup == 0:
        overrides["models"] = "profile"
    try:
        return build_config(SYSTEM, **overrides)
    except ValueError as exc:
        raise FleetRunError(f"{p.source}: {p.name}: {exc}") from None


@dataclass(frozen=True)
class PartitionTask:
    """Everything one partition's run needs (picklable; sent to a worker process or a Ray task)."""

    key: str
    config: SimConfig
    prefixes: list[Record]
    records: list[Record] | None
    generator: tuple[FleetParams, list[AgentSlot], int] | None
    bucket_s: float
    keep_records: bool = False
    users: int = 0
    progress_path: str | None = None
    """Where the run reports how far it is (`fleet.progress`); watching never changes the result, so this is not
    part of the task's stored name."""

    def trace(self) -> Trace | GrowingTrace:
        """The partition's trace: whole, or growing agent by agent where it is generated and the loop closed."""
        source = f"fleet:{self.key}"
        if self.records is None and self.config.agents is not None:
            assert self.generator is not None
            params, slots, seed = self.generator
            return GrowingTrace(self._head(), lambda i: agent_records(params, slots[i], seed), len(slots),
                                source=source)  # fmt: skip
        records = self.trace_records()
        return trace_from_records(records, source=source)

    def _head(self) -> list[Record]:
        return [{"kind": "header", "version": 1, "name": f"fleet-partition-{self.key}"}, *self.prefixes]

    def trace_records(self) -> list[Record]:
        out = self._head()
        if self.records is not None:
            out.extend(self.records)
        else:
            assert self.generator is not None
            params, slots, seed = self.generator
            for slot in slots:
                out.extend(agent_records(params, slot, seed))
        return out


@dataclass
class PartitionResult:
    key: str
    nodes: int
    split: str
    planner: str
    concurrency: int
    trace_agents: int
    users: int
    metrics: dict[str, Any]
    records_sha256: str
    requests: int
    events: int
    sim_end_s: float
    wall_s: float
    peak_rss_mb: float
    series: list[dict[str, Any]]
    splits: list[tuple[float, int, int, int]]
    records: list[RequestRecord] | None = field(default=None, repr=False)

    def same_outcome(self) -> dict[str, Any]:
        """What must agree between executors (everything but wall time and memory)."""
        return {k: v for k, v in asdict(self).items() if k not in ("wall_s", "peak_rss_mb", "records")}


def run_partition(task: PartitionTask) -> PartitionResult:
    """Simulate one partition (in whatever process runs it). A generated partition in closed loop reads its
    agents as the replay starts them (`GrowingTrace`, the same trace as the whole one, less memory)."""
    trace = task.trace()
    start = time.perf_counter()
    if task.progress_path is None:
        result = simulate(task.config, trace)
    else:
        path = Path(task.progress_path)
        end = task.config.scored_end
        hook = fleet_progress.writer(path, None if end is None else end + task.config.drain_s)
        try:
            result = simulate(task.config, trace, progress=hook, progress_every=fleet_progress.EVERY)
        finally:
            fleet_progress.done(path)
    wall = time.perf_counter() - start
    digest = hashlib.sha256()
    for r in result.records:
        digest.update(json.dumps(asdict(r), sort_keys=True).encode())
        digest.update(b"\n")
    cfg = task.config
    return PartitionResult(
        key=task.key, nodes=cfg.nodes, split=cfg.split, planner=cfg.planner, concurrency=cfg.agents or 0,
        trace_agents=_agent_count(trace), users=task.users, metrics=result.metrics.to_dict(),
        records_sha256=digest.hexdigest(), requests=len(result.records), events=result.events,
        sim_end_s=result.end_time, wall_s=wall, peak_rss_mb=peak_rss_mb(),
        series=bucket_series(result.records, result.splits, task.bucket_s, result.end_time),
        splits=[(s.at, s.prefill, s.decode, s.collocated) for s in result.splits],
        records=list(result.records) if task.keep_records else None,
    )


def _agent_count(trace: Trace | GrowingTrace) -> int:
    return trace.agent_count if isinstance(trace, GrowingTrace) else len(trace.agents)


def peak_rss_mb() -> float:
    """This process's peak resident memory (MiB)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def bucket_series(records: Sequence[RequestRecord], splits: Sequence[SplitRecord], bucket_s: float,
                  end: float) -> list[dict[str, Any]]:
    """Per bucket `[t0, t1)`: counts and sums (never means) of the requests (`issued_by_workload`: requests issued
    per workload label), and the split at `t1`."""
    n = max(1, math.ceil(end / bucket_s))
    rows: list[dict[str, Any]] = [
        {"t0": i * bucket_s, "t1": (i + 1) * bucket_s, "issued": 0, "finished": 0, "prefills": 0,
         "uncached_tokens": 0, "output_tokens": 0, "queue_s_sum": 0.0, "issued_by_workload": {}}
        for i in range(n)
    ]

    def at(t: float) -> dict[str, Any]:
        return rows[min(n - 1, max(0, int(t // bucket_s)))]

    for r in records:
        issued = at(r.issued)
        issued["issued"] += 1
        issued["issued_by_workload"][r.workload] = issued["issued_by_workload"].get(r.workload, 0) + 1
        row = at(r.prefill_start)
        row["prefills"] += 1
        row["uncached_tokens"] += r.prompt_tokens - r.cached_tokens
        row["queue_s_sum"] += r.prefill_start - r.queued
        done = at(r.finish)
        done["finished"] += 1
        done["output_tokens"] += r.output_tokens
    ordered = sorted(splits, key=lambda s: s.at)
    j = 0
    current: SplitRecord | None = None
    for row in rows:
        while j < len(ordered) and ordered[j].at <= row["t1"]:
            current = ordered[j]
            j += 1
        row["prefill_nodes"] = current.prefill if current else None
        row["decode_nodes"] = current.decode if current else None
        row["collocated_nodes"] = current.collocated if current else None
    return rows


def partition_tasks(partitions: Sequence[FleetPartition], workload: FleetWorkload,
                    opts: FleetOptions) -> list[PartitionTask]:
    """The bound, configured task of every partition, in the order of `partitions`."""
    if not partitions:
        raise FleetRunError("a fleet needs at least one partition")
    agents = opts.agents or workload.concurrency
    if agents is None:
        raise FleetRunError("how many agents run at once? give agents (the trace has no fleet.concurrency header)")
    binding = bind_tasks(partitions, workload.tasks)
    concurrency = partition_concurrency(partitions, agents)
    users: dict[str, set[str]] = {p.key: set() for p in partitions}
    bound: dict[str, list[str]] = {p.key: [] for p in partitions}
    bound_tasks: dict[str, list[FleetTask]] = {p.key: [] for p in partitions}
    for task in workload.tasks:
        bound[binding[task.agent]].append(task.agent)
        bound_tasks[binding[task.agent]].append(task)
        users[binding[task.agent]].add(task.user)
    out: list[PartitionTask] = []
    for p in partitions:
        cfg = partition_config(p, opts, concurrency[p.key], workload.skip_late_s(opts),
                               workload.mix_for(bound_tasks[p.key], opts))
        if workload.records is not None:
            recs = [r for agent in bound[p.key] for r in workload.records[agent]]
            out.append(PartitionTask(p.key, cfg, workload.prefixes, recs, None, opts.bucket_s, opts.keep_records,
                                     len(users[p.key])))
        else:
            assert workload.generator is not None
            params, slots, seed = workload.generator
            gen = (params, [slots[a] for a in bound[p.key]], seed)
            out.append(PartitionTask(p.key, cfg, workload.prefixes, None, gen, opts.bucket_s, opts.keep_records,
                                     len(users[p.key])))
    return out


@dataclass
class FleetResult:
    options: FleetOptions
    partitions: list[PartitionResult]
    wall_s: float

    def same_outcome(self) -> list[dict[str, Any]]:
        return [p.same_outcome() for p in self.partitions]
