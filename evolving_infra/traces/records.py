"""The loaded, validated trace: immutable records in file order.

Only `loader` builds a `Trace` (after every rule of the format holds); everything else reads it. Ids are the
strings of the file; each record also keeps the 1-based line it came from, for messages.

Invariants of a `Trace` (established by the loader): every id a record names is defined on an earlier line;
`requests` are in file order and `Request.index` is the position in that tuple; a request's base (if any) has a
smaller index; `0 <= keep <= context length of the source`; `keep + new >= 1`; `output_tokens >= 1`.

Boundary: plain values and lookups; no I/O, no validation (see `loader`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from evolving_infra.core.types import AgentId, BranchId, RequestId

FORMAT_VERSION = 1


class Relation(enum.Enum):
    """How a request's prompt relates to its branch's history (agent context management)."""

    ROOT = "root"
    """First request of an agent's first branch."""
    FORK = "fork"
    """First request of a branch whose base is a request of another branch."""
    SUB_AGENT = "sub-agent"
    """First request of a later branch of the agent, starting from a shared prefix or from nothing."""
    APPEND = "append"
    """Base is the branch's previous request and the whole of its context is kept."""
    REWRITE = "rewrite"
    """Any other later request of a branch: compaction, rewind, or a restart from a prefix or from nothing."""


@dataclass(frozen=True, slots=True)
class Header:
    version: int = FORMAT_VERSION
    name: str | None = None
    source: str | None = None
    notes: str | None = None


@dataclass(frozen=True, slots=True)
class Prefix:
    """A shared prefix (system prompt, tool definitions) of `tokens` tokens; `index` is its position."""

    name: str
    tokens: int
    index: int
    line: int


@dataclass(frozen=True, slots=True)
class Agent:
    agent: AgentId
    workload: str
    start_s: float
    line: int


@dataclass(frozen=True, slots=True)
class Request:
    """One LLM call. The prompt is `keep` tokens of the source (base's context or prefix) then `new` fresh ones."""

    index: int
    id: RequestId
    agent: AgentId
    branch: BranchId
    after: tuple[RequestId, ...]
    delay_s: float
    base: RequestId | None
    shared: str | None
    keep: int
    new: int
    output_tokens: int
    relation: Relation
    line: int

    @property
    def prompt_tokens(self) -> int:
        return self.keep + self.new

    @property
    def context_tokens(self) -> int:
        """Prompt followed by output: what a later request may keep through `base`."""
        return self.keep + self.new + self.output_tokens


@dataclass(frozen=True, slots=True)
class BranchEnd:
    """The harness reports that `branch` finished; takes effect when request `after` completes."""

    branch: BranchId
    after: RequestId
    line: int


@dataclass(frozen=True, slots=True)
class Branch:
    """A context of one agent: its requests in file order and, if reported, its end."""

    id: BranchId
    agent: AgentId
    requests: tuple[RequestId, ...]
    end: BranchEnd | None


@dataclass(frozen=True)
class Trace:
    """A validated trace. Mappings keep file order (of definition, or of first request for branches)."""

    header: Header | None
    prefixes: Mapping[str, Prefix]
    agents: Mapping[AgentId, Agent]
    branches: Mapping[BranchId, Branch]
    requests: tuple[Request, ...]
    branch_ends: tuple[BranchEnd, ...]
    source: str | None = None
    _by_id: Mapping[RequestId, Request] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefixes", MappingProxyType(dict(self.prefixes)))
        object.__setattr__(self, "agents", MappingProxyType(dict(self.agents)))
        object.__setattr__(self, "branches", MappingProxyType(dict(self.branches)))
        object.__setattr__(self, "_by_id", MappingProxyType({r.id: r for r in self.requests}))

    @property
    def name(self) -> str | None:
        return self.header.name if self.header is not None else None

    def request(self, rid: str) -> Request:
        """The request with id `rid` (KeyError naming it if there is none)."""
        try:
            return self._by_id[RequestId(rid)]
        except KeyError:
            raise KeyError(f"no request {rid!r} in the trace") from None

    def __contains__(self, rid: object) -> bool:
        return rid in self._by_id

    def workload(self, request: Request) -> str:
        return self.agents[request.agent].workload

    def agent_requests(self, agent: str) -> tuple[Request, ...]:
        """The requests of `agent`, in file order."""
        return tuple(r for r in self.requests if r.agent == agent)
