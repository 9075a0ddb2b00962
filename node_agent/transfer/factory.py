"""Build the transport a node agent's settings select.

Boundary: construction only. Choosing Mooncake where it cannot run raises TransportUnavailable with
the reason (no silent fallback: set `kind: grpc` where Mooncake cannot run).
"""

from __future__ import annotations

from evolving_infra.node_agent.transfer.arena import KvArena
from evolving_infra.node_agent.transfer.base import Transport, TransportKind, TransportSettings
from evolving_infra.node_agent.transfer.channels import PeerChannels
from evolving_infra.node_agent.transfer.grpc_transport import GrpcTransport
from evolving_infra.node_agent.transfer.mooncake import MooncakeTransport


def make_transport(settings: TransportSettings, arena: KvArena, channels: PeerChannels | None = None) -> Transport:
    """The transport `settings.kind` names, over `arena`, sharing `channels` when given."""
    if settings.kind is TransportKind.MOONCAKE_TCP:
        return MooncakeTransport(
            arena,
            hostname=settings.mooncake_hostname,
            verify=settings.verify_checksums,
            batch_entries=settings.mooncake_batch_entries,
            entry_bytes=settings.mooncake_entry_bytes,
            channels=channels,
        )
    return GrpcTransport(arena, chunk_bytes=settings.chunk_bytes, verify=settings.verify_checksums, channels=channels)
