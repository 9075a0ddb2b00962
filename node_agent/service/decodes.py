"""Decode requests the service holds, from `SubmitDecode` until they finish, and their progress items.

A decode is *pending* while its prompt KV is pulled from the prefill node (not yet in the engine), then
*submitted*. A phase switch away from decode cancels the pending ones (they are handed back); the
engine hands back its queued ones itself. `DecodeCheck` refuses what the engine would refuse before any
KV moves (the engine checks again on submission), plus a prompt page that is neither held here nor
named by a fetch run.

Boundary: bookkeeping and checks; no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.node_agent.engine import (
    DecodeRequest,
    DuplicateRequest,
    EngineCore,
    RequestTooLarge,
    SwitchInProgress,
    SwitchState,
    WrongPhase,
)
from evolving_infra.node_agent.engine.requests import pages_needed, validate_pages
from evolving_infra.node_agent.engine.phase_switch import serves
from evolving_infra.node_agent.transfer.arena import KvArena


@dataclass(frozen=True, slots=True)
class Accepted:
    queue_position: int


@dataclass(frozen=True, slots=True)
class Tokens:
    new: int
    total: int
    time: float


@dataclass(frozen=True, slots=True)
class Finished:
    output_tokens: int
    time: float


@dataclass(frozen=True, slots=True)
class Failed:
    code: grpc.StatusCode
    message: str


@dataclass(eq=False)
class DecodeEntry:
    request: str
    pages: tuple[PageHash, ...]
    queue: asyncio.Queue[Tokens | Finished | Failed] = field(default_factory=asyncio.Queue)
    submitted: bool = False
    cancelled: bool = False
    cancel_reason: str = ""
    produced: int = 0


class DecodeTable:
    """Decodes held by the service, by request id."""

    def __init__(self) -> None:
        self._entries: dict[str, DecodeEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request: object) -> bool:
        return request in self._entries

    def __iter__(self) -> Iterator[DecodeEntry]:
        return iter(list(self._entries.values()))

    def add(self, req: DecodeRequest) -> DecodeEntry:
        entry = DecodeEntry(req.request, tuple(req.prompt_pages))
        self._entries[req.request] = entry
        return entry

    def get(self, request: str) -> DecodeEntry | None:
        return self._entries.get(request)

    def pop(self, request: str) -> DecodeEntry | None:
        return self._entries.pop(request, None)

    def cancel_pending(self, reason: str) -> list[str]:
        """Mark every decode not yet submitted to the engine cancelled; their ids, in arrival order."""
        out = []
        for entry in self._entries.values():
            if not entry.submitted and not entry.cancelled:
                entry.cancelled, entry.cancel_reason = True, reason
                out.append(entry.request)
        return out


class DecodeCheck:
    """What the engine would refuse, checked before pulling KV (see the module docstring)."""

    def __init__(self, engine: EngineCore, arena: KvArena) -> None:
        self.engine = engine
        self.arena = arena

    def validate(
        self,
        req: DecodeRequest,
        runs: Sequence[tuple[str, tuple[PageHash, ...]]],
        held: DecodeTable,
        switching_to: Phase | None = None,
    ) -> None:
        """Raise what the engine would; `switching_to` is the target of a draining switch, if any."""
        engine, node = self.engine, self.engine.node
        if engine.switch_state is SwitchState.DRAINING and switching_to is not None:
            if not serves(NodeMode.of(switching_to), Phase.DECODE):
                raise WrongPhase(f"node {node} is switching to {switching_to.value}: decode work is refused")
            if not serves(engine.mode, Phase.DECODE):
                raise SwitchInProgress(f"node {node} is still draining its switch to decode: retry once it completes")
        elif not serves(engine.mode, Phase.DECODE):
            raise WrongPhase(f"node {node} serves {engine.mode.value}: decode work is refused")
        if req.request in held:
            raise DuplicateRequest(f"node {node} already holds request {req.request!r}")
        page_tokens = engine.profile.page_tokens
        validate_pages(req, page_tokens)
        need = pages_needed(req.prompt_tokens + req.output_tokens, page_tokens)
        if need > engine.pool.l1.capacity:
            raise RequestTooLarge(
                f"request {req.request!r} needs {need} GPU pages but node {node} has {engine.pool.l1.capacity} in all"
            )
        prompt = set(req.prompt_pages)
        planned: set[PageHash] = set()
        for _, pages in runs:
            stray = [p for p in pages if p not in prompt]
            if stray:
                raise ValueError(f"request {req.request}: fetch page {stray[0]:#x} is not one of its prompt pages")
            planned.update(pages)
        absent = [p for p in req.prompt_pages if p not in planned and p not in self.arena]
        if absent:
            raise ValueError(
                f"request {req.request}: {len(absent)} prompt page(s) (first {absent[0]:#x}) are neither held by "
                f"node {node} nor named by a fetch run; say which prefill node holds them"
            )
