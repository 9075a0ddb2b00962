"""The node agent service: the live driver of one node's engine core (asyncio + grpc.aio).

It runs the pure `EngineCore` on the wall clock (`runner`), keeps the host KV arena in step with the
engine's host tier (`kvsync`), moves KV pages between nodes with a transport (`mover`), serves the full
`evolving_infra.v1.NodeAgent` gRPC service (`servicer`, `server`), streams KV events, iteration reports
and state (`events`), exports Prometheus metrics (`metrics`) and shuts down gracefully (`main`).
Settings: `settings.NodeAgentSettings`. See docs/node-agent.md.

Boundary: I/O shell only; every scheduling and page-accounting decision is the engine core's.
"""

from evolving_infra.node_agent.service.node import NodeAgent
from evolving_infra.node_agent.service.settings import NodeAgentSettings, SettingsError, load_settings

__all__ = ["NodeAgent", "NodeAgentSettings", "SettingsError", "load_settings"]
