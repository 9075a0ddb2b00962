"""The node agent's grpc.aio server: the `NodeAgent` servicer, standard health checking
(`grpc.health.v1.Health`, for "" and `evolving_infra.v1.NodeAgent`) and server reflection, bound to one
address. Wildcard hosts are refused unless explicitly allowed (the settings' `allow_wildcard_host`).

Boundary: server lifetime only (the asyncio counterpart of `node_agent.api.server`).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from evolving_infra.node_agent.api.server import SERVICE_NAME, WILDCARDS
from evolving_infra.node_agent.transfer.channels import CHANNEL_OPTIONS
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc


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
    servicer: rpc.NodeAgentServicer, host: str, port: int, *, allow_wildcard: bool = False
) -> AioServer:
    """Serve `servicer` on host:port (0: any free port) with health and reflection."""
    if host.strip() in WILDCARDS and not allow_wildcard:
        raise ValueError(f"refusing to bind the wildcard address {host!r}: give the node's own address, e.g. 127.0.0.1")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    rpc.add_NodeAgentServicer_to_server(servicer, server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    bound = server.add_insecure_port(f"{shown}:{port}")
    if bound == 0:
        raise OSError(f"could not bind {shown}:{port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    return AioServer(server, f"{shown}:{bound}", checks)
