"""A trace validated and extended agent by agent, in file order, as its replay asks for agents.

`GrowingTrace(head, block, count)`: `head` holds the records before the first agent (header, prefixes); `block(i)`
returns the records of agent i (its `agent` record, then its requests and branch ends, in file order). Blocks are
asked for at most once each, in order 0, 1, ..., when `load(n)` needs them. Every record goes through the loader's
checks with the line number it would have in the whole file, so the loaded part equals the same part of
`trace_from_records(head + block(0) + block(1) + ...)`: the same request indices, ids, relations and lines.

Reads (`prefixes`, `agents`, `requests`, `request`, `branch_ends`) show what is loaded so far; `snapshot()` is a
`Trace` of it. A block must hold exactly one agent and only its requests and branch ends (`GrowingTraceError`
otherwise), so an agent's requests are one contiguous run of indices. Listeners see each agent's requests when it
loads (`on_load`; the simulator: fork parents) and when its replay has finished (`release`; the content model
drops its pages). Released requests stay readable: the trace keeps every loaded request.

Boundary: validation and bookkeeping over records given by the caller; no generation, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from evolving_infra.core.types import AgentId
from evolving_infra.traces.loader import _Builder
from evolving_infra.traces.records import Agent, BranchEnd, Header, Prefix, Request, Trace

Record = Mapping[str, object]
BlockFn = Callable[[int], Sequence[Record]]
"""`block(i)`: the records of agent i in file order."""
AgentListener = Callable[["LoadedAgent"], None]


class GrowingTraceError(ValueError):
    """A block broke the one-agent-per-block rule, or an agent outside the trace was asked for."""


@dataclass(frozen=True, slots=True)
class LoadedAgent:
    """Agent `index` (file order) with its requests (one contiguous run of indices) and branch ends."""

    index: int
    agent: Agent
    requests: tuple[Request, ...]
    branch_ends: tuple[BranchEnd, ...]


class GrowingTrace:
    """A trace of `count` agents whose agents are loaded on demand (see the module docstring)."""

    def __init__(self, head: Iterable[Record], block: BlockFn, count: int, source: str | None = None) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise GrowingTraceError(f"count must be an integer >= 0, got {count!r}")
        self._builder = _Builder(source)
        self._line = 0
        for record in head:
            if record.get("kind") in ("agent", "request", "branch_end"):
                kind = record.get("kind")
                raise GrowingTraceError(f"the head holds only a header and prefixes, got a {kind!r} record")
            self._add(record)
        self._block = block
        self._count = count
        self._loaded: list[LoadedAgent] = []
        self._branch_ends: list[BranchEnd] = []
        self._on_load: list[AgentListener] = []
        self._on_release: list[AgentListener] = []
        self._released: set[int] = set()
        self.source = source

    # -- reads (what is loaded so far) ---------------------------------------------------------------------
    @property
    def agent_count(self) -> int:
        """Agents in the whole trace (loaded or not)."""
        return self._count

    @property
    def loaded_agents(self) -> int:
        return len(self._loaded)

    @property
    def listened(self) -> bool:
        """Whether a listener is registered (a simulation built on this trace; one run per growing trace)."""
        return bool(self._on_load or self._on_release)

    @property
    def header(self) -> Header | None:
        return self._builder.header

    @property
    def name(self) -> str | None:
        return self.header.name if self.header is not None else None

    @property
    def prefixes(self) -> Mapping[str, Prefix]:
        return MappingProxyType(self._builder.prefixes)

    @property
    def agents(self) -> Mapping[AgentId, Agent]:
        return MappingProxyType(self._builder.agents)

    @property
    def requests(self) -> Sequence[Request]:
        return self._builder.requests

    @property
    def branch_ends(self) -> Sequence[BranchEnd]:
        return self._branch_ends

    def request(self, rid: str) -> Request:
        """The loaded request with id `rid` (KeyError naming it if there is none)."""
        try:
            return self._builder.by_id[rid]  # type: ignore[index]  # RequestId is a str
        except KeyError:
            raise KeyError(f"no request {rid!r} in the loaded part of the trace") from None

    def __contains__(self, rid: object) -> bool:
        return rid in self._builder.by_id

    def snapshot(self) -> Trace:
        """The loaded part as a `Trace`."""
        return self._builder.finish()

    # -- growth ------------------------------------------------------------------------------------------
    def on_load(self, listener: AgentListener, *, replay: bool = True) -> None:
        """Call `listener` for every agent loaded from now on (and, with `replay`, for those loaded already)."""
        self._on_load.append(listener)
        if replay:
            for loaded in self._loaded:
                listener(loaded)

    def on_release(self, listener: AgentListener) -> None:
        """Call `listener` for every agent released from now on."""
        self._on_release.append(listener)

    def agent_at(self, index: int) -> LoadedAgent:
        """Agent `index`, loading it (and those before it) if needed."""
        if not 0 <= index < self._count:
            raise GrowingTraceError(f"agent index {index} is outside the trace's {self._count} agents")
        self.load(index + 1)
        return self._loaded[index]

    def load(self, n: int) -> None:
        """Load the first `n` agents (at most the trace's count)."""
        for i in range(len(self._loaded), min(n, self._count)):
            self._load_one(i)

    def load_all(self) -> None:
        self.load(self._count)

    def release(self, index: int) -> None:
        """Agent `index`'s replay has finished: tell the release listeners (once)."""
        if index >= len(self._loaded):
            raise GrowingTraceError(f"agent index {index} is not loaded; only loaded agents are released")
        if index not in self._released:
            self._released.add(index)
            for listener in self._on_release:
                listener(self._loaded[index])

    # -- internals ---------------------------------------------------------------------------------------
    def _add(self, record: Record) -> None:
        self._line += 1
        self._builder.add(self._line, record)

    def _load_one(self, i: int) -> None:
        records = self._block(i)
        if not records or records[0].get("kind") != "agent":
            raise GrowingTraceError(f"the block of agent {i} must start with its 'agent' record")
        first = len(self._builder.requests)
        ends: list[BranchEnd] = []
        agent_id: AgentId | None = None
        for record in records:
            kind = record.get("kind")
            if kind == "agent" and agent_id is not None:
                raise GrowingTraceError(f"the block of agent {i} ({agent_id!r}) holds a second 'agent' record")
            if kind not in ("agent", "request", "branch_end"):
                raise GrowingTraceError(f"the block of agent {i} holds a {kind!r} record; only the head may")
            self._add(record)
            if kind == "agent":
                agent_id = next(reversed(self._builder.agents))
            elif kind == "request":
                req = self._builder.requests[-1]
                if req.agent != agent_id:
                    raise GrowingTraceError(f"the block of agent {i} ({agent_id!r}) holds request {req.id!r} of "
                                            f"agent {req.agent!r}")  # fmt: skip
            else:
                end = self._builder.branch_end[next(reversed(self._builder.branch_end))]
                if self._builder.branch_agent[end.branch] != agent_id:
                    raise GrowingTraceError(f"the block of agent {i} ({agent_id!r}) ends branch {end.branch!r} of "
                                            "another agent")  # fmt: skip
                ends.append(end)
        assert agent_id is not None
        loaded = LoadedAgent(i, self._builder.agents[agent_id], tuple(self._builder.requests[first:]), tuple(ends))
        self._loaded.append(loaded)
        self._branch_ends.extend(ends)
        for listener in self._on_load:
            listener(loaded)
