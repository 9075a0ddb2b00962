"""The generator registry: `generate(kind, agents, seed, **overrides)` returns a whole trace as records;
`plan_agents` gives the same trace agent by agent (`AgentPlan`: the head, then any agent's records on demand).

Invariant: the records form a valid trace of format version 1 (a header, the shared prefixes, then each agent's
block in file order), and the same `(kind, agents, seed, overrides)` gives the same records. Each agent draws from
its own random stream, derived from the seed, the workload and its index.

Boundary: pure; no clock, no global random state, no I/O (see `writer` for files).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evolving_infra.workloads import cc, fleet, osworld, putnam
from evolving_infra.workloads.common import Record, agent_rng
from evolving_infra.workloads.compose import (
    MixedParams,
    ShiftParams,
    mixed_plan,
    shift_notes,
    shift_periods,
    shift_plan,
)
from evolving_infra.workloads.dist import poisson_arrivals
from evolving_infra.workloads.params import to_jsonable, with_overrides

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Kind:
    """A workload kind: its parameter type and a one-line description."""

    name: str
    params_type: type[Any]
    summary: str


KINDS: dict[str, Kind] = {
    "cc": Kind("cc", cc.CCParams, "coding agent: shared system prompt, sub-agents, forks, compaction, long pauses"),
    "putnam": Kind("putnam", putnam.PutnamParams, "math agent: decode-heavy, one branch of appends, ~10 s pauses"),
    "osworld": Kind("osworld", osworld.OSWorldParams, "computer-use agent: prefill-heavy screenshots, ~1 s pauses"),
    "mixed": Kind("mixed", MixedParams, "Putnam and OSWorld agents at a fixed ratio (144:72)"),
    "shift": Kind("shift", ShiftParams, "section 6.3: Putnam, then mixed, then OSWorld over three hours"),
    "fleet": Kind("fleet", fleet.FleetParams, "appendix D.2: CC-like and codex-like users in regions of partitions, "
                  "local PD shifts under a constant aggregate (set concurrency=N for N agents at once)"),
}

_AGENT: dict[str, tuple[Callable[..., list[Record]], Callable[[Any], dict[str, int]]]] = {
    "cc": (cc.cc_agent, cc.prefixes),
    "putnam": (putnam.putnam_agent, putnam.prefixes),
    "osworld": (osworld.osworld_agent, osworld.prefixes),
}


def kind_of(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown workload kind {name!r}; known kinds: {', '.join(KINDS)}") from None


def default_params(kind: str) -> Any:
    return kind_of(kind).params_type()


def generate(kind: str, agents: int, seed: int, **overrides: object) -> list[Record]:
    """The records of a `kind` trace with `agents` agents; `overrides` set parameters (`a__b` means `a.b`)."""
    return generate_with(kind, agents, seed, with_overrides(default_params(kind), overrides))


def generate_with(kind: str, agents: int, seed: int, params: Any) -> list[Record]:
    """The records of a `kind` trace for a given parameter object."""
    if kind == "fleet":
        _check(kind, agents, seed, params)
        return fleet.generate_fleet(params, agents, seed)
    plan = plan_agents(kind, agents, seed, params)
    records = list(plan.head)
    for i in range(agents):
        records.extend(plan.agent(i))
    return records


@dataclass(frozen=True)
class AgentPlan:
    """A trace of a per-agent kind, agent by agent: `head` (header and prefixes), then `agent(i)` for i in file
    order. Agent i's records depend only on the seed, the parameters and i (its own random stream and its
    start time), so `head + agent(0) + agent(1) + ...` is exactly `generate_with(kind, agents, seed, params)`
    whichever agents are generated and in whichever order."""

    kind: str
    seed: int
    head: tuple[Record, ...]
    labels: tuple[tuple[str, float], ...]
    """`(workload label, start_s)` of each agent in file order."""
    by_label: dict[str, Any]

    @property
    def agents(self) -> int:
        return len(self.labels)

    def agent(self, i: int) -> list[Record]:
        """The records of agent i (`a{i}`): its agent record, requests and branch ends."""
        if not 0 <= i < len(self.labels):
            raise IndexError(f"agent {i} is outside the plan's {len(self.labels)} agents")
        label, start_s = self.labels[i]
        return _AGENT[label][0](self.by_label[label], agent_rng(self.seed, label, i), f"a{i}", start_s, label)


def streamable(kind: str) -> bool:
    """Whether `plan_agents` can generate `kind` agent by agent (every kind but `fleet`)."""
    return kind_of(kind).name != "fleet"


def plan_agents(kind: str, agents: int, seed: int, params: Any) -> AgentPlan:
    """The head and per-agent plan of a `kind` trace (not `fleet`, whose generator is not per agent)."""
    k = _check(kind, agents, seed, params)
    if kind == "fleet":
        raise ValueError("the fleet workload is generated whole; plan_agents takes the per-agent kinds")
    arrivals = random.Random(f"evolving-infra/{seed}/{kind}/arrivals")
    header: Record = {
        "kind": "header",
        "version": FORMAT_VERSION,
        "name": f"{kind}-synthetic-{agents}-seed{seed}",
        "source": f"evolving_infra.workloads.generate(kind={kind!r}, agents={agents}, seed={seed})",
    }
    plan: list[tuple[str, float]]
    if kind in _AGENT:
        rate = params.arrival_rate_per_min / 60.0
        plan = [(kind, t) for t in poisson_arrivals(arrivals, agents, rate)]
        header["notes"] = (
            f"Synthetic {kind} agents ({k.summary}). Agents are in file order of start_s (Poisson arrivals at "
            f"{params.arrival_rate_per_min:g} agents/min) for open-loop replay; closed-loop replay ignores start_s "
            "and starts the next agent in file order whenever one finishes."
        )
        by_label = {kind: params}
    elif kind == "mixed":
        labels = mixed_plan(params, agents)
        times = poisson_arrivals(arrivals, agents, params.arrival_rate_per_min / 60.0)
        plan = list(zip(labels, times, strict=True))
        header["notes"] = (
            f"Putnam and OSWorld agents interleaved in file order at {params.putnam_weight}:{params.osworld_weight} "
            f"(Poisson arrivals at {params.arrival_rate_per_min:g} agents/min). Closed-loop replay that should hold "
            "the ratio among running agents replaces a finished agent by the next one in file order with the same "
            "workload label; plain file order holds it only if both workloads' tasks last equally long."
        )
        by_label = {"putnam": params.putnam, "osworld": params.osworld}
    else:
        plan = shift_plan(params, agents, arrivals)
        periods = shift_periods(params, agents)
        header["notes"] = shift_notes(periods, params.closed_loop_agents())
        header["periods"] = periods
        by_label = {"putnam": params.putnam, "osworld": params.osworld}
    header["generator"] = {"kind": kind, "agents": agents, "seed": seed, "params": to_jsonable(params)}

    head: list[Record] = [header]
    for label in sorted(by_label, key=list(_AGENT).index):
        for name, tokens in _AGENT[label][1](by_label[label]).items():
            head.append({"kind": "prefix", "name": name, "tokens": tokens})
    return AgentPlan(kind, seed, tuple(head), tuple(plan), by_label)


def _check(kind: str, agents: int, seed: int, params: Any) -> Kind:
    k = kind_of(kind)
    if not isinstance(params, k.params_type):
        raise TypeError(f"kind {kind!r} takes {k.params_type.__name__}, got {type(params).__name__}")
    if isinstance(agents, bool) or not isinstance(agents, int) or agents < 1:
        raise ValueError(f"agents must be an integer >= 1, got {agents!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return k
