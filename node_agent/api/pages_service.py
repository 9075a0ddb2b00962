"""The KV page part of the `NodeAgent` service: `ReadPages` and `GetTransferEndpoint` over a `KvArena`.

`ReadPages` pins the requested pages for the whole stream (so they cannot be released mid-read) and
sends them in messages of about `chunk_bytes` (the client's choice, capped at `MAX_CHUNK_BYTES`; 1 MiB
by default), each piece carrying the page's stored checksum. Unknown pages: NOT_FOUND naming them,
before any data is sent. `GetTransferEndpoint` publishes the Mooncake address (when this node runs an
engine), the arena's base address, length and slot size, and where the requested pages lie.

Composition: `PagesServicer` implements these two RPCs of `NodeAgentServicer` and leaves the others
UNIMPLEMENTED; the full node agent service subclasses it (or delegates to it) and adds the rest.

Boundary: serving bytes of the local arena; no engine state.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import grpc

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.api.convert import transport_kind_to_proto
from evolving_infra.node_agent.transfer.arena import KvArena, PageSlot
from evolving_infra.node_agent.transfer.base import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, TransportKind
from evolving_infra.node_agent.transfer.errors import PageNotResident
from evolving_infra.node_agent.transfer.plans import plan_chunks
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

MAX_PAGES_PER_READ = 1 << 20


class PagesServicer(rpc.NodeAgentServicer):
    """Serves pages of `arena` to peers (see the module docstring).

    `mooncake_address` is the rpc address of this node's Mooncake engine over the same arena, or None
    when the node runs none (peers then read with the gRPC transport).
    """

    def __init__(self, arena: KvArena, node: str, mooncake_address: str | None = None) -> None:
        self.arena = arena
        self.node = node
        self.mooncake_address = mooncake_address

    def transports(self) -> list[TransportKind]:
        """Transports peers can read this node with, best first."""
        kinds = [TransportKind.GRPC]
        if self.mooncake_address:
            kinds.insert(0, TransportKind.MOONCAKE_TCP)
        return kinds

    def ReadPages(  # noqa: N802
        self, request: pb.ReadPagesRequest, context: grpc.ServicerContext
    ) -> Generator[pb.PageChunk, None, None]:
        pages = [PageHash(p) for p in request.pages]
        if len(pages) > MAX_PAGES_PER_READ:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"ReadPages names {len(pages)} pages; at most {MAX_PAGES_PER_READ} per call",
            )
        chunk = request.chunk_bytes or DEFAULT_CHUNK_BYTES
        chunk = min(chunk, MAX_CHUNK_BYTES)
        try:
            with self.arena.pinned(pages) as slots:
                yield from self._stream(slots, chunk, context)
        except PageNotResident as error:
            context.abort(grpc.StatusCode.NOT_FOUND, f"node {self.node}: {error}")

    def _stream(self, slots: list[PageSlot], chunk: int, context: grpc.ServicerContext) -> Iterator[pb.PageChunk]:
        size = self.arena.page_bytes
        views = [self.arena.slot_view(s.slot) for s in slots]
        for message in plan_chunks(len(slots), size, chunk):
            if not context.is_active():
                return
            yield pb.PageChunk(
                pieces=[
                    pb.PagePiece(
                        page=slots[p.index].page,
                        offset=p.offset,
                        data=views[p.index][p.offset : p.offset + p.length].tobytes(),
                        checksum=slots[p.index].checksum,
                        page_bytes=size,
                    )
                    for p in message
                ]
            )

    def GetTransferEndpoint(  # noqa: N802
        self, request: pb.GetTransferEndpointRequest, context: grpc.ServicerContext
    ) -> pb.TransferEndpoint:
        found, missing = self.arena.locate_many(PageHash(p) for p in request.pages)
        return pb.TransferEndpoint(
            node=self.node,
            transports=[transport_kind_to_proto(k) for k in self.transports()],
            mooncake_address=self.mooncake_address or "",
            buffer_base=self.arena.base_address,
            buffer_length=self.arena.nbytes,
            slot_bytes=self.arena.page_bytes,
            slots=self.arena.slots,
            locations=[pb.PageLocation(page=s.page, slot=s.slot, checksum=s.checksum) for s in found],
            missing=missing,
        )
