"""`MooncakeTransport`: one-sided reads of a peer's host arena with the Mooncake transfer engine (TCP).

Setup: the engine starts with the P2P handshake (no metadata server) on the TCP protocol and registers
the whole local arena once. A read first asks the peer node agent over gRPC (`GetTransferEndpoint`)
for its Mooncake rpc address, arena base address, slot size, and the slots and checksums of the wanted
pages (the out-of-band exchange); it then reserves local slots, coalesces the pages into runs that are
consecutive on both sides, pulls them with batched synchronous reads, and commits each page only if
its checksum matches what the peer reported. Runs are cut into entries of about `entry_bytes` (1 MiB),
which the engine moves in parallel. A peer may evict and reuse a slot between the exchange
and the read (one-sided reads cannot pin); the checksum catches it and the read fails cleanly.

Network exposure: the engine listens on the wildcard address whatever hostname it is given, so tests
and benchmarks run it inside a private loopback-only network namespace.

Needs the `mooncake-transfer-engine-non-cuda` wheel and the system library libibverbs (no RDMA card);
`mooncake_unavailable()` says why it cannot load, or None.

Boundary: I/O shell around the engine; no retries, no fallback (the caller picks another transport).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.transfer.arena import KvArena
from evolving_infra.node_agent.transfer.base import TransferResult, TransportKind
from evolving_infra.node_agent.transfer.channels import PeerChannels
from evolving_infra.node_agent.transfer.errors import (
    PagesMissing,
    TransferFailed,
    TransportUnavailable,
)
from evolving_infra.node_agent.transfer.plans import coalesce_runs
from evolving_infra.proto.v1 import node_agent_pb2 as pb

INSTALL_HINT = "pip install mooncake-transfer-engine-non-cuda"
IBVERBS_HINT = "install the system library libibverbs1 (Debian/Ubuntu: apt-get install -y libibverbs1)"


def _engine_class() -> Any:
    """The Mooncake `TransferEngine` class, or TransportUnavailable saying what to install."""
    try:
        from mooncake.engine import TransferEngine
    except ModuleNotFoundError as error:
        if error.name and error.name.startswith("mooncake"):
            raise TransportUnavailable(f"the Mooncake transfer engine is not installed ({INSTALL_HINT})") from error
        raise TransportUnavailable(f"the Mooncake transfer engine failed to load: {error}") from error
    except ImportError as error:
        if "libibverbs" in str(error):
            hint = f"the Mooncake transfer engine needs libibverbs: {IBVERBS_HINT} ({error})"
            raise TransportUnavailable(hint) from error
        raise TransportUnavailable(f"the Mooncake transfer engine failed to load: {error}") from error
    return TransferEngine


def mooncake_unavailable() -> str | None:
    """Why the Mooncake engine cannot load here, or None when it can."""
    try:
        _engine_class()
    except TransportUnavailable as error:
        return str(error)
    return None


class MooncakeTransport:
    """Starts a Mooncake engine over `arena` and reads peers' arenas with it (see the module docstring)."""

    def __init__(
        self,
        arena: KvArena,
        *,
        hostname: str = "127.0.0.1",
        verify: bool = True,
        batch_entries: int = 256,
        entry_bytes: int = 1 << 20,
        channels: PeerChannels | None = None,
        timeout: float | None = 60.0,
    ) -> None:
        if batch_entries < 1:
            raise ValueError(f"batch_entries must be >= 1, got {batch_entries}")
        if entry_bytes < 1:
            raise ValueError(f"entry_bytes must be >= 1, got {entry_bytes}")
        engine = _engine_class()()
        rc = engine.initialize(hostname, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise TransportUnavailable(f"Mooncake engine failed to start on {hostname} over TCP (code {rc})")
        rc = engine.register_memory(arena.base_address, arena.nbytes)
        if rc != 0:
            raise TransportUnavailable(
                f"Mooncake engine could not register the {arena.nbytes}-byte host arena (code {rc})"
            )
        self._engine: Any = engine
        self.arena = arena
        self.hostname = hostname
        self.verify = verify
        self.batch_entries = batch_entries
        self.entry_pages = max(1, entry_bytes // arena.page_bytes)
        """Most pages per transfer entry: runs longer than this are cut (entries run in parallel)."""
        self.timeout = timeout
        self.address = f"{hostname}:{engine.get_rpc_port()}"
        """This engine's rpc address, which peers read from (published by `GetTransferEndpoint`)."""
        self._own_channels = channels is None
        self._channels = channels or PeerChannels()

    @property
    def kind(self) -> TransportKind:
        return TransportKind.MOONCAKE_TCP

    def endpoint(self, peer: str, pages: Sequence[PageHash]) -> pb.TransferEndpoint:
        """Ask peer `peer` (gRPC address) for its transfer endpoint and the locations of `pages`."""
        try:
            return self._channels.stub(peer).GetTransferEndpoint(
                pb.GetTransferEndpointRequest(pages=pages), timeout=self.timeout
            )
        except grpc.RpcError as error:
            code = error.code()
            details = error.details()
            raise TransferFailed(f"GetTransferEndpoint of {peer} failed: {code.name}: {details}") from error

    def read_pages(self, peer: str, pages: Sequence[PageHash]) -> TransferResult:
        present = tuple(p for p in pages if p in self.arena)
        wanted = [p for p in dict.fromkeys(pages) if p not in self.arena]
        if not wanted:
            return TransferResult(peer, self.kind, (), present, 0, 0)
        endpoint = self.endpoint(peer, wanted)
        if endpoint.missing:
            raise PagesMissing(peer, endpoint.missing)
        if not endpoint.mooncake_address:
            raise TransportUnavailable(f"peer {peer} runs no Mooncake engine; read from it with the gRPC transport")
        if endpoint.slot_bytes != self.arena.page_bytes:
            raise TransferFailed(
                f"peer {peer} has {endpoint.slot_bytes}-byte page slots; this node's are {self.arena.page_bytes}"
            )
        located = {loc.page: loc for loc in endpoint.locations}
        if set(located) != set(wanted):
            raise TransferFailed(f"peer {peer} answered locations for other pages than requested")
        for loc in located.values():
            if (loc.slot + 1) * endpoint.slot_bytes > endpoint.buffer_length:
                raise TransferFailed(f"peer {peer} placed page {loc.page:#018x} at slot {loc.slot}, outside its arena")
        slots = self.arena.reserve(wanted)
        pending = dict(zip(wanted, slots, strict=True))
        try:
            requests = self._read_runs(endpoint, [(pending[p], located[p].slot) for p in wanted])
            source = f"peer {peer} (Mooncake {endpoint.mooncake_address})"
            for page in wanted:
                del pending[page]
                self.arena.commit(page, located[page].checksum if self.verify else None, source=source)
        finally:
            for page in pending:
                self.arena.abort(page)
        return TransferResult(peer, self.kind, tuple(wanted), present, len(wanted) * self.arena.page_bytes, requests)

    def _read_runs(self, endpoint: pb.TransferEndpoint, pairs: list[tuple[int, int]]) -> int:
        """Read (local slot, remote slot) pairs with batched reads; returns the transfer entries issued."""
        size = self.arena.page_bytes
        runs = coalesce_runs(pairs, self.entry_pages)
        for start in range(0, len(runs), self.batch_entries):
            batch = runs[start : start + self.batch_entries]
            rc = self._engine.batch_transfer_sync_read(
                endpoint.mooncake_address,
                [self.arena.address_of(run.local) for run in batch],
                [endpoint.buffer_base + run.remote * size for run in batch],
                [run.count * size for run in batch],
            )
            if rc != 0:
                raise TransferFailed(
                    f"Mooncake read of {sum(r.count for r in batch)} page(s) from {endpoint.mooncake_address} "
                    f"failed (code {rc}; the peer may have stopped, or its arena changed)"
                )
        return len(runs)

    def close(self) -> None:
        """Unregister the arena and drop the engine (its listeners close with it)."""
        if self._engine is not None:
            self._engine.unregister_memory(self.arena.base_address)
            self._engine = None
        if self._own_channels:
            self._channels.close()
