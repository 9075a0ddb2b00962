"""Assemble a node agent gRPC server: a `NodeAgent` servicer, standard health checking
(`grpc.health.v1.Health`) and server reflection, bound to one explicit address (never a wildcard).

Boundary: server lifetime only; the servicer decides what each RPC does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from evolving_infra.node_agent.transfer.channels import CHANNEL_OPTIONS
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["NodeAgent"].full_name
"""`evolving_infra.v1.NodeAgent`, the name health checks and reflection use."""

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


@dataclass
class RunningServer:
    server: grpc.Server
    address: str
    """host:port the server listens on."""
    health: health.HealthServicer

    def stop(self, grace: float | None = 1.0) -> None:
        """Report NOT_SERVING, then stop (waiting up to `grace` seconds for running calls)."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


def start_server(
    servicer: rpc.NodeAgentServicer, *, host: str = "127.0.0.1", port: int = 0, workers: int = 8
) -> RunningServer:
    """Start serving `servicer` on host:port (port 0: any free port) with health and reflection."""
    if host in WILDCARDS:
        raise ValueError(f"refusing to bind the wildcard address {host!r}: give the node's own address, e.g. 127.0.0.1")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    server = grpc.server(ThreadPoolExecutor(max_workers=workers), options=CHANNEL_OPTIONS)
    rpc.add_NodeAgentServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    bound_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    bound = server.add_insecure_port(f"{bound_host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind {bound_host}:{port}")
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, f"{bound_host}:{bound}", health_servicer)
