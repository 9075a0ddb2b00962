"""`RouterBackend`: the narrow async interface between the HTTP front end and the routing core.

The front end validates, tokenizes and resolves the branch, then hands the backend one
`CompletionRequest` and streams back what the backend yields. The backend (the routing core and its
node clients) decides placement, prefix reuse and branch counts; the front end knows none of that.

Contract for implementers:
- `complete(request)` returns an async iterator of `TokenChunk`s (an async generator is the natural
  choice). Errors are raised as `BackendError` subclasses (errors.py), before the first chunk or during
  the stream. The front end stops iterating and calls `aclose()` on the iterator when the client goes
  away or the deadline passes, so cleanup belongs in the generator's `finally`.
- The last chunk carries a `finish_reason`; the front end keeps iterating to the iterator's end (and
  ignores chunks after that one), so code after the last `yield` runs. `cached_tokens` is reported on
  any chunk (the last value reported wins) and is the prompt prefix length served from KV cache.
  `serving` (optional, on any chunk; the last value reported wins) names the nodes serving the request;
  what is known at the first chunk goes into the response headers, the last value into the usage.
- `finish_branch(branch)` ends a branch (its counts drop to zero); it is idempotent and answers
  `NOT_FOUND` for a branch that is unknown or already finished.
- `models()` and `readiness()` are cheap synchronous reads of the backend's current state.

Boundary: value types and the Protocol only.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evolving_infra.core.types import BranchId, RequestId


class FinishReason(enum.Enum):
    """Why generation ended, as OpenAI reports it in `finish_reason`."""

    STOP = "stop"
    LENGTH = "length"


class FinishOutcome(enum.Enum):
    """Answer of `finish_branch`: the branch was active and is now finished, or it was not active."""

    FINISHED = "finished"
    NOT_FOUND = "not_found"


@dataclass(frozen=True, slots=True)
class BranchRef:
    """A branch within a tenant's namespace. Equal branch ids of different tenants are different branches.

    `tenant` is None for requests that name no tenant (the shared default namespace).
    """

    branch_id: BranchId
    tenant: str | None = None

    def scoped_id(self) -> BranchId:
        """One id that is unique across tenants (length-prefixed, so no two (tenant, id) pairs collide);
        for the routing core's branch table, which keys branches by a single id."""
        if self.tenant is None:
            return BranchId(f"-/{self.branch_id}")
        return BranchId(f"{len(self.tenant)}:{self.tenant}/{self.branch_id}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling fields passed through to the engine unchanged (the emulated engine ignores them)."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """One admitted request, as the backend sees it.

    `branch` is the resolved branch; `parent` the parent branch on a fork or sub-agent start (same
    tenant). `ephemeral` marks a branch the front end generated because the client named none: it is
    finished right after this request. `finish_after` says the client declared this the branch's last
    request; the front end calls `finish_branch` once the request ends either way, so the backend need
    not act on these flags (they are informative, e.g. to skip counting an ephemeral branch's pages).
    `max_tokens` None lets the backend choose. `timeout_s` is the time left of the request's deadline
    when it was handed over; `traceparent`/`tracestate` are the W3C trace context to pass on.
    """

    request_id: RequestId
    model: str
    prompt_token_ids: tuple[int, ...]
    branch: BranchRef
    parent: BranchRef | None = None
    ephemeral: bool = False
    finish_after: bool = False
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    timeout_s: float | None = None
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class ServingNodes:
    """The nodes that serve a request, and seconds its prefill waited in its node's queue (None: unknown)."""

    prefill_node: str
    decode_node: str | None = None
    queue_s: float | None = None


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Tokens the engine produced since the previous chunk."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    cached_tokens: int | None = None
    serving: ServingNodes | None = None

    def __post_init__(self) -> None:
        if self.cached_tokens is not None and self.cached_tokens < 0:
            raise ValueError(f"cached_tokens must be >= 0, got {self.cached_tokens}")


@dataclass(frozen=True, slots=True)
class ModelCard:
    """One entry of `/v1/models`."""

    id: str
    owned_by: str = "evolving-infra"
    created: int = 0


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the backend can serve now, and if not, why (shown by `/readyz`)."""

    ready: bool
    reason: str = ""


@runtime_checkable
class RouterBackend(Protocol):
    """What the HTTP front end calls. See the module docstring for the contract."""

    def complete(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]: ...

    async def finish_branch(self, branch: BranchRef) -> FinishOutcome: ...

    def models(self) -> Sequence[ModelCard]: ...

    def readiness(self) -> Readiness: ...
