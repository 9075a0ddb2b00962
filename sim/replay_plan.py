"""What the agent replayer needs from a trace, and its checked, normalized form (`ReplayPlan`).

`ReplayPlan.from_trace` accepts a loaded `evolving_infra.traces` `Trace` or anything shaped like the
`TraceLike` protocol (agents in file order, as a mapping by id or a sequence; requests in file order;
branch ends). It re-checks the rules replay depends on, so a hand-built trace that breaks them is refused
with a specific `PlanError` instead of a replay that hangs or issues a request twice:

- agent ids unique; request ids unique; each request names a defined agent;
- each `after` id names an earlier request of the same agent (so dependencies cannot form a cycle);
- `delay_s` finite and >= 0; `output_tokens` >= 1; `prompt_tokens` >= 0;
- a branch belongs to one agent; a `branch_end` names a branch with requests, at most once, and its
  `after` is a request of that branch.

`StreamedPlan` is the same plan agent by agent, for a trace that loads its agents on demand (`AgentStream`, e.g.
`traces.growing.GrowingTrace`): `agent(i)` checks agent i alone by the same rules (its records cannot name
another agent's, which the loader's rules and the per-agent blocks already ensure) and builds its specs with the
trace's indices, so they equal `ReplayPlan.from_trace` of the whole trace agent for agent.

Boundary: plain values and checks; no replay state, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeGuard

from evolving_infra.traces.records import Request


class PlanError(ValueError):
    """A trace cannot be replayed: the message names the record and the broken rule."""


class AgentLike(Protocol):
    @property
    def agent(self) -> str: ...
    @property
    def workload(self) -> str: ...
    @property
    def start_s(self) -> float: ...


class RequestLike(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def branch(self) -> str: ...
    @property
    def after(self) -> Sequence[str]: ...
    @property
    def delay_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...


class BranchEndLike(Protocol):
    @property
    def branch(self) -> str: ...
    @property
    def after(self) -> str: ...


class TraceLike(Protocol):
    @property
    def agents(self) -> Mapping[Any, AgentLike] | Sequence[AgentLike]: ...  # keys unused (ids or AgentIds)
    @property
    def requests(self) -> Sequence[RequestLike]: ...
    @property
    def branch_ends(self) -> Sequence[BranchEndLike]: ...


@dataclass(frozen=True, slots=True)
class _Fields:
    """A request's fields as replay needs them, for a record that does not answer them itself."""

    id: str
    agent: str
    branch: str
    after: tuple[str, ...]
    delay_s: float
    prompt_tokens: int
    output_tokens: int
    index: int


_FIELDS = ("id", "agent", "workload", "branch", "after", "delay_s", "prompt_tokens", "output_tokens", "index")


class RequestSpec:
    """One request as replay sees it; `index` is its position in the trace's file order. Immutable; equality,
    hash and repr are those of its nine fields (`_FIELDS`).

    Slim: built from a loaded trace's `Request` that already answers every field as replay needs it (its `index`
    is the position, its `after` has no repeats), a spec keeps that record and the agent's workload and reads the
    other fields from it: 48 bytes, where a copy of the fields costs some 160 (the object and two new ints)."""

    __slots__ = ("_of", "workload")
    _of: _Fields | Request
    workload: str

    def __init__(self, id: str, agent: str, workload: str, branch: str, after: tuple[str, ...], delay_s: float,
                 prompt_tokens: int, output_tokens: int, index: int) -> None:  # fmt: skip
        fields = _Fields(id, agent, branch, tuple(after), delay_s, prompt_tokens, output_tokens, index)
        object.__setattr__(self, "_of", fields)
        object.__setattr__(self, "workload", workload)

    @classmethod
    def of_record(cls, record: Request, workload: str) -> RequestSpec:
        """The spec of a loaded trace's record (which must answer every field as replay needs it)."""
        spec = object.__new__(cls)
        object.__setattr__(spec, "_of", record)
        object.__setattr__(spec, "workload", workload)
        return spec

    @property
    def id(self) -> str:
        return self._of.id

    @property
    def agent(self) -> str:
        return self._of.agent

    @property
    def branch(self) -> str:
        return self._of.branch

    @property
    def after(self) -> tuple[str, ...]:
        return self._of.after

    @property
    def delay_s(self) -> float:
        return self._of.delay_s

    @property
    def prompt_tokens(self) -> int:
        return self._of.prompt_tokens

    @property
    def output_tokens(self) -> int:
        return self._of.output_tokens

    @property
    def index(self) -> int:
        return self._of.index

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RequestSpec is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"RequestSpec is immutable; cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, RequestSpec)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"RequestSpec({', '.join(f'{name}={getattr(self, name)!r}' for name in _FIELDS)})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (RequestSpec, self._key())


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One agent: its requests in file order, its branches in order of first request, and reported ends."""

    agent: str
    workload: str
    start_s: float
    index: int
    requests: tuple[RequestSpec, ...]
    branches: tuple[str, ...]
    branch_end_after: Mapping[str, str] = field(default_factory=dict)
    """branch id -> the request whose completion ends it (only branches with a `branch_end`)."""


@dataclass(frozen=True)
class ReplayPlan:
    """Agents in file order with their requests; `requests` maps every request id to its spec."""

    agents: tuple[AgentSpec, ...]
    requests: Mapping[str, RequestSpec]

    @classmethod
    def from_trace(cls, trace: TraceLike) -> ReplayPlan:
        return _build(trace)

    @property
    def request_count(self) -> int:
        return len(self.requests)

    @property
    def agent_count(self) -> int:
        return len(self.agents)

    def agent(self, index: int) -> AgentSpec:
        return self.agents[index]

    def release(self, index: int) -> None:
        """A whole plan keeps every agent (the replayer's call when agent `index` finished)."""


class LoadedAgentLike(Protocol):
    """One agent of an `AgentStream`: its record, requests and branch ends; `requests[0].index` is the first
    request's position in the whole trace's file order (its requests are consecutive)."""

    @property
    def index(self) -> int: ...
    @property
    def agent(self) -> AgentLike: ...
    @property
    def requests(self) -> Sequence[Any]: ...
    @property
    def branch_ends(self) -> Sequence[BranchEndLike]: ...


class AgentStream(Protocol):
    """A trace whose agents load on demand, in file order (`traces.growing.GrowingTrace`)."""

    @property
    def agent_count(self) -> int: ...
    def agent_at(self, index: int) -> LoadedAgentLike: ...
    def release(self, index: int) -> None: ...


@dataclass(frozen=True, slots=True)
class _OneAgent:
    agents: tuple[AgentLike, ...]
    requests: Sequence[RequestLike]
    branch_ends: Sequence[BranchEndLike]


class StreamedPlan:
    """The plan of an `AgentStream`, built agent by agent (see the module docstring); `release(i)` lets the
    stream drop what agent i's replay no longer needs."""

    def __init__(self, stream: AgentStream) -> None:
        self._stream = stream
        self._specs: dict[int, AgentSpec] = {}

    @property
    def agent_count(self) -> int:
        return self._stream.agent_count

    def agent(self, index: int) -> AgentSpec:
        spec = self._specs.get(index)
        if spec is None:
            loaded = self._stream.agent_at(index)
            first = loaded.requests[0].index if loaded.requests else 0
            one = _OneAgent((loaded.agent,), loaded.requests, loaded.branch_ends)
            spec = _build(one, agent_index=loaded.index, first_request=first).agents[0]
            self._specs[index] = spec
        return spec

    def release(self, index: int) -> None:
        self._specs.pop(index, None)
        self._stream.release(index)


def _distinct(after: Sequence[str]) -> tuple[str, ...]:
    """`after` without repeats, in order (the request's own tuple when it has none: one object less per request)."""
    if isinstance(after, tuple) and len(set(after)) == len(after):
        return after
    return tuple(dict.fromkeys(after))


def _answers(req: object, index: int, after: tuple[str, ...]) -> TypeGuard[Request]:
    """Whether `req` is a trace record that answers every field of its spec at position `index` exactly as a
    copy would (the same values of the same types), so the spec may keep it instead of a copy."""
    return (
        type(req) is Request and after is req.after and type(req.index) is int and req.index == index
        and type(req.delay_s) is float and type(req.keep) is int and type(req.new) is int
        and type(req.output_tokens) is int
    )  # fmt: skip


def _agents_of(trace: TraceLike) -> Iterable[AgentLike]:
    agents = trace.agents
    if isinstance(agents, Mapping):
        return list(agents.values())
    return list(agents)


def _build(trace: TraceLike, *, agent_index: int = 0, first_request: int = 0) -> ReplayPlan:
    """The checked plan of `trace`; its agents and requests are numbered from `agent_index` and
    `first_request` (a single agent of a longer trace)."""
    agent_order: list[str] = []
    agent_info: dict[str, AgentLike] = {}
    for agent in _agents_of(trace):
        if agent.agent in agent_info:
            raise PlanError(f"agent {agent.agent!r} is defined twice; agent ids must be unique")
        if not math.isfinite(agent.start_s) or agent.start_s < 0:
            raise PlanError(f"agent {agent.agent!r}: start_s must be finite and >= 0, got {agent.start_s!r}")
        agent_info[agent.agent] = agent
        agent_order.append(agent.agent)

    specs: dict[str, RequestSpec] = {}
    per_agent: dict[str, list[RequestSpec]] = {a: [] for a in agent_order}
    branch_agent: dict[str, str] = {}
    branches: dict[str, list[str]] = {a: [] for a in agent_order}
    for index, req in enumerate(trace.requests, start=first_request):
        where = f"request {req.id!r}"
        if req.id in specs:
            raise PlanError(f"{where} is defined twice; request ids must be unique")
        if req.agent not in agent_info:
            raise PlanError(f"{where} names agent {req.agent!r}, which is not defined")
        for dep in req.after:
            if dep not in specs:
                raise PlanError(f"{where}: after names {dep!r}, which is not an earlier request")
            if specs[dep].agent != req.agent:
                raise PlanError(
                    f"{where}: after names {dep!r} of agent {specs[dep].agent!r}; "
                    f"dependencies must be requests of the same agent ({req.agent!r})"
                )
        if not math.isfinite(req.delay_s) or req.delay_s < 0:
            raise PlanError(f"{where}: delay_s must be finite and >= 0, got {req.delay_s!r}")
        if req.output_tokens < 1:
            raise PlanError(f"{where}: output_tokens must be >= 1, got {req.output_tokens}")
        if req.prompt_tokens < 0:
            raise PlanError(f"{where}: prompt_tokens must be >= 0, got {req.prompt_tokens}")
        owner = branch_agent.setdefault(req.branch, req.agent)
        if owner != req.agent:
            raise PlanError(
                f"{where}: branch {req.branch!r} belongs to agent {owner!r}, not {req.agent!r}"
            )
        if req.branch not in branches[req.agent]:
            branches[req.agent].append(req.branch)
        workload = agent_info[req.agent].workload
        after = _distinct(req.after)
        if _answers(req, index, after):
            spec = RequestSpec.of_record(req, workload)
        else:
            spec = RequestSpec(
                id=req.id,
                agent=req.agent,
                workload=workload,
                branch=req.branch,
                after=after,
                delay_s=float(req.delay_s),
                prompt_tokens=int(req.prompt_tokens),
                output_tokens=int(req.output_tokens),
                index=index,
            )
        specs[req.id] = spec
        per_agent[req.agent].append(spec)

    ends: dict[str, dict[str, str]] = {a: {} for a in agent_order}
    for end in trace.branch_ends:
        where = f"branch_end of {end.branch!r}"
        owner_agent = branch_agent.get(end.branch)
        if owner_agent is None:
            raise PlanError(f"{where}: no request belongs to this branch")
        if end.branch in ends[owner_agent]:
            raise PlanError(f"{where}: the branch already has a branch_end; at most one is allowed")
        target = specs.get(end.after)
        if target is None or target.branch != end.branch:
            raise PlanError(f"{where}: after names {end.after!r}, which is not a request of this branch")
        ends[owner_agent][end.branch] = end.after

    agents = tuple(
        AgentSpec(
            agent=a,
            workload=agent_info[a].workload,
            start_s=float(agent_info[a].start_s),
            index=i,
            requests=tuple(per_agent[a]),
            branches=tuple(branches[a]),
            branch_end_after=MappingProxyType(ends[a]),
        )
        for i, a in enumerate(agent_order, start=agent_index)
    )
    return ReplayPlan(agents=agents, requests=MappingProxyType(specs))
