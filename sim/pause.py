"""Agent pause rules: a scheduler that holds whole agent programs back when a node's KV is oversubscribed.

ThunderAgent's rule (baselines.md, "Agent-aware schedulers"; paper D.5, where host memory counts in a node's
capacity): every `interval_s` (5 s), for each node, the KV demand is the sum of the context tokens of the active
(not paused) programs whose home is that node. If it exceeds `threshold` (95 %) of the node's capacity, pause
programs that wait on tools there (not running a request), smallest first, until the demand is back under
the threshold. Paused programs resume, longest-paused first, on the node with the most free room where their
KV fits under the threshold. A paused program issues nothing: its next request waits until it resumes.

Invariant: a program that is running a request is never paused; after a tick, no node's demand exceeds the
threshold unless every program left active there is running.

Boundary: pure decision over program views; the driver holds and releases requests.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from evolving_infra.core.types import NodeId


class ProgramState(enum.Enum):
    RUNNING = "running"
    """A request of the program is in flight."""
    WAITING_TOOL = "waiting-tool"
    """Between requests (tool call, sub-agent, user)."""
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class ProgramView:
    """One agent program: its home node (where its last request was prefilled), its KV and state."""

    agent: str
    node: NodeId | None
    kv_tokens: int
    state: ProgramState
    paused_since: float | None = None


@dataclass(frozen=True, slots=True)
class PauseDecision:
    pause: tuple[str, ...] = ()
    resume: tuple[tuple[str, NodeId], ...] = ()
    """(agent, node it resumes on)."""
    demand: Mapping[NodeId, int] | None = None
    """Demand per node after the decision (diagnostics)."""


class ProgramRecord:
    """The driver's mutable bookkeeping of one agent program (what `ProgramView` snapshots)."""

    __slots__ = ("node", "kv", "in_flight", "paused_since")

    def __init__(self) -> None:
        self.node: NodeId | None = None
        self.kv = 0
        self.in_flight = 0
        self.paused_since: float | None = None

    @property
    def state(self) -> ProgramState:
        if self.paused_since is not None:
            return ProgramState.PAUSED
        return ProgramState.RUNNING if self.in_flight else ProgramState.WAITING_TOOL


class PauseRule(Protocol):
    @property
    def interval_s(self) -> float: ...

    def tick(self, programs: Sequence[ProgramView], capacity: Mapping[NodeId, int], now: float) -> PauseDecision:
        """Which programs to pause and which to resume, given each node's KV capacity in tokens."""
        ...


@dataclass(frozen=True, slots=True)
class ThunderAgentRule:
    interval_s: float = 5.0
    threshold: float = 0.95

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must lie in (0, 1], got {self.threshold}")

    def tick(self, programs: Sequence[ProgramView], capacity: Mapping[NodeId, int], now: float) -> PauseDecision:
        limit = {n: self.threshold * c for n, c in capacity.items()}
        demand: dict[NodeId, int] = dict.fromkeys(capacity, 0)
        for p in programs:
            if p.state is not ProgramState.PAUSED and p.node in demand:
                demand[p.node] += p.kv_tokens
        pause: list[str] = []
        for node in sorted(capacity):
            if demand[node] <= limit[node]:
                continue
            waiting = sorted(
                (p for p in programs if p.node == node and p.state is ProgramState.WAITING_TOOL),
                key=lambda p: (p.kv_tokens, p.agent),
            )
            for p in waiting:
                if demand[node] <= limit[node]:
                    break
                pause.append(p.agent)
                demand[node] -= p.kv_tokens
        resume: list[tuple[str, NodeId]] = []
        paused = sorted(
            (p for p in programs if p.state is ProgramState.PAUSED),
            key=lambda p: (p.paused_since if p.paused_since is not None else now, p.agent),
        )
        for p in paused:
            room = {n: limit[n] - demand[n] for n in capacity if demand[n] + p.kv_tokens <= limit[n]}
            if not room:
                continue
            node = max(room, key=lambda n: (room[n], _neg(n)))
            demand[node] += p.kv_tokens
            resume.append((p.agent, node))
        return PauseDecision(tuple(pause), tuple(resume), demand)


def _neg(node: str) -> tuple[int, ...]:
    """Sort key reversing string order (ties of room go to the smallest node id under max)."""
    return tuple(-ord(c) for c in node)
