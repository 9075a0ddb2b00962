"""KV data plane of a node: the host KV arena (L2 as real memory) and the transports that move pages
between nodes' arenas (Mooncake TCP, and the gRPC `ReadPages` stream as fallback).

Boundary: I/O lives here (memory maps, the Mooncake engine, gRPC clients), never in the pure engine
core; the engine decides which pages to fetch, this package moves their bytes. See docs/api.md.
"""

from evolving_infra.node_agent.transfer.arena import ArenaGauges, KvArena, PageSlot
from evolving_infra.node_agent.transfer.base import (
    DEFAULT_CHUNK_BYTES,
    TransferResult,
    Transport,
    TransportKind,
    TransportSettings,
)
from evolving_infra.node_agent.transfer.channels import PeerChannels
from evolving_infra.node_agent.transfer.content import demo_chain, emulated_checksum, emulated_page, page_checksum
from evolving_infra.node_agent.transfer.errors import (
    ArenaFull,
    ChecksumMismatch,
    PageAlreadyPresent,
    PageNotResident,
    PagePinned,
    PagesMissing,
    TransferError,
    TransferFailed,
    TransportUnavailable,
    WrongSlotState,
)
from evolving_infra.node_agent.transfer.factory import make_transport
from evolving_infra.node_agent.transfer.grpc_transport import GrpcTransport
from evolving_infra.node_agent.transfer.mooncake import MooncakeTransport, mooncake_unavailable

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ArenaFull",
    "ArenaGauges",
    "ChecksumMismatch",
    "GrpcTransport",
    "KvArena",
    "MooncakeTransport",
    "PageAlreadyPresent",
    "PageNotResident",
    "PagePinned",
    "PageSlot",
    "PagesMissing",
    "PeerChannels",
    "TransferError",
    "TransferFailed",
    "TransferResult",
    "Transport",
    "TransportKind",
    "TransportSettings",
    "TransportUnavailable",
    "WrongSlotState",
    "demo_chain",
    "emulated_checksum",
    "emulated_page",
    "make_transport",
    "mooncake_unavailable",
]
