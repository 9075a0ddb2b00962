"""Run the live router until SIGTERM or SIGINT: node clients, the planner loop with its split applier, the
HTTP front end and the metrics endpoint; then shut down gracefully.

`serve(settings, shape, on_ready)` resolves the node agents (the static map, or the headless Service's
addresses asked for their node ids), connects, waits up to `rpc_timeout_s` for their first state reports,
starts serving, calls `on_ready(info)` with its URLs and serves. The first signal stops accepting requests,
lets in-flight ones finish (the HTTP server's grace period) and closes everything; a second one cuts it short.

Security (docs/security.md): the node agents are called with the cluster credentials (token and/or mutual TLS
from files) and the HTTP API checks API keys; without them the router starts only with `insecure`. The
front end's admin server on `metrics_port` serves `/metrics` (the HTTP series and the service's), never the
API port.

Boundary: process lifetime; printing is the CLI's (`evolving_infra.cli.router`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from typing import Any

from evolving_infra.core.types import NodeId
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.router.http import start_server
from evolving_infra.router.http.recording import RecordingBackend, write_recording
from evolving_infra.router.recording import TraceRecorder
from evolving_infra.router.service.backend import LiveRouter
from evolving_infra.router.service.client import NodeCredentials, NodeEndpoint, load_node_credentials, open_channel
from evolving_infra.router.service.metrics import RouterServiceMetrics
from evolving_infra.router.service.models import ModelShape
from evolving_infra.router.service.planning import ControlLoop, KubernetesSplitApplier, LocalSplitApplier, SplitApplier
from evolving_infra.router.service.settings import ApplierKind, RouterSettings

log = logging.getLogger(__name__)


def node_credentials(settings: RouterSettings) -> NodeCredentials | None:
    """The cluster credentials from the settings' files (None: insecure; raises CredentialsError)."""
    s = settings
    return load_node_credentials(s.cluster_token_file, s.tls_cert_file, s.tls_key_file, s.tls_ca_file, s.insecure, s.tls_server_name)


def check_api_keys(settings: RouterSettings) -> None:
    """A router without API keys serves only when `insecure` says so."""
    if settings.api_key_file is None and not settings.insecure:
        raise ValueError("no API keys: give api_key_file (--api-key-file), or --insecure to serve the API without keys")


async def resolve_endpoints(settings: RouterSettings, credentials: NodeCredentials | None = None) -> list[NodeEndpoint]:
    """The node agents: the static map, or each address of the headless Service with the node id it reports."""
    if settings.nodes:
        return [NodeEndpoint(NodeId(n), a, credentials) for n, a in sorted(settings.nodes.items())]
    assert settings.nodes_dns is not None
    host, _, port = settings.nodes_dns.rpartition(":")
    infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    out = []
    hosts = {str(i[4][0]) for i in infos}  # an IPv4 or IPv6 address (SOCK_STREAM answers)
    for address in sorted({f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts}):
        async with open_channel(address, credentials) as channel:
            metadata = credentials.metadata() if credentials is not None else ()
            state = await rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=settings.rpc_timeout_s, metadata=metadata)
        out.append(NodeEndpoint(NodeId(state.node), address, credentials))
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
    check_api_keys(settings)
    credentials = node_credentials(settings)
    metrics = RouterServiceMetrics()
    router = LiveRouter(settings, shape, await resolve_endpoints(settings, credentials), metrics)
    planner: ControlLoop | None = None
    server = None
    recorder: TraceRecorder | None = None
    try:
        await router.start()
        if not await router.wait_ready(settings.rpc_timeout_s):
            log.warning("not every node agent reported its state within %.1f s; serving with those that did",
                        settings.rpc_timeout_s)  # fmt: skip
        planner = ControlLoop(router, make_applier(settings, router))
        planner.start()
        http = settings.http(context_tokens=shape.l1_tokens)
        recorder = TraceRecorder(shape.page_tokens, time_scale=settings.record_time_scale) if settings.record_trace else None
        backend = RecordingBackend(router, recorder, router.now) if recorder is not None else router
        server = await start_server(http, backend, extra_metrics=[metrics.exposition])
        metrics_url = f"{server.admin_url}/metrics" if server.admin_url else None
        if on_ready is not None:
            on_ready({"url": server.url, "metrics_url": metrics_url, "nodes": {n: e.address for n, e in router.endpoints.items()},
                      "planner": settings.planner, "applier": settings.applier.value})  # fmt: skip
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
        write_recording(settings.record_trace, recorder, settings.record_models, router.control.models.fitted, shape.name)


def run(settings: RouterSettings, shape: ModelShape, on_ready: Callable[[dict[str, Any]], None] | None = None) -> int:
    return asyncio.run(serve(settings, shape, on_ready))
