"""Random valid agent traces, for property tests and quick experiments.

One generator, two sources of choices: `random_trace_records(RandomChooser(random.Random(seed)))` for plain
seeded runs, and the hypothesis strategies `trace_records()` / `traces()` (which shrink) for property tests.
Every generated record list is valid format version 1 and exercises every relation: roots, appends, forks
(full or partial keep), sub-agents from a prefix or from nothing, rewrites (compactions), waits on other
branches through `after`, and branch ends.

Boundary: pure; hypothesis is imported only when a strategy is asked for (it is a test dependency).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Trace

if TYPE_CHECKING:  # pragma: no cover
    from hypothesis.strategies import SearchStrategy


class Chooser(Protocol):
    def integer(self, lo: int, hi: int) -> int:
        """An integer in lo..hi inclusive."""
        ...


@dataclass
class RandomChooser:
    rng: random.Random

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


@dataclass(frozen=True)
class TraceShape:
    """Bounds of generated traces (small by default, so brute-force oracles stay cheap)."""

    max_prefixes: int = 2
    max_agents: int = 3
    max_steps: int = 8
    max_tokens: int = 24


@dataclass
class _AgentState:
    name: str
    requests: list[str] = field(default_factory=list)
    branches: dict[str, list[str]] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    records: list[dict[str, Any]] = field(default_factory=list)


def random_trace_records(choose: Chooser, shape: TraceShape = TraceShape()) -> list[dict[str, Any]]:
    """Records of a random valid trace: header, prefixes, agents, then their requests interleaved."""
    records: list[dict[str, Any]] = [{"kind": "header", "version": 1, "name": "random"}]
    prefixes = [f"p{i}" for i in range(choose.integer(0, shape.max_prefixes))]
    tokens = {p: choose.integer(0, 2 * shape.max_tokens) for p in prefixes}
    records.extend({"kind": "prefix", "name": p, "tokens": tokens[p]} for p in prefixes)
    context: dict[str, int] = {}
    agents = [_AgentState(f"a{i}") for i in range(choose.integer(1, shape.max_agents))]
    workloads = ("cc", "putnam", "osworld")
    for a in agents:
        records.append(
            {"kind": "agent", "agent": a.name, "workload": workloads[choose.integer(0, 2)],
             "start_s": choose.integer(0, 40) / 4}
        )  # fmt: skip
        for _ in range(choose.integer(1, shape.max_steps)):
            _step(choose, a, prefixes, tokens, context, shape)
    pending = [list(a.records) for a in agents]
    while any(pending):
        live = [p for p in pending if p]
        records.append(live[choose.integer(0, len(live) - 1)].pop(0))
    return records


def _step(
    choose: Chooser,
    a: _AgentState,
    prefixes: list[str],
    tokens: dict[str, int],
    context: dict[str, int],
    shape: TraceShape,
) -> None:
    open_branches = [b for b in a.branches if b not in a.ended]
    op = choose.integer(0, 5) if a.requests else 2
    if op in (0, 3, 5) and not open_branches:
        op = 2
    if op == 5:  # end a branch
        branch = open_branches[choose.integer(0, len(open_branches) - 1)]
        a.records.append({"kind": "branch_end", "branch": branch, "after": a.branches[branch][-1]})
        a.ended.add(branch)
        return
    spec: dict[str, Any]
    after: list[str] = []
    if op in (0, 3):  # append / rewrite on an open branch
        branch = open_branches[choose.integer(0, len(open_branches) - 1)]
        history = a.branches[branch]
        base = history[-1] if op == 0 else history[choose.integer(0, len(history) - 1)]
        keep = context[base] if op == 0 else choose.integer(0, context[base])
        spec = {"base": base, "keep": keep}
        after = [history[-1]]
        branch_name = branch
    elif op in (1, 4):  # fork from any earlier request of the agent
        base = a.requests[choose.integer(0, len(a.requests) - 1)]
        keep = context[base] if op == 1 else choose.integer(0, context[base])
        spec = {"base": base, "keep": keep}
        after = [base]
        branch_name = f"{a.name}.b{len(a.branches)}"
    else:  # a new branch from a prefix or from nothing (the agent's root, or a sub-agent)
        pick = choose.integer(0, len(prefixes))
        if pick < len(prefixes):
            spec = {"shared": prefixes[pick], "keep": choose.integer(0, tokens[prefixes[pick]])}
        else:
            spec = {}
        if a.requests and choose.integer(0, 1):
            after = [a.requests[-1]]
        branch_name = f"{a.name}.b{len(a.branches)}"
    if a.requests and choose.integer(0, 3) == 0:  # also wait for another request of the agent
        extra = a.requests[choose.integer(0, len(a.requests) - 1)]
        if extra not in after:
            after.append(extra)
    keep = int(spec.get("keep", 0))
    new = choose.integer(0 if keep else 1, shape.max_tokens)
    spec["new"] = new
    output = choose.integer(1, max(1, shape.max_tokens // 2))
    rid = f"{a.name}.r{len(a.requests)}"
    a.records.append(
        {"kind": "request", "id": rid, "agent": a.name, "branch": branch_name, "after": after,
         "delay_s": choose.integer(0, 20) / 4, "input": spec, "output_tokens": output}
    )  # fmt: skip
    context[rid] = keep + new + output
    a.requests.append(rid)
    a.branches.setdefault(branch_name, []).append(rid)


def random_trace(seed: int, shape: TraceShape = TraceShape()) -> Trace:
    """A random valid trace from a seed."""
    return trace_from_records(random_trace_records(RandomChooser(random.Random(seed)), shape))


def trace_records(shape: TraceShape = TraceShape()) -> SearchStrategy[list[dict[str, Any]]]:
    """Hypothesis strategy: records of a random valid trace (shrinks towards fewer, smaller requests)."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw: st.DrawFn) -> list[dict[str, Any]]:
        class _Draw:
            def integer(self, lo: int, hi: int) -> int:
                return draw(st.integers(lo, hi))

        return random_trace_records(_Draw(), shape)

    return build()


def traces(shape: TraceShape = TraceShape()) -> SearchStrategy[Trace]:
    """Hypothesis strategy: a random valid, loaded `Trace`."""
    return trace_records(shape).map(trace_from_records)
