"""The aiohttp application of the router's OpenAI-compatible front end, and running it.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
`POST /v1/branches/{branch_id}/finish`, `GET /healthz` (liveness), `GET /readyz` (readiness: backend
ready and not draining). The admin application (`create_admin_app`, its own port) serves `GET /metrics`
(Prometheus text, this app's own registry and any extra ones), `/healthz` and `/readyz`.

With API keys configured (security.py) every route but the probes needs `Authorization: Bearer <key>`
(401 otherwise), completions are limited per key, and each answered request is one access log line.

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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from evolving_infra.router.http.api import Endpoint
from evolving_infra.router.http.backend import BranchRef, RouterBackend
from evolving_infra.router.http.branch import BRANCH_HEADER, check_id, resolve_tenant
from evolving_infra.router.http.completion import handle_completion, prompt_ids
from evolving_infra.router.http.offload import Offloader
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
from evolving_infra.router.http.security import OPEN_PATHS, ApiKeys, KeyLimiter, access_line, unauthorized
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
access_log = logging.getLogger("evolving_infra.router.access")

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


def _route(request: web.Request) -> str:
    """The route's pattern (`/v1/branches/{branch_id}/finish`), so the access log holds no ids."""
    info = request.match_info
    resource = info.route.resource if info.http_exception is None else None
    return resource.canonical if resource is not None else "-"


@web.middleware
async def _middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    loop = asyncio.get_running_loop()
    arrived = loop.time()
    request_id, bad_id = _request_id(request.headers)
    key: str | None = None
    token = CURRENT.set(RequestContext(request_id, arrived))
    response: web.StreamResponse | None = None
    try:
        if state.api_keys is not None and request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization")
            key = state.api_keys.identify(given)
            if key is None:
                raise unauthorized(missing=given is None)
            CURRENT.set(RequestContext(request_id, arrived, key))
        if bad_id is not None:
            raise bad_id
        if state.draining and request.path in _COMPLETION_PATHS:
            raise shutting_down(state.settings.retry_after_s)
        response = await handler(request)
    except ApiError as exc:
        response = error_response(exc)
        if exc.code is ErrorCode.INVALID_API_KEY:
            response.headers["WWW-Authenticate"] = 'Bearer realm="evolving-infra"'
    except web.HTTPException as exc:
        response = error_response(_from_http_exception(exc, request, state.settings.max_body_bytes))
    except Exception:
        log.exception("unhandled error answering %s %s", request.method, request.path)
        response = error_response(internal_error())
    finally:
        CURRENT.reset(token)
        status = response.status if response is not None else CLIENT_CLOSED
        sent = response.body_length if response is not None and response.prepared else None
        access_log.info(access_line(request_id, key, request.method, _route(request), status, loop.time() - arrived, sent))
    assert response is not None
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
        with state.limiter.hold(context.key or "-", state.settings.retry_after_s):
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


EXTRA_METRICS: web.AppKey[tuple[Callable[[], bytes], ...]] = web.AppKey("evolving_extra_metrics", tuple)


async def _metrics(request: web.Request) -> web.StreamResponse:
    metrics = request.app[STATE].metrics
    body = b"".join([metrics.exposition(), *(more() for more in request.app.get(EXTRA_METRICS, ()))])
    response = web.Response(body=body)
    response.headers["Content-Type"] = metrics.content_type
    return response


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].draining = True


async def _on_cleanup(app: web.Application) -> None:
    state = app[STATE]
    await state.drain_background(max(1.0, state.settings.shutdown_grace_s))
    if state.offloader is not None:
        state.offloader.close()


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
    tokenizer = tokenizer or load_tokenizer(settings.tokenizer, settings.tokenizer_path)
    app[STATE] = AppState(
        settings=settings,
        backend=backend,
        tokenizer=tokenizer,
        metrics=RouterMetrics(),
        clock=clock,
        api_keys=ApiKeys.load(settings.api_key_file) if settings.api_key_file is not None else None,
        limiter=KeyLimiter(settings.max_concurrent_per_key),
        offloader=Offloader(tokenizer, prompt_ids, settings.tokenize_processes),
    )
    app.router.add_post("/v1/chat/completions", _completion_handler(Endpoint.CHAT_COMPLETIONS))
    app.router.add_post("/v1/completions", _completion_handler(Endpoint.COMPLETIONS))
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/branches/{branch_id}/finish", _finish_branch)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.on_response_prepare.append(_stamp_request_id)
    app.on_shutdown.append(_on_shutdown)
    app.on_cleanup.append(_on_cleanup)
    return app


def create_admin_app(api: web.Application, extra_metrics: Sequence[Callable[[], bytes]] = ()) -> web.Application:
    """The admin application of the front end `api`: `/metrics` (its series, then each of `extra_metrics`'
    exposition), `/healthz` and `/readyz`. Serve it on a port that only the cluster reaches."""
    admin = web.Application()
    admin[STATE] = api[STATE]
    admin[EXTRA_METRICS] = tuple(extra_metrics)
    admin.router.add_get("/metrics", _metrics)
    admin.router.add_get("/healthz", _healthz)
    admin.router.add_get("/readyz", _readyz)
    return admin


@dataclass
class RunningServer:
    """A started server: where it listens, and how to stop it gracefully."""

    runner: web.AppRunner
    host: str
    port: int
    admin_runner: web.AppRunner | None = None
    admin_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str | None:
        return None if self.admin_port is None else f"http://{self.host}:{self.admin_port}"

    async def stop(self) -> None:
        """Stop accepting, drain in-flight requests (up to the grace period), finish pending work."""
        await self.runner.cleanup()
        if self.admin_runner is not None:
            await self.admin_runner.cleanup()


async def serve_app(app: web.Application, host: str, port: int, **options: Any) -> tuple[web.AppRunner, int]:
    """Start serving `app` on host:port (0: any free port); the runner and the port bound. Also used by the gateway."""
    runner = web.AppRunner(app, access_log=None, **options)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port


async def start_server(
    settings: RouterHttpSettings,
    backend: RouterBackend,
    *,
    tokenizer: Tokenizer | None = None,
    extra_metrics: Sequence[Callable[[], bytes]] = (),
) -> RunningServer:
    """Start serving on `settings.host:settings.port` (port 0: any free port), and the admin server on
    `settings.admin_port` when set. Client disconnects cancel the request's handler, which closes its
    backend stream. A connection that has not sent a complete request head within
    `header_read_timeout_s` (also the longest idle keep-alive) is closed."""
    app = create_app(settings, backend, tokenizer=tokenizer)
    offloader = app[STATE].offloader
    if offloader is not None:
        offloader.warm()  # workers start now, not on the first large body
    runner, port = await serve_app(
        app, settings.host, settings.port, handler_cancellation=True, shutdown_timeout=settings.shutdown_grace_s,
        keepalive_timeout=settings.header_read_timeout_s,
    )  # fmt: skip
    if settings.admin_port is None:
        return RunningServer(runner, settings.host, port)
    try:
        admin_runner, admin_port = await serve_app(
            create_admin_app(app, extra_metrics), settings.host, settings.admin_port,
            keepalive_timeout=settings.header_read_timeout_s,
        )  # fmt: skip
    except BaseException:
        await runner.cleanup()
        raise
    return RunningServer(runner, settings.host, port, admin_runner, admin_port)
