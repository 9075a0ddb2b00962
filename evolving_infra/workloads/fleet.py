"""The fleet workload of appendix D.2: users of two coding-agent workloads in regions, with local shifts.

A fleet trace is an ordinary trace (format version 1) whose agent records carry two extra keys, ignored by every
other reader: `user` (the user the task belongs to; a global router binds users, not tasks) and `requires` (the
partition labels the user is constrained to, here its region). Two workloads share the fleet:

- `cc`: the CC generator (`workloads.cc`) with shorter tasks, so that agents turn over within the compressed span,
  each resuming a long session, so that a short task keeps table D.4's per-request prefill load (without the
  compactions that carry much of it in the cc kind's long tasks);
- `codex`: the same generator with a decode-heavier shape (shorter prompts, smaller tool results, longer outputs),
  standing in for the paper's Codex traces (assumption: the paper gives no Codex figures).

Each region is served by some number of partitions and has a schedule of its CC share among running agents: flat,
then a linear move from `cc_share_start` to `cc_share_end` between `shift_start` and `shift_end` (fractions of the
span), then flat. With the defaults one region's partition moves towards CC while another's moves away from it, so
the fleet's aggregate mix stays constant while those two partitions see a local shift (figure D.2).

`agents` is the number of tasks, as for every kind; they are apportioned over the regions' slices by the demand
of the fleet's concurrency (`concurrency`, e.g. 3,840 at 1/8 scale: ~10 per GPU; unset, the concurrency that
`agents` tasks keep busy for `span_s` at the estimated task durations), plus a tail at the final mix.
`tasks_for(params, concurrency)` is the number of tasks that fills the span. Within each region, the agents are in
file order of the schedule: replaying a partition's agents in file order at its concurrency follows the shift as
long as tasks last about their estimate; skipping tasks whose slice has passed (`sim.replay`'s `skip_late_s`, one
slice) follows it whatever the tasks' real durations; and the header's `fleet.mix` (each region's share of every
workload among its running agents, per slice) lets a replay hold the running mix to the schedule
(`sim.replay.AgentMix`: a freed slot goes to the workload furthest below its share), so a partition serves the
scheduled mix from the first minute even though the two workloads' tasks do not last their estimates equally
(`simulate --fleet` does both).

Boundary: pure generation (seeded `random.Random` streams per agent), like the other kinds; binding users to
partitions and simulating them is `evolving_infra.fleet`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from evolving_infra.workloads import cc
from evolving_infra.workloads.cc import CCParams
from evolving_infra.workloads.common import Record, agent_rng
from evolving_infra.workloads.dist import LogNormal, apportion, interleave
from evolving_infra.workloads.params import param

LABELS = ("cc", "codex")
REGION_LABEL = "evolving-infra.io/region"
"""The partition label a fleet user's region constrains (`requires` of its agent records)."""

_CC_FLEET = CCParams(
    first_prompt_tokens=LogNormal(100_000, 0.5, lo=2_000, hi=185_000),
    main_steps=LogNormal(30, 0.7, lo=2, hi=150),
)
_CODEX = CCParams(
    first_prompt_tokens=LogNormal(8_000, 0.8, lo=50, hi=60_000),
    main_steps=LogNormal(30, 0.7, lo=2, hi=150),
    tool_result_tokens=LogNormal(500, 1.0, lo=10, hi=20_000),
    output_tokens=LogNormal(2_500, 0.8, lo=20, hi=16_000),
    subagent_call_prob=0.004,
)


@dataclass(frozen=True)
class Region:
    """A group of users constrained to the partitions labelled with its name, and its CC share over time."""

    name: str
    partitions: int
    cc_share_start: float
    cc_share_end: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a region needs a name")
        if self.partitions < 1:
            raise ValueError(f"region {self.name!r}: partitions must be >= 1, got {self.partitions}")
        for name in ("cc_share_start", "cc_share_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"region {self.name!r}: {name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class FleetParams:
    """The D.2 fleet: regions of partitions, two workloads, the span the local shifts are compressed into."""

    cc: CCParams = param(_CC_FLEET, "the cc kind with 30 main-branch steps per task (assumption: tasks of "
                            "~15 minutes, so agents turn over several times in the compressed span) that resume a "
                            "long session (first prompts of mean 100K tokens, hi 185K), calibrated against table "
                            "D.4: a 30-step task never reaches the compaction bound, whose restores carry most of "
                            "the cc kind's new tokens, so with the cc kind's 30K first prompts the fleet's CC carried "
                            "~2.3K new tokens per request at ~100K-token prompts; resumed, ~5.2K at ~143K (the cc "
                            "kind ~4.1K at ~146K; D.4 7,660 uncached at ~150K)")
    codex: CCParams = param(_CODEX, "assumption: a decode-heavier coding agent (8K first prompts, 500-token tool "
                               "results, 2,500-token outputs, few sub-agents) for the paper's Codex traces")
    regions: tuple[Region, ...] = param(
        (Region("main", 6, 0.5, 0.5), Region("east", 1, 0.2, 0.8), Region("west", 1, 0.8, 0.2)),
        "appendix D.2: 8 partitions, of which 2 see a local shift while the aggregate stays nearly constant "
        "(assumption: the two shifts mirror each other; the other six serve a steady half-and-half mix)",
    )
    span_s: float = param(7_200.0, "assumption: appendix D.2's shifts over 24 hours compressed into 2 simulated hours")
    shift_start: float = param(0.3, "assumption: the shift starts at 30 % of the span (after a warmup)")
    shift_end: float = param(0.7, "assumption: and ends at 70 %")
    slices: int = param(16, "assumption: the schedule is laid out in this many equal slices of the span")
    task_estimate_s: dict[str, float] = param(
        {"cc": 900.0, "codex": 1_100.0},
        "assumption: mean task duration (30 steps x (E2E + pause)), used only to size each slice's block of tasks",
    )
    concurrency: int | None = param(
        None, "assumption: the fleet's concurrent agents (appendix D.2: ~10 per GPU); None: as many as the trace's "
        "tasks keep busy for the span at the estimated task durations")
    tail: float = param(0.5, "assumption: extra tasks at the final mix, as a fraction of the span's, so replay "
                        "never runs out")
    staggered_start: bool = param(
        True, "assumption: the fleet is met in its steady state, so the tasks running at the start (the first ones "
        "of each region, as many as its concurrency) are met part-way through, at a uniform fraction of their "
        "steps (their earlier steps' tokens in their first prompt), and end at staggered times; False: every agent "
        "starts a task from its first step at once (a cold start, whose contexts grow for the first task's length)")
    arrival_rate_per_min: float = param(1.0, "assumption (unused: closed-loop replay; start_s follows the schedule)")

    def __post_init__(self) -> None:
        if not self.regions:
            raise ValueError("a fleet needs at least one region")
        if len({r.name for r in self.regions}) != len(self.regions):
            raise ValueError("region names must be unique")
        if not self.span_s > 0:
            raise ValueError(f"span_s must be > 0, got {self.span_s}")
        if not 0.0 <= self.shift_start <= self.shift_end <= 1.0:
            raise ValueError("need 0 <= shift_start <= shift_end <= 1")
        if self.slices < 1:
            raise ValueError(f"slices must be >= 1, got {self.slices}")
        for label in LABELS:
            if not self.task_estimate_s.get(label, 0.0) > 0:
                raise ValueError(f"task_estimate_s needs a value > 0 for {label!r}")
        if self.tail < 0:
            raise ValueError(f"tail must be >= 0, got {self.tail}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def partitions(self) -> int:
        return sum(r.partitions for r in self.regions)

    def cc_share(self, region: Region, at_fraction: float) -> float:
        """The region's CC share among running agents at a fraction of the span."""
        if self.shift_end <= self.shift_start:
            return region.cc_share_end if at_fraction >= self.shift_start else region.cc_share_start
        x = min(1.0, max(0.0, (at_fraction - self.shift_start) / (self.shift_end - self.shift_start)))
        return region.cc_share_start + x * (region.cc_share_end - region.cc_share_start)

    def region_concurrency(self, concurrency: int) -> list[int]:
        """Concurrency per region, proportional to its partitions."""
        return apportion(concurrency, [r.partitions for r in self.regions])

    def params_of(self, label: str) -> CCParams:
        return self.cc if label == "cc" else self.codex


@dataclass(frozen=True)
class AgentSlot:
    """One task of the fleet trace before its requests are generated (cheap to bind and to split)."""

    index: int
    region: str
    label: str
    user: str
    start_s: float
    age: float = 0.0
    """How far into its main-branch steps the task is met (0: from its start; `cc.cc_agent`'s `age`)."""

    @property
    def agent(self) -> str:
        return f"a{self.index}"

    @property
    def requires(self) -> dict[str, str]:
        return {REGION_LABEL: self.region}


def _blocks(p: FleetParams) -> list[tuple[int, float, float, str, float]]:
    """`(region index, start_s, span_s, label, demand)` per block and label, in file order; demand is in tasks
    per agent of fleet concurrency (the agents running at t=0 at the first slice's mix, then each slice's
    replacements at its mix, then the tail at the final mix)."""
    width = p.span_s / p.slices
    total = float(p.partitions)
    out: list[tuple[int, float, float, str, float]] = []
    for k, region in enumerate(p.regions):
        weight = region.partitions / total
        for i in range(p.slices):
            share = p.cc_share(region, (i + 0.5) / p.slices)
            for label, part in (("cc", share), ("codex", 1.0 - share)):
                demand = weight * part * width / p.task_estimate_s[label] + (weight * part if i == 0 else 0.0)
                out.append((k, i * width, width, label, demand))
        share = p.cc_share(region, 1.0)
        tail_s = p.tail * p.span_s
        if tail_s > 0:
            for label, part in (("cc", share), ("codex", 1.0 - share)):
                out.append((k, p.span_s, tail_s, label, weight * part * tail_s / p.task_estimate_s[label]))
    return out


def tasks_per_agent(p: FleetParams) -> float:
    """Tasks the trace needs per agent of fleet concurrency to keep the span busy (at the estimated durations)."""
    return sum(b[4] for b in _blocks(p))


def tasks_for(p: FleetParams, concurrency: int) -> int:
    """Tasks that keep `concurrency` agents busy for the span (what `simulate --fleet --workload fleet` generates)."""
    return max(1, math.ceil(concurrency * tasks_per_agent(p)))


def fleet_concurrency(p: FleetParams, agents: int) -> int:
    """The fleet's concurrency for a trace of `agents` tasks: `p.concurrency`, or what `agents` tasks keep busy."""
    if p.concurrency is not None:
        return p.concurrency
    return max(1, math.floor(agents / tasks_per_agent(p)))


def fleet_plan(p: FleetParams, agents: int, seed: int) -> list[AgentSlot]:
    """Every one of the `agents` tasks in file order (of start time): per region, block by block, labels
    interleaved; the tasks are apportioned over the blocks by their demand (largest remainder)."""
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    blocks = _blocks(p)
    counts = apportion(agents, [b[4] for b in blocks])
    conc = fleet_concurrency(p, agents)
    region_conc = p.region_concurrency(conc) if conc >= 1 else [0] * len(p.regions)
    users = random.Random(f"evolving-infra/{seed}/fleet/users")
    slots: list[AgentSlot] = []
    grouped: dict[tuple[int, float], dict[str, int]] = {}
    spans: dict[tuple[int, float], float] = {}
    for (k, start, span, label, _), n in zip(blocks, counts, strict=True):
        grouped.setdefault((k, start), {})[label] = n
        spans[(k, start)] = span
    for k, region in enumerate(p.regions):
        mid = p.cc_share(region, 0.5)
        pools = {"cc": max(1, round(region_conc[k] * mid)), "codex": max(1, round(region_conc[k] * (1 - mid)))}
        times = random.Random(f"evolving-infra/{seed}/fleet/{region.name}/times")
        ages = random.Random(f"evolving-infra/{seed}/fleet/{region.name}/ages")
        running = region_conc[k] if p.staggered_start else 0
        for (kk, start), block in grouped.items():
            if kk != k:
                continue
            labels = interleave({lab: n for lab, n in block.items() if n > 0}) if any(block.values()) else []
            starts = sorted(start + times.random() * spans[(kk, start)] for _ in labels)
            for label, start_s in zip(labels, starts, strict=True):
                user = f"{region.name}.{label}.u{users.randrange(pools[label])}"
                age = round(ages.random(), 4) % 1.0 if running > 0 else 0.0
                running -= 1
                slots.append(AgentSlot(len(slots), region.name, label, user, round(start_s, 3), age))
    # One file order for the fleet, by start time (each region's tasks keep their order within it).
    ordered = sorted(slots, key=lambda s: (s.start_s, s.index))
    return [AgentSlot(i, s.region, s.label, s.user, s.start_s, s.age) for i, s in enumerate(ordered)]


def prefix_records(p: FleetParams) -> list[Record]:
    """The shared prefixes of both workloads (each workload's own system prompt)."""
    out: list[Record] = []
    for label in LABELS:
        for name, tokens in cc.prefixes(p.params_of(label)).items():
            out.append({"kind": "prefix", "name": _prefix_name(label, name), "tokens": tokens})
    return out


def agent_records(p: FleetParams, slot: AgentSlot, seed: int) -> list[Record]:
    """One task's records (its agent record carries `user` and `requires`); the same for the same slot and seed."""
    records = cc.cc_agent(p.params_of(slot.label), agent_rng(seed, f"fleet/{slot.label}", slot.index), slot.agent,
                          slot.start_s, slot.label, slot.age)
    for record in records:
        if record["kind"] == "agent":
            record["user"] = slot.user
            record["requires"] = slot.requires
        elif record["kind"] == "request":
            source = record["input"]
            if isinstance(source, dict) and isinstance(source.get("shared"), str):
                record["input"] = {**source, "shared": _prefix_name(slot.label, source["shared"])}
    return records


def _prefix_name(label: str, name: str) -> str:
    """`cc:system` stays; the codex workload's prefixes are its own (`codex:system`)."""
    return name if label == "cc" else name.replace("cc:", f"{label}:", 1)


def fleet_header(p: FleetParams, agents: int, seed: int, slots: list[AgentSlot]) -> Record:
    from evolving_infra.workloads.params import to_jsonable

    concurrency = fleet_concurrency(p, agents)
    per_region = dict(zip((r.name for r in p.regions), p.region_concurrency(concurrency), strict=True))
    return {
        "kind": "header",
        "version": 1,
        "name": f"fleet-synthetic-{agents}-seed{seed}",
        "source": f"evolving_infra.workloads.generate(kind='fleet', agents={agents}, seed={seed})",
        "notes": (
            f"Fleet workload (appendix D.2): {agents} tasks for {concurrency} concurrent agents in {len(p.regions)} "
            f"regions ({', '.join(f'{r.name}: {r.partitions} partitions' for r in p.regions)}), CC-like and "
            f"codex-like tasks. Agent records carry 'user' and 'requires' (partition labels, key {REGION_LABEL!r}). "
            "Replay each partition's agents in file order in closed loop at its share of the fleet concurrency "
            "(fleet.concurrency), skipping agents whose start_s is more than one slice of fleet.schedule past "
            "when a slot frees, and giving a freed slot to the workload furthest below its share of the running "
            "agents in the region's fleet.mix (fleet.schedule: the cc share alone), to follow the regions' mix "
            "over time whatever the tasks really last."
        ),
        "fleet": {
            "concurrency": concurrency,
            "region_concurrency": per_region,
            "span_s": p.span_s,
            "schedule": {r.name: [round(p.cc_share(r, i / p.slices), 4) for i in range(p.slices + 1)]
                         for r in p.regions},
            "mix": {r.name: {"cc": [round(p.cc_share(r, i / p.slices), 4) for i in range(p.slices + 1)],
                             "codex": [round(1.0 - round(p.cc_share(r, i / p.slices), 4), 4)
                                       for i in range(p.slices + 1)]}
                    for r in p.regions},
            "region_label": REGION_LABEL,
        },
        "generator": {"kind": "fleet", "agents": agents, "seed": seed, "params": to_jsonable(p)},
    }


def generate_fleet(p: FleetParams, agents: int, seed: int) -> list[Record]:
    """The whole fleet trace of `agents` tasks: header, both workloads' prefixes, every task in file order."""
    slots = fleet_plan(p, agents, seed)
    records: list[Record] = [fleet_header(p, agents, seed, slots), *prefix_records(p)]
    for slot in slots:
        records.extend(agent_records(p, slot, seed))
    return records
