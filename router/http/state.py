"""Per-application state of the HTTP front end, the current request's context, and response helpers.

`AppState` holds what every handler needs (settings, backend, tokenizer, metrics, wall clock), whether
the server is draining, and the background tasks that finish branches after their last request (awaited
on shutdown, so no finish is lost). `RequestContext` (request id, arrival time) lives in a context
variable set by the middleware for the task that answers the request.

Boundary: aiohttp glue shared by server.py and completion.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from evolving_infra.router.http.backend import BranchRef, FinishOutcome, RouterBackend
from evolving_infra.router.http.errors import ApiError
from evolving_infra.router.http.metrics import FinishTrigger, RouterMetrics
from evolving_infra.router.http.offload import Offloader
from evolving_infra.router.http.security import ApiKeys, KeyLimiter
from evolving_infra.router.http.settings import RouterHttpSettings
from evolving_infra.router.http.tokenizer import Tokenizer

from evolving_infra.core.types import RequestId

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: RequestId
    arrived_at: float
    key: str | None = None
    """The name of the API key the request presented (None: keys are not checked)."""


CURRENT: contextvars.ContextVar[RequestContext] = contextvars.ContextVar("evolving_router_request")


@dataclass
class AppState:
    settings: RouterHttpSettings
    backend: RouterBackend
    tokenizer: Tokenizer
    metrics: RouterMetrics
    clock: Callable[[], float]
    draining: bool = False
    background: set[asyncio.Task[None]] = field(default_factory=set)
    api_keys: ApiKeys | None = None
    limiter: KeyLimiter = field(default_factory=lambda: KeyLimiter(None))
    offloader: Offloader | None = None
    """Parses and tokenizes large bodies off the event loop."""

    async def finish(self, branch: BranchRef, trigger: FinishTrigger) -> FinishOutcome:
        """Finish `branch` through the backend (bounded by the request deadline) and count it."""
        async with asyncio.timeout(self.settings.request_timeout_s):
            outcome = await self.backend.finish_branch(branch)
        self.metrics.branch_finished(trigger, outcome)
        return outcome

    def spawn_finish(self, branch: BranchRef, trigger: FinishTrigger) -> None:
        """Finish `branch` in the background (after a request; survives the request's cancellation)."""
        task = asyncio.get_running_loop().create_task(self._finish_logged(branch, trigger))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _finish_logged(self, branch: BranchRef, trigger: FinishTrigger) -> None:
        try:
            await self.finish(branch, trigger)
        except Exception:
            log.exception("finishing branch %r (tenant %r) failed", branch.branch_id, branch.tenant)

    async def drain_background(self, timeout_s: float) -> None:
        """Wait for pending branch finishes, at most `timeout_s`."""
        pending = set(self.background)
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=dict(headers or {}), dumps=_dumps)


def error_response(exc: ApiError, headers: Mapping[str, str] | None = None) -> web.Response:
    """The OpenAI-style error answer for `exc`, with its retry headers and any extra `headers`."""
    return json_response(exc.body(), status=exc.status, headers={**(headers or {}), **exc.headers()})
