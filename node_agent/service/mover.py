"""`KvMover`: pulls KV pages from peers' host memory into the local arena with the node's transport.

Transports are blocking (a gRPC stream or Mooncake batch reads), so every read runs in a worker thread
and the event loop stays free. Two uses:
- **prefill fetches** (`fetch`): the runs the engine started, one read per peer, in parallel. A failed
  run is logged, counted, and its pages returned: the engine then recomputes the prompt from the first
  page that did not arrive (nothing is made up for them);
- **decode pulls** (`pull`): the prompt KV of a decode, from the prefill node. The pages appear there
  when its prefill ends, so a read that finds pages missing is retried with backoff until a deadline.

Boundary: moving bytes and measuring them; which pages to move is the engine's (fetch) or the router's
(decode) decision.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId
from evolving_infra.node_agent.engine import FetchStarted
from evolving_infra.node_agent.service.metrics import NodeMetrics
from evolving_infra.node_agent.transfer.base import TransferResult, Transport
from evolving_infra.node_agent.transfer.errors import PageAlreadyPresent, PagesMissing, TransferError

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.005
RETRY_MAX_S = 0.1


class UnknownPeer(ValueError):
    """A fetch run names a peer with no address (none given, none configured), or an address outside the
    cluster (neither a configured peer's nor in `peer_networks`)."""


def _host_of(address: str) -> str:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise UnknownPeer(f"peer_address {address[:100]!r} must be host:port with a port 1-65535")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class PeerPolicy:
    """Which addresses the node may connect to for KV: the configured peers' addresses, and IP literals in
    `networks` (the cluster's pod network; loopback by default). Host names are followed only when they are
    a configured peer's address, so a caller can never point the node at an arbitrary host.

    Membership: once `members` is set (the addresses the cluster's node-agent Service resolves to, refreshed by
    the node agent), an IP literal must also be one of them: a fetch can only name a member of the cluster."""

    def __init__(self, peers: Mapping[str, str], networks: Sequence[str]) -> None:
        self.known = frozenset(peers.values())
        self.networks = tuple(ipaddress.ip_network(n, strict=False) for n in networks)
        self.members: frozenset[str] | None = None
        """IP addresses of the cluster's node agents (None: membership not checked)."""

    def check(self, peer: NodeId, address: str) -> str:
        if address in self.known:
            return address
        host = _host_of(address)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise UnknownPeer(f"fetch run from peer {peer!r}: {address[:100]!r} is not a configured peer's address and not an IP address") from None
        if not any(ip in net for net in self.networks):
            raise UnknownPeer(f"fetch run from peer {peer!r}: {address!r} is outside the cluster's peer networks")
        if self.members is not None and str(ip) not in self.members:
            raise UnknownPeer(f"fetch run from peer {peer!r}: {address!r} is not a member of the cluster "
                              f"({len(self.members)} node agent address(es) known)")  # fmt: skip
        return address


class KvMover:
    """Reads pages from peers with `transport` on `executor` threads (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        executor: Executor,
        metrics: NodeMetrics,
        peers: Mapping[str, str],
        networks: Sequence[str] = ("127.0.0.0/8", "::1/128"),
    ) -> None:
        self.transport = transport
        self.executor = executor
        self.metrics = metrics
        self.peers = dict(peers)
        self.policy = PeerPolicy(self.peers, networks)
        self.kind = transport.kind

    def address_of(self, peer: NodeId, given: str = "") -> str:
        """The peer's gRPC address: the one given with the run (checked against `policy`), else the
        configured one."""
        if given:
            return self.policy.check(peer, given)
        address = self.peers.get(peer, "")
        if not address:
            known = ", ".join(sorted(self.peers)) or "none"
            raise UnknownPeer(
                f"fetch run from peer {peer!r} gives no peer_address and this node knows no address for it "
                f"(configured peers: {known})"
            )
        return address

    async def read(self, address: str, pages: Sequence[PageHash]) -> TransferResult:
        """One transport read in a worker thread, measured."""
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            result = await loop.run_in_executor(self.executor, self.transport.read_pages, address, list(pages))
        except TransferError as error:
            self.metrics.transfer_failed(self.kind, type(error).__name__)
            raise
        self.metrics.transferred(self.kind, result.bytes, time.perf_counter() - start, len(result.moved))
        return result

    async def fetch(self, request: str, runs: Sequence[FetchStarted], addresses: Mapping[NodeId, str]) -> frozenset[PageHash]:
        """Pull every run of one request's fetch (parallel per peer); the pages of runs that failed (logged
        and counted, not raised), which the engine recomputes (see the module docstring)."""

        async def one(run: FetchStarted) -> tuple[PageHash, ...]:
            try:
                await self.read(self.address_of(run.peer, addresses.get(run.peer, "")), run.pages)
            except (TransferError, UnknownPeer) as error:
                log.warning("fetch of %d page(s) for %s from %s failed (recomputed): %s", len(run.pages), request, run.peer, error)
                self.metrics.fetch_fallback(len(run.pages))
                return tuple(run.pages)
            return ()

        failed = await asyncio.gather(*(one(run) for run in runs))
        return frozenset(p for pages in failed for p in pages)

    async def pull(self, address: str, pages: Sequence[PageHash], deadline: float, cancelled: Callable[[], bool]) -> TransferResult | None:
        """Read `pages` from `address`, waiting (with backoff) while the peer lacks some, until `deadline`
        (loop time). None if `cancelled()` turned True. Raises the last PagesMissing past the deadline."""
        loop = asyncio.get_running_loop()
        delay = RETRY_FIRST_S
        while True:
            if cancelled():
                return None
            try:
                return await self.read(address, pages)
            except (PagesMissing, PageAlreadyPresent):  # not there yet, or another pull is bringing it
                if loop.time() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
