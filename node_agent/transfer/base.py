"""The transport interface: how a node pulls KV pages from a peer's host arena into its own.

A transport reads pages named by hash from a peer (addressed by the peer node agent's gRPC address,
which also serves the out-of-band endpoint exchange), writes them into free slots of the local arena,
checks every page's checksum, and only then makes the pages ready. Pages the local arena already holds
are skipped. On any error the reserved slots are freed and nothing partial stays behind.

Boundary: the `Transport` Protocol, its result, its settings and the `TransportKind` enum.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from evolving_infra.core.pages import PageHash

MIB = 1 << 20
DEFAULT_CHUNK_BYTES = MIB
MAX_CHUNK_BYTES = 8 * MIB
MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + MIB
"""gRPC message size limit of page streams: the largest chunk plus room for the framing."""


class TransportKind(enum.Enum):
    """How KV pages move between nodes' host memory."""

    MOONCAKE_TCP = "mooncake-tcp"
    """Mooncake transfer engine over TCP: one-sided reads of the peer's registered arena."""
    GRPC = "grpc"
    """The peer's `ReadPages` stream: needs nothing but gRPC (the fallback)."""


@dataclass(frozen=True, slots=True)
class TransferResult:
    """Pages now ready locally: `moved` were transferred (`bytes` in total), `present` were already here."""

    peer: str
    kind: TransportKind
    moved: tuple[PageHash, ...]
    present: tuple[PageHash, ...]
    bytes: int
    requests: int
    """Transfer operations issued (Mooncake batch entries after coalescing, or gRPC stream messages)."""


class Transport(Protocol):
    """Pulls pages from a peer's host arena into the local one (see the module docstring)."""

    @property
    def kind(self) -> TransportKind: ...

    def read_pages(self, peer: str, pages: Sequence[PageHash]) -> TransferResult:
        """Make `pages` ready in the local arena, reading the missing ones from `peer` (its gRPC address)."""
        ...

    def close(self) -> None: ...


class TransportSettings(BaseModel):
    """How a node agent moves KV pages (the `transfer` section of its settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: TransportKind = Field(
        default=TransportKind.MOONCAKE_TCP,
        description="transport for pulling KV pages from peers: mooncake-tcp, or grpc (the fallback)",
    )
    chunk_bytes: int = Field(
        default=DEFAULT_CHUNK_BYTES,
        ge=4096,
        le=MAX_CHUNK_BYTES,
        description="bytes of page data per gRPC stream message (gRPC transport)",
    )
    verify_checksums: bool = Field(
        default=True, description="check each received page's xxh3-64 checksum before making it ready"
    )
    mooncake_hostname: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="address the Mooncake engine advertises to peers (host part of its rpc address)",
    )
    mooncake_batch_entries: int = Field(
        default=256, ge=1, le=65536, description="most transfer entries per Mooncake batch call"
    )
    mooncake_entry_bytes: int = Field(
        default=MIB,
        ge=4096,
        le=1 << 30,
        description="bytes per Mooncake transfer entry: longer runs of consecutive slots are cut "
        "(entries move in parallel)",
    )
