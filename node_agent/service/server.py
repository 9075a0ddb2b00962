"""The node agent's grpc.aio server: the `NodeAgent` servicer, standard health checking
(`grpc.health.v1.Health`, for "" and `evolving_infra.v1.NodeAgent`) and server reflection, bound to one
address. Wildcard hosts are refused unless explicitly allowed (the settings' `allow_wildcard_host`).
Calls are authenticated by the cluster credentials (`api.auth`): a token interceptor and/or mutual TLS.

Boundary: server lifetime only (the asyncio counterpart of `node_agent.api.server`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from evolving_infra.node_agent.api.auth import ClusterCredentials, server_credentials, server_interceptors
from evolving_infra.node_agent.api.server import SERVICE_NAME, WILDCARDS
from evolving_infra.node_agent.transfer.channels import CHANNEL_OPTIONS
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

SERVER_OPTIONS = (
    *CHANNEL_OPTIONS,
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_concurrent_streams", 4096),
)
"""Page-stream sizes, keepalive pings both ways (a hung peer is noticed within ~15 s), and the router's
own pings (every 10 s, also without calls) permitted."""


@dataclass
class AioServer:
    server: grpc.aio.Server
    address: str
    """host:port the server listens on."""
    health: health.aio.HealthServicer

    async def not_serving(self) -> None:
        """Report NOT_SERVING to health checks (the node is draining for shutdown)."""
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_aio_server(
    servicer: rpc.NodeAgentServicer,
    host: str,
    port: int,
    *,
    allow_wildcard: bool = False,
    credentials: ClusterCredentials | None = None,
    on_denied: Callable[[str], None] | None = None,
) -> AioServer:
    """Serve `servicer` on host:port (0: any free port) with health and reflection. `credentials`: the
    cluster token checked on every call but health checks, and/or mutual TLS (None: insecure)."""
    if host.strip() in WILDCARDS and not allow_wildcard:
        raise ValueError(f"refusing to bind the wildcard address {host!r}: give the node's own address, e.g. 127.0.0.1")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    creds = credentials or ClusterCredentials(insecure=True)
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=server_interceptors(creds, on_denied))
    rpc.add_NodeAgentServicer_to_server(servicer, server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    tls = server_credentials(creds)
    bound = server.add_secure_port(f"{shown}:{port}", tls) if tls else server.add_insecure_port(f"{shown}:{port}")
    if bound == 0:
        raise OSError(f"could not bind {shown}:{port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    return AioServer(server, f"{shown}:{bound}", checks)
