"""`FakeBackend`: a deterministic `RouterBackend` for tests and demos of the HTTP front end.

Output tokens are a hash of (prompt, position, seed), so equal requests get equal answers. Latency is
configurable (first token, between tokens). It keeps the history of each branch (last prompt + output)
and reports as cached the longest common prefix of a new prompt with its branch's history (or, for a new
branch, its parent's), floored to whole pages — what a perfect prefix cache would reuse. Errors can be
injected before the first token or after some tokens. Everything it is asked is recorded for tests;
`cancelled` lists the requests whose stream the front end closed or cancelled before it ended.

Boundary: no routing, no nodes; a stand-in behind the Protocol only.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import xxhash
from evolving_infra.router.http.backend import (
    BranchRef,
    CompletionRequest,
    FinishOutcome,
    FinishReason,
    ModelCard,
    Readiness,
    TokenChunk,
)
from evolving_infra.router.http.errors import BackendError

from evolving_infra.core.pages import DEFAULT_PAGE_TOKENS
from evolving_infra.core.types import RequestId


@dataclass
class FakeBackend:
    """See the module docstring. `default_max_tokens` applies when a request sets no `max_tokens`."""

    model_ids: tuple[str, ...] = ("evolving-emulated",)
    default_max_tokens: int = 8
    first_token_delay_s: float = 0.0
    inter_token_delay_s: float = 0.0
    tokens_per_chunk: int = 1
    page_tokens: int = DEFAULT_PAGE_TOKENS
    vocab_size: int = 1 << 31
    error: BackendError | None = None
    error_after_tokens: int | None = None
    ready: bool = True

    requests: list[CompletionRequest] = field(default_factory=list)
    finish_calls: list[BranchRef] = field(default_factory=list)
    completed: list[RequestId] = field(default_factory=list)
    cancelled: list[RequestId] = field(default_factory=list)
    _active: set[BranchRef] = field(default_factory=set)
    _history: dict[BranchRef, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens_per_chunk < 1 or self.page_tokens < 1 or self.vocab_size < 1:
            raise ValueError("tokens_per_chunk, page_tokens and vocab_size must be >= 1")

    def models(self) -> Sequence[ModelCard]:
        return [ModelCard(id=m) for m in self.model_ids]

    def readiness(self) -> Readiness:
        return Readiness(True) if self.ready else Readiness(False, "fake backend set not ready")

    @property
    def active_branches(self) -> frozenset[BranchRef]:
        return frozenset(self._active)

    async def finish_branch(self, branch: BranchRef) -> FinishOutcome:
        self.finish_calls.append(branch)
        if branch in self._active:
            self._active.discard(branch)
            self._history.pop(branch, None)
            return FinishOutcome.FINISHED
        return FinishOutcome.NOT_FOUND

    def output_for(self, request: CompletionRequest) -> tuple[int, ...]:
        """The tokens this backend answers `request` with."""
        count = request.max_tokens if request.max_tokens is not None else self.default_max_tokens
        prompt = request.prompt_token_ids
        seed = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(prompt)}Q", *prompt))
        seed ^= request.sampling.seed or 0
        return tuple(
            xxhash.xxh3_64_intdigest(struct.pack("<QQ", seed & (2**64 - 1), i)) % self.vocab_size
            for i in range(count)
        )

    def cached_for(self, request: CompletionRequest) -> int:
        """Prompt tokens a perfect prefix cache would reuse for `request` (whole pages, at least one token
        left to compute)."""
        history = self._history.get(request.branch)
        if history is None and request.parent is not None:
            history = self._history.get(request.parent)
        if not history:
            return 0
        prompt = request.prompt_token_ids
        common = 0
        for a, b in zip(prompt, history, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1)
        return max(0, common // self.page_tokens * self.page_tokens)

    def complete(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        self.requests.append(request)
        return self._stream(request)

    async def _stream(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        try:
            if self.error is not None and self.error_after_tokens is None:
                raise self.error
            self._active.add(request.branch)
            output = self.output_for(request)
            cached = self.cached_for(request)
            reason = FinishReason.LENGTH if request.max_tokens is not None else FinishReason.STOP
            await asyncio.sleep(self.first_token_delay_s)
            sent = 0
            while sent < len(output) or not output:
                fail_at = self.error_after_tokens
                if self.error is not None and fail_at is not None and sent >= fail_at:
                    raise self.error
                if sent:
                    await asyncio.sleep(self.inter_token_delay_s)
                piece = output[sent : sent + self.tokens_per_chunk]
                sent += len(piece)
                last = sent >= len(output)
                yield TokenChunk(
                    token_ids=piece,
                    finish_reason=(reason if last else None),
                    cached_tokens=cached if sent == len(piece) else None,
                )
                if last:
                    break
            self._history[request.branch] = request.prompt_token_ids + output
            self.completed.append(request.request_id)
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled.append(request.request_id)
            raise
