"""Run the live router until SIGTERM or SIGINT: node clients, the planner loop with its split applier, the
HTTP front end and the metrics endpoint; then shut down gracefully.

`serve(settings, shape, on_ready)` resolves the node agents (the static map, or the headless Service's
addresses asked for their node ids), connects, waits up to `rpc_timeout_s` for their first state reports,
starts serving, calls `on_ready(info)` with its URLs and serves. The first signal stops accepting requests,
lets in-flight ones finish (the HTTP server's grace period) and closes everything; a second one cuts it short.

Boundary: process lifetime; printing is the CLI's (`evolving_infra.cli.router`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from typing import Any

import grpc

from evolving_infra.core.types import NodeId
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.router.http import RouterHttpSettings, start_server
from evolving_infra.router.service.backend import LiveRouter
from evolving_infra.router.service.client import NodeEndpoint
from evolving_infra.router.service.metrics import MetricsServer, RouterServiceMetrics
from evolving_infra.router.service.models import ModelShape
from evolving_infra.router.service.planning import KubernetesSplitApplier, LocalSplitApplier, PlannerLoop, SplitApplier
from evolving_infra.router.service.settings import ApplierKind, RouterSettings

log = logging.getLogger(__name__)


async def resolve_endpoints(settings: RouterSettings) -> list[NodeEndpoint]:
    """The node agents: the static map, or each address of the headless Service with the node id it reports."""
    if settings.nodes:
        return [NodeEndpoint(NodeId(n), a) for n, a in sorted(settings.nodes.items())]
    assert settings.nodes_dns is not None
    host, _, port = settings.nodes_dns.rpartition(":")
    infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    out = []
    for address in sorted({f"[{i[4][0]}]:{port}" if ":" in i[4][0] else f"{i[4][0]}:{port}" for i in infos}):
        async with grpc.aio.insecure_channel(address) as channel:
            state = await rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=settings.rpc_timeout_s)
        out.append(NodeEndpoint(NodeId(state.node), address))
    if not out:
        raise OSError(f"nodes_dns {settings.nodes_dns!r} resolved to no address")
    return out


def make_applier(settings: RouterSettings, router: LiveRouter, api: Any = None) -> SplitApplier | None:
    if settings.applier is ApplierKind.LOCAL:
        return LocalSplitApplier(router)
    if settings.applier is ApplierKind.KUBERNETES:
        if api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CustomObjectsApi()
        assert settings.cluster_name is not None
        return KubernetesSplitApplier(router, api, settings.namespace, settings.cluster_name)
    return None


async def serve(settings: RouterSettings, shape: ModelShape, on_ready: Callable[[dict[str, Any]], None] | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
            pass
    metrics = RouterServiceMetrics()
    router = LiveRouter(settings, shape, await resolve_endpoints(settings), metrics)
    metrics_server = MetricsServer(metrics) if settings.metrics_enabled else None
    planner: PlannerLoop | None = None
    server = None
    try:
        await router.start()
        if not await router.wait_ready(settings.rpc_timeout_s):
            log.warning("not every node agent reported its state within %.1f s; serving with those that did",
                        settings.rpc_timeout_s)  # fmt: skip
        planner = PlannerLoop(router, make_applier(settings, router))
        planner.start()
        http = RouterHttpSettings(
            host=settings.host, port=settings.port, model_name=settings.model_name,
            request_timeout_s=settings.request_timeout_s,
        )  # fmt: skip
        server = await start_server(http, router)
        metrics_url = await metrics_server.start(settings.host, settings.metrics_port) if metrics_server else None
        if on_ready is not None:
            on_ready({"url": server.url, "metrics_url": metrics_url, "nodes": {n: e.address for n, e in router.endpoints.items()},
                      "planner": settings.planner.value, "applier": settings.applier.value})  # fmt: skip
        await stop.wait()
        log.info("router: shutting down")
        closing = asyncio.ensure_future(server.stop())
        cut = asyncio.ensure_future(hurry.wait())
        await asyncio.wait({closing, cut}, return_when=asyncio.FIRST_COMPLETED)
        cut.cancel()
        server = None if closing.done() else server
        return 0
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if planner is not None:
            await planner.close()
        await router.close()
        if metrics_server is not None:
            await metrics_server.stop()


def run(settings: RouterSettings, shape: ModelShape, on_ready: Callable[[dict[str, Any]], None] | None = None) -> int:
    return asyncio.run(serve(settings, shape, on_ready))
