"""The gateway's aiohttp application, its background loops, and running it.

Routes (API port): `POST /v1/chat/completions`, `POST /v1/completions` (bound and forwarded),
`GET /v1/models` (forwarded to the first partition that is up), `POST /v1/branches/{branch_id}/finish`
(forwarded to the branch's partition, then its pin ends), `GET /fleet` (the fleet status: JSON, or a
table with `?format=table`), `GET /healthz`, `GET /readyz` (ready while some partition is up). Admin port:
`GET /metrics`, `/healthz`, `/readyz`.

Background loops: re-read the partition set every `refresh_s` (a failed read keeps the last good set),
probe every partition router's `/readyz` every `health_interval_s`, expire idle users and branches.

Boundary: HTTP wiring and lifecycle; identity, table, health and proxy do the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from evolving_infra.fleet.binding import BindingError, NoEligiblePartition, Requirements
from evolving_infra.fleet.partitions import FleetFileError, FleetPartition
from evolving_infra.fleet.source import PartitionSource, fetch_router_loads
from evolving_infra.fleet.status import FleetView, fleet_view, partition_row, render_table
from evolving_infra.gateway.errors import GatewayError, GatewayErrorCode, bad_request, partition_unavailable
from evolving_infra.gateway.health import Health
from evolving_infra.gateway.identity import Identity, resolve_identity
from evolving_infra.gateway.metrics import NO_PARTITION, GatewayMetrics
from evolving_infra.router.http.server import RunningServer, serve_app
from evolving_infra.gateway.proxy import PartitionDown, UpstreamTimeout, forward
from evolving_infra.gateway.settings import GatewaySettings
from evolving_infra.gateway.table import BindingTable
from evolving_infra.router.http.backend import BranchRef
from evolving_infra.router.http.branch import check_id, resolve_tenant
from evolving_infra.router.http.errors import ApiError, ErrorType
from evolving_infra.router.http.security import OPEN_PATHS, ApiKeys
from evolving_infra.settings import NoAliasLoader

from evolving_infra.core.types import BranchId

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_LENGTH = 128
CLIENT_CLOSED = 499
FLEET_SCRAPE_TIMEOUT_S = 2.0


class Endpoint(enum.Enum):
    """The routes forwarded (a bounded metrics label)."""

    CHAT = "chat_completions"
    COMPLETIONS = "completions"
    MODELS = "models"
    FINISH = "branch_finish"


@dataclass
class GatewayState:
    settings: GatewaySettings
    source: PartitionSource
    table: BindingTable
    metrics: GatewayMetrics
    health: Health
    api_keys: ApiKeys | None
    key_requirements: dict[str, Requirements]
    clock: Callable[[], float]
    partitions: dict[str, FleetPartition] = field(default_factory=dict)
    inflight: dict[str, int] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None
    refresh_error: str | None = None

    def publish_table(self) -> None:
        loads = self.table.binder.loads()
        pins: dict[str, int] = {name: 0 for name in loads}
        for partition in self.table.binder.active_branches().values():
            pins[partition] = pins.get(partition, 0) + 1
        for name, users in loads.items():
            self.metrics.users.labels(name).set(users)
            self.metrics.branches.labels(name).set(pins.get(name, 0))


STATE: web.AppKey[GatewayState] = web.AppKey("evolving_gateway_state", GatewayState)
REQUEST_ID: web.RequestKey[str] = web.RequestKey("evolving_gateway_request_id", str)
KEY_NAME: web.RequestKey[str | None] = web.RequestKey("evolving_gateway_key_name", object)  # type: ignore[arg-type]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_key_requirements(path: Path) -> dict[str, Requirements]:
    """`name: requirements` per API key name (YAML mapping); errors name the file and the key."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=NoAliasLoader)  # noqa: S506
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping of API key name to requirements")
    out: dict[str, Requirements] = {}
    for name, text in data.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise ValueError(f"{path}: {name!r}: requirements must be a string such as 'region=eu'")
        try:
            out[name] = Requirements.parse(text)
        except BindingError as exc:
            raise ValueError(f"{path}: {name}: {exc}") from None
    return out


def _error_response(exc: GatewayError | ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers())


def _request_id(request: web.Request) -> str:
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is not None and 1 <= len(given) <= MAX_REQUEST_ID_LENGTH and given.isascii() and given.isprintable():
        return given
    return uuid.uuid4().hex


@web.middleware
async def _middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    request_id = _request_id(request)
    request[REQUEST_ID] = request_id
    request[KEY_NAME] = None
    response: web.StreamResponse
    try:
        if state.api_keys is not None and request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization")
            name = state.api_keys.identify(given)
            if name is None:
                exc = GatewayError(
                    401,
                    "You didn't provide an API key." if given is None else "Incorrect API key provided.",
                    ErrorType.INVALID_REQUEST,
                    GatewayErrorCode.INVALID_API_KEY,
                )
                response = _error_response(exc)
                response.headers["WWW-Authenticate"] = 'Bearer realm="evolving-infra"'
                response.headers[REQUEST_ID_HEADER] = request_id
                return response
            request[KEY_NAME] = name
        response = await handler(request)
    except (GatewayError, ApiError) as exc:
        response = _error_response(exc)
    except web.HTTPException as exc:
        code = GatewayErrorCode.NOT_FOUND if exc.status in (404, 405) else GatewayErrorCode.INVALID_VALUE
        response = _error_response(GatewayError(exc.status, f"{exc.reason}: {request.method} {request.path}", ErrorType.INVALID_REQUEST, code))
    if not response.prepared and REQUEST_ID_HEADER not in response.headers:
        response.headers[REQUEST_ID_HEADER] = request_id
    return response


async def _read_json(request: web.Request) -> tuple[bytes, dict[str, Any] | None]:
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return raw, None  # forwarded as is: the partition router answers the bad JSON
    return raw, body if isinstance(body, dict) else None


def _no_partitions(state: GatewayState) -> GatewayError:
    why = f" ({state.refresh_error})" if state.refresh_error else ""
    return GatewayError(
        503,
        f"the gateway knows no partition yet{why}",
        ErrorType.SERVER,
        GatewayErrorCode.NO_PARTITIONS,
        should_retry=True,
        retry_after_s=state.settings.retry_after_s,
    )


async def _forward_to(
    state: GatewayState, request: web.Request, body: bytes, partition: str, endpoint: Endpoint
) -> web.StreamResponse:
    """Forward to `partition` with metrics; 503 when it is down or does not answer."""
    metrics, loop = state.metrics, asyncio.get_running_loop()
    start = loop.time()
    status = CLIENT_CLOSED
    if partition in state.health.down():
        metrics.unavailable.labels(partition).inc()
        metrics.requests.labels(partition, endpoint.value, "503").inc()
        raise partition_unavailable(partition, state.settings.retry_after_s, state.health.why(partition) or "down")
    target = state.partitions[partition]
    assert state.session is not None
    state.inflight[partition] = state.inflight.get(partition, 0) + 1
    metrics.inflight.labels(partition).inc()

    def head(code: int) -> None:
        metrics.ttfb.labels(partition, endpoint.value).observe(loop.time() - start)

    try:
        response = await forward(
            state.session,
            request,
            body,
            base_url=state.settings.upstream_url or target.router_url,
            partition=partition,
            request_id=request[REQUEST_ID],
            connect_timeout_s=state.settings.connect_timeout_s,
            total_timeout_s=state.settings.request_timeout_s,
            on_head=head,
        )
        status = response.status
        return response
    except PartitionDown as exc:
        state.health.mark(partition, False, exc.why)
        metrics.unavailable.labels(partition).inc()
        status = 503
        raise partition_unavailable(partition, state.settings.retry_after_s, exc.why) from None
    except UpstreamTimeout:
        status = 504
        raise GatewayError(
            504,
            f"partition {partition} did not answer within {state.settings.request_timeout_s:g} s",
            ErrorType.TIMEOUT,
            GatewayErrorCode.DEADLINE_EXCEEDED,
            should_retry=True,
        ) from None
    finally:
        state.inflight[partition] -= 1
        metrics.inflight.labels(partition).dec()
        metrics.requests.labels(partition, endpoint.value, str(status)).inc()
        metrics.duration.labels(partition, endpoint.value).observe(loop.time() - start)


def _completion(endpoint: Endpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        raw, body = await _read_json(request)
        key_name: str | None = request[KEY_NAME]
        try:
            identity = resolve_identity(
                request.headers,
                body,
                request[REQUEST_ID],
                key_name=key_name,
                key_requirements=state.key_requirements.get(key_name or "", Requirements()),
                user_header=state.settings.user_header,
                requirements_header=state.settings.requirements_header,
            )
        except GatewayError:
            state.metrics.requests.labels(NO_PARTITION, endpoint.value, "400").inc()
            raise
        if not state.partitions:
            raise _no_partitions(state)
        try:
            binding = state.table.route(identity, state.clock(), state.health.down())
        except NoEligiblePartition as exc:
            state.metrics.requests.labels(NO_PARTITION, endpoint.value, "400").inc()
            raise bad_request(str(exc), state.settings.requirements_header, GatewayErrorCode.NO_ELIGIBLE_PARTITION) from None
        state.metrics.bindings.labels(binding.partition, binding.reason.value).inc()
        try:
            return await _forward_to(state, request, raw, binding.partition, endpoint)
        finally:
            state.table.done(identity, state.clock())
            state.publish_table()

    return handle


def _first_up(state: GatewayState) -> str:
    down = state.health.down()
    names = sorted(state.partitions)
    if not names:
        raise _no_partitions(state)
    up = [n for n in names if n not in down]
    return up[0] if up else names[0]


async def _models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return await _forward_to(state, request, b"", _first_up(state), Endpoint.MODELS)


async def _finish_branch(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    raw, body = await _read_json(request)
    branch_id = check_id(request.match_info["branch_id"], "branch_id")
    tenant = resolve_tenant(
        request.headers,
        body.get("tenant") if body and isinstance(body.get("tenant"), str) else None,
        body.get("cache_salt") if body and isinstance(body.get("cache_salt"), str) else None,
    )
    scoped = str(BranchRef(BranchId(branch_id), tenant).scoped_id())
    partition = state.table.binder.branch_partition(scoped)
    if partition is None or partition not in state.partitions:
        return web.json_response(
            {"object": "branch.finish", "branch_id": branch_id, "tenant": tenant, "status": "not_found"}
        )
    response = await _forward_to(state, request, raw, partition, Endpoint.FINISH)
    if response.status == 200:
        state.table.finish(scoped)
        state.publish_table()
    return response


async def fleet_rows(state: GatewayState, scrape: bool) -> FleetView:
    """The fleet view as the gateway sees it (bound users, requests in flight, up/down), with the routers'
    queues when `scrape`."""
    parts = [state.partitions[k] for k in sorted(state.partitions)]
    loads: dict[str, Any] = {}
    if scrape and state.session is not None:
        loads = await fetch_router_loads(parts, state.session, FLEET_SCRAPE_TIMEOUT_S)
    bound = state.table.binder.loads()
    down = state.health.down()
    rows = [
        partition_row(
            p,
            router=loads.get(p.key),
            up=p.key not in down,
            users=bound.get(p.key, 0),
            gateway_inflight=state.inflight.get(p.key, 0),
        )
        for p in parts
    ]
    return fleet_view(rows)


async def _fleet(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    scrape = request.query.get("scrape", "1") not in ("0", "false", "no")
    view = await fleet_rows(state, scrape)
    if request.query.get("format") == "table" or "text/plain" in request.headers.get("Accept", ""):
        return web.Response(text=render_table(view) + "\n", content_type="text/plain")
    out = view.to_json()
    out["source"] = state.source.describe()
    out["refresh_error"] = state.refresh_error
    out["load_factor"] = state.table.binder.load_factor
    return web.json_response(out)


async def _healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if not state.partitions:
        return web.json_response({"status": "not_ready", "reason": "no partitions known"}, status=503)
    if len(state.health.down()) >= len(state.partitions):
        return web.json_response({"status": "not_ready", "reason": "every partition is down"}, status=503)
    return web.json_response({"status": "ready"})


async def _metrics(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return web.Response(body=state.metrics.exposition(), headers={"Content-Type": state.metrics.content_type})


# -- background ----------------------------------------------------------------------------------------------
async def refresh(state: GatewayState) -> None:
    """Read the partition set and reconcile the table; a failure keeps the last good set."""
    try:
        partitions = await state.source.load()
    except FleetFileError as exc:
        state.refresh_error = str(exc).replace("\n", "; ")
        state.metrics.refresh_failures.inc()
        log.error("partition set not updated: %s", state.refresh_error)
        return
    except Exception as exc:  # the API or the files are unreachable: keep serving the last good set
        state.refresh_error = f"{type(exc).__name__}: {exc}"
        state.metrics.refresh_failures.inc()
        log.error("partition set not updated: %s", state.refresh_error)
        return
    state.refresh_error = None
    wanted = {p.key: p for p in partitions}
    for gone in set(state.partitions) - set(wanted):
        state.health.forget(gone)
        state.metrics.forget(gone)
    moves = state.table.reconcile([p.to_binding() for p in partitions])
    for move in moves:
        if move.target is not None and move.user_key is not None:
            state.metrics.moves.labels(move.target).inc()
    if moves or set(wanted) != set(state.partitions):
        log.info("partition set: %s (%d bindings moved)", ", ".join(sorted(wanted)) or "none", len(moves))
    state.partitions = wanted
    state.metrics.partitions.set(len(wanted))
    state.publish_table()


async def _every(period_s: float, step: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(period_s)
        try:
            await step()
        except Exception:
            log.exception("gateway background step failed")


async def _background(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.session = aiohttp.ClientSession(auto_decompress=False)
    settings = state.settings

    async def probe() -> None:
        urls = {k: p.router_url for k, p in state.partitions.items()}
        assert state.session is not None
        await state.health.probe_all(state.session, urls, min(settings.health_interval_s, settings.connect_timeout_s))

    async def sweep() -> None:
        state.table.sweep(state.clock())
        state.publish_table()

    sweep_s = max(1.0, min(60.0, min(settings.user_idle_s, settings.branch_idle_s) / 10))
    await probe()
    tasks = [
        asyncio.create_task(_every(settings.refresh_s, lambda: refresh(state))),
        asyncio.create_task(_every(settings.health_interval_s, probe)),
        asyncio.create_task(_every(sweep_s, sweep)),
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await state.session.close()


def create_app(state: GatewayState) -> web.Application:
    app = web.Application(middlewares=[_middleware], client_max_size=state.settings.max_body_bytes)
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", _completion(Endpoint.CHAT))
    app.router.add_post("/v1/completions", _completion(Endpoint.COMPLETIONS))
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/branches/{branch_id}/finish", _finish_branch)
    app.router.add_get("/fleet", _fleet)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.cleanup_ctx.append(_background)
    return app


def create_admin_app(state: GatewayState) -> web.Application:
    admin = web.Application()
    admin[STATE] = state
    admin.router.add_get("/metrics", _metrics)
    admin.router.add_get("/healthz", _healthz)
    admin.router.add_get("/readyz", _readyz)
    return admin


@dataclass
class RunningGateway:
    """A started gateway: its server (the same handle as the router front end's) and the gateway's state."""

    server: RunningServer
    state: GatewayState

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def admin_url(self) -> str | None:
        return self.server.admin_url

    async def stop(self) -> None:
        await self.server.stop()


async def start_gateway(
    settings: GatewaySettings, source: PartitionSource, *, clock: Callable[[], float] = time.monotonic
) -> RunningGateway:
    """Read the partitions (a `FleetFileError` at start is raised: nothing to serve), then serve."""
    partitions = await source.load()
    state = GatewayState(
        settings=settings,
        source=source,
        table=BindingTable(
            [], load_factor=settings.load_factor, user_idle_s=settings.user_idle_s, branch_idle_s=settings.branch_idle_s
        ),
        metrics=GatewayMetrics(),
        health=Health(),
        api_keys=ApiKeys.load(settings.api_key_file) if settings.api_key_file is not None else None,
        key_requirements=load_key_requirements(settings.key_requirements_file) if settings.key_requirements_file else {},
        clock=clock,
    )
    state.health = Health(lambda name, up: state.metrics.up.labels(name).set(1 if up else 0))
    state.table.reconcile([p.to_binding() for p in partitions])
    state.partitions = {p.key: p for p in partitions}
    state.metrics.partitions.set(len(partitions))
    state.publish_table()
    runner, port = await serve_app(
        create_app(state), settings.host, settings.port, handler_cancellation=True, shutdown_timeout=settings.shutdown_grace_s
    )
    if settings.admin_port is None:
        return RunningGateway(RunningServer(runner, settings.host, port), state)
    try:
        admin_runner, admin_port = await serve_app(create_admin_app(state), settings.host, settings.admin_port)
    except BaseException:
        await runner.cleanup()
        raise
    return RunningGateway(RunningServer(runner, settings.host, port, admin_runner, admin_port), state)
