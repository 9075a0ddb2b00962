"""`GrpcTransport`: pull pages through the peer's `ReadPages` stream (the fallback transport).

The peer streams the requested pages in messages of about `chunk_bytes` (1 MiB by default), each piece
tagged with its page, offset and the page's checksum. Pieces are written straight into reserved slots
of the local arena; a page becomes ready once complete and its checksum matches. Pieces must arrive in
request order and cover each page exactly once; anything else is a protocol error.

Boundary: one peer read per call, synchronous (run it on a worker thread); no retries.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.transfer.arena import KvArena
from evolving_infra.node_agent.transfer.base import DEFAULT_CHUNK_BYTES, TransferResult, TransportKind
from evolving_infra.node_agent.transfer.channels import PeerChannels
from evolving_infra.node_agent.transfer.errors import PagesMissing, TransferFailed
from evolving_infra.proto.v1 import node_agent_pb2 as pb


class GrpcTransport:
    """Reads pages from peers' `ReadPages` streams into `arena`."""

    def __init__(
        self,
        arena: KvArena,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        verify: bool = True,
        channels: PeerChannels | None = None,
        timeout: float | None = 60.0,
    ) -> None:
        self.arena = arena
        self.chunk_bytes = chunk_bytes
        self.verify = verify
        self.timeout = timeout
        self._own_channels = channels is None
        self._channels = channels or PeerChannels()

    @property
    def kind(self) -> TransportKind:
        return TransportKind.GRPC

    def read_pages(self, peer: str, pages: Sequence[PageHash]) -> TransferResult:
        present = tuple(p for p in pages if p in self.arena)
        wanted = [p for p in dict.fromkeys(pages) if p not in self.arena]
        if not wanted:
            return TransferResult(peer, self.kind, (), present, 0, 0)
        slots = self.arena.reserve(wanted)
        pending = dict(zip(wanted, slots, strict=True))
        try:
            messages = self._receive(peer, wanted, pending)
        finally:
            for page in pending:  # whatever did not complete
                self.arena.abort(page)
        return TransferResult(peer, self.kind, tuple(wanted), present, len(wanted) * self.arena.page_bytes, messages)

    def _receive(self, peer: str, wanted: list[PageHash], pending: dict[PageHash, int]) -> int:
        """Stream `wanted` into their reserved slots, committing each page as it completes."""
        page_bytes = self.arena.page_bytes
        request = pb.ReadPagesRequest(pages=wanted, chunk_bytes=self.chunk_bytes)
        index, filled, messages = 0, 0, 0
        source = f"peer {peer} (gRPC)"
        try:
            for chunk in self._channels.stub(peer).ReadPages(request, timeout=self.timeout):
                messages += 1
                for piece in chunk.pieces:
                    if index >= len(wanted):
                        raise TransferFailed(f"{source} sent more data than the {len(wanted)} page(s) requested")
                    page = wanted[index]
                    if piece.page != page or piece.offset != filled or piece.page_bytes != page_bytes:
                        raise TransferFailed(
                            f"{source} sent a piece of page {piece.page:#018x} at offset {piece.offset} "
                            f"({piece.page_bytes}-byte page); expected page {page:#018x} at offset {filled} "
                            f"({page_bytes}-byte page)"
                        )
                    end = filled + len(piece.data)
                    if end > page_bytes or not piece.data:
                        raise TransferFailed(f"{source} sent a piece past the end of page {page:#018x}")
                    view = self.arena.slot_view(pending[page])
                    view[filled:end] = np.frombuffer(piece.data, dtype=np.uint8)
                    filled = end
                    if filled == page_bytes:
                        del pending[page]
                        self.arena.commit(page, piece.checksum if self.verify else None, source=source)
                        index, filled = index + 1, 0
        except grpc.RpcError as error:
            code = error.code()
            if code == grpc.StatusCode.NOT_FOUND:
                raise PagesMissing(peer, [p for p in wanted if p in pending]) from error
            details = error.details()
            raise TransferFailed(f"ReadPages from {peer} failed: {code.name}: {details}") from error
        if index != len(wanted):
            raise TransferFailed(f"{source} ended the stream after {index} of {len(wanted)} page(s)")
        return messages

    def close(self) -> None:
        if self._own_channels:
            self._channels.close()
