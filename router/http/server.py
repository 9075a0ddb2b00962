"""The aiohttp application of the router's OpenAI-compatible front end, and running it.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
`POST /v1/branches/{branch_id}/finish`, `GET /healthz` (liveness), `GET /readyz` (readiness: backend
ready and not draining), `GET /metrics` (Prometheus text, this app's own registry).

Every response carries `X-Request-Id` (the client's, if valid, else a generated one). Every error is
OpenAI-shaped (errors.py), including 404/405/413 from routing and body limits. On shutdown the server
stops accepting connections, answers 503 `shutting_down` to completions on kept-alive connections
(branch finishes are still taken), lets
in-flight requests run for `shutdown_grace_s`, and awaits pending branch finishes.

Boundary: HTTP wiring and lifecycle; completions are answered in completion.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from evolving_infra.router.http.api import Endpoint
from evolving_infra.router.http.backend import BranchRef, RouterBackend
from evolving_infra.router.http.branch import BRANCH_HEADER, check_id, resolve_tenant
from evolving_infra.router.http.completion import handle_completion
from evolving_infra.router.http.errors import (
    ApiError,
    BackendError,
    ErrorCode,
    ErrorType,
    api_error_for,
    deadline_error,
    internal_error,
    invalid,
    shutting_down,
)
from evolving_infra.router.http.metrics import CLIENT_CLOSED, FinishTrigger, RouterMetrics
from evolving_infra.router.http.settings import RouterHttpSettings
from evolving_infra.router.http.state import (
    CURRENT,
    REQUEST_ID_HEADER,
    AppState,
    RequestContext,
    error_response,
    json_response,
)
from evolving_infra.router.http.tokenizer import Tokenizer, load_tokenizer
from pydantic import BaseModel, ConfigDict, ValidationError

from evolving_infra.core.types import BranchId, RequestId

log = logging.getLogger(__name__)

STATE: web.AppKey[AppState] = web.AppKey("evolving_router_state", AppState)
MAX_REQUEST_ID_LENGTH = 128
_COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _request_id(headers: Any) -> tuple[RequestId, ApiError | None]:
    given = headers.get(REQUEST_ID_HEADER)
    if given is None:
        return RequestId(uuid.uuid4().hex), None
    if not 1 <= len(given) <= MAX_REQUEST_ID_LENGTH or not given.isascii() or not given.isprintable():
        error = invalid(
            f"{REQUEST_ID_HEADER}: must be 1-{MAX_REQUEST_ID_LENGTH} printable ASCII characters",
            REQUEST_ID_HEADER,
        )
        return RequestId(uuid.uuid4().hex), error
    return RequestId(given), None


_HTTP_ERRORS = {
    404: ("no such endpoint: {method} {path}", ErrorCode.NOT_FOUND),
    405: ("method {method} is not allowed on {path}", ErrorCode.METHOD_NOT_ALLOWED),
    413: ("request body is larger than the limit of {limit} bytes", ErrorCode.TOO_LARGE),
}


def _from_http_exception(exc: web.HTTPException, request: web.Request, limit: int) -> ApiError:
    template, code = _HTTP_ERRORS.get(exc.status, ("{reason}", ErrorCode.INVALID_VALUE))
    message = template.format(method=request.method, path=request.path, limit=limit, reason=exc.reason)
    if exc.status >= 500:
        return internal_error(message)
    return ApiError(exc.status, message, ErrorType.INVALID_REQUEST, code)


@web.middleware
async def _middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    request_id, bad_id = _request_id(request.headers)
    token = CURRENT.set(RequestContext(request_id, asyncio.get_running_loop().time()))
    try:
        if bad_id is not None:
            raise bad_id
        if state.draining and request.path in _COMPLETION_PATHS:
            raise shutting_down(state.settings.retry_after_s)
        response = await handler(request)
    except ApiError as exc:
        response = error_response(exc)
    except web.HTTPException as exc:
        response = error_response(_from_http_exception(exc, request, state.settings.max_body_bytes))
    except Exception:
        log.exception("unhandled error answering %s %s", request.method, request.path)
        response = error_response(internal_error())
    finally:
        CURRENT.reset(token)
    if not response.prepared:
        response.headers[REQUEST_ID_HEADER] = request_id
    return response


async def _stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Streams are prepared inside the handler, before the middleware sees the response."""
    context = CURRENT.get(None)
    if context is not None:
        response.headers[REQUEST_ID_HEADER] = context.request_id


async def _counted(
    state: AppState, endpoint: Endpoint, run: Callable[[], Awaitable[tuple[web.StreamResponse, int]]]
) -> web.StreamResponse:
    """Run a handler body, keeping the in-flight gauge, request counter and duration histogram."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    status = 500
    gauge = state.metrics.inflight.labels(endpoint=endpoint.value)
    gauge.inc()
    try:
        response, status = await run()
        return response
    except (ApiError, web.HTTPException) as exc:
        status = exc.status
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        status = CLIENT_CLOSED
        raise
    finally:
        gauge.dec()
        state.metrics.request_done(endpoint, status, loop.time() - start)


def _completion_handler(endpoint: Endpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        context = CURRENT.get()
        return await _counted(state, endpoint, lambda: handle_completion(request, state, endpoint, context))

    return handle


class _FinishBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    tenant: str | None = None
    cache_salt: str | None = None


async def _finish_branch(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]

    async def run() -> tuple[web.StreamResponse, int]:
        branch_id = check_id(request.match_info["branch_id"], "branch_id")
        raw = await request.read()
        body = _FinishBody()
        if raw.strip():
            try:
                body = _FinishBody.model_validate_json(raw, strict=True)
            except ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                param = ".".join(str(p) for p in err["loc"]) or None
                raise invalid(f"{param or 'body'}: {err['msg']}", param) from None
        tenant = resolve_tenant(request.headers, body.tenant, body.cache_salt)
        try:
            outcome = await state.finish(BranchRef(BranchId(branch_id), tenant), FinishTrigger.CALL)
        except TimeoutError:
            raise deadline_error(state.settings.request_timeout_s) from None
        except BackendError as exc:
            raise api_error_for(exc, state.settings.retry_after_s) from None
        answer = {
            "object": "branch.finish",
            "branch_id": branch_id,
            "tenant": tenant,
            "status": outcome.value,
        }
        return json_response(answer, headers={BRANCH_HEADER: branch_id}), 200

    return await _counted(state, Endpoint.BRANCH_FINISH, run)


async def _models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]

    async def run() -> tuple[web.StreamResponse, int]:
        data = [
            {"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by}
            for m in state.backend.models()
        ]
        return json_response({"object": "list", "data": data}), 200

    return await _counted(state, Endpoint.MODELS, run)


async def _healthz(request: web.Request) -> web.StreamResponse:
    return json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if state.draining:
        return json_response({"status": "not_ready", "reason": "shutting down"}, status=503)
    readiness = state.backend.readiness()
    if not readiness.ready:
        return json_response({"status": "not_ready", "reason": readiness.reason}, status=503)
    return json_response({"status": "ready"})


async def _metrics(request: web.Request) -> web.StreamResponse:
    metrics = request.app[STATE].metrics
    response = web.Response(body=metrics.exposition())
    response.headers["Content-Type"] = metrics.content_type
    return response


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].draining = True


async def _on_cleanup(app: web.Application) -> None:
    state = app[STATE]
    await state.drain_background(max(1.0, state.settings.shutdown_grace_s))


def create_app(
    settings: RouterHttpSettings,
    backend: RouterBackend,
    *,
    tokenizer: Tokenizer | None = None,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The front end as an aiohttp application. `tokenizer` defaults to the configured one; `clock` is
    the wall clock used for the `created` field."""
    app = web.Application(middlewares=[_middleware], client_max_size=settings.max_body_bytes)
    app[STATE] = AppState(
        settings=settings,
        backend=backend,
        tokenizer=tokenizer or load_tokenizer(settings.tokenizer, settings.tokenizer_path),
        metrics=RouterMetrics(),
        clock=clock,
    )
    app.router.add_post("/v1/chat/completions", _completion_handler(Endpoint.CHAT_COMPLETIONS))
    app.router.add_post("/v1/completions", _completion_handler(Endpoint.COMPLETIONS))
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/branches/{branch_id}/finish", _finish_branch)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.on_response_prepare.append(_stamp_request_id)
    app.on_shutdown.append(_on_shutdown)
    app.on_cleanup.append(_on_cleanup)
    return app


@dataclass
class RunningServer:
    """A started server: where it listens, and how to stop it gracefully."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting, drain in-flight requests (up to the grace period), finish pending work."""
        await self.runner.cleanup()


async def start_server(
    settings: RouterHttpSettings, backend: RouterBackend, *, tokenizer: Tokenizer | None = None
) -> RunningServer:
    """Start serving on `settings.host:settings.port` (port 0: any free port). Client disconnects cancel
    the request's handler, which closes its backend stream."""
    app = create_app(settings, backend, tokenizer=tokenizer)
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=settings.shutdown_grace_s, access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    port = settings.port
    addresses = runner.addresses
    if addresses:
        port = int(addresses[0][1])
    return RunningServer(runner, settings.host, port)
