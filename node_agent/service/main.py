"""Run a node agent process until SIGTERM or SIGINT, then shut down gracefully.

`run(settings, on_ready)` starts the node (gRPC on host:grpc_port, metrics on host:metrics_port), calls
`on_ready(info)` with its addresses, and serves. On the first SIGTERM/SIGINT it stops accepting work
(new requests get UNAVAILABLE, health checks answer NOT_SERVING), lets accepted requests finish for up
to `shutdown_grace_s`, closes the event streams and the server, and returns 0 (1 if work was left
unfinished at the deadline or the engine loop failed). A second signal cuts the drain short.

Boundary: process lifetime; printing is the CLI's (`evolving_infra.cli.node_agent`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

from evolving_infra.node_agent.service.node import NodeAgent
from evolving_infra.node_agent.service.settings import NodeAgentSettings

log = logging.getLogger(__name__)


def ready_info(node: NodeAgent) -> dict[str, Any]:
    """What a started node reports: its id, addresses, mode and transport."""
    s = node.settings
    return {
        "node": node.node,
        "address": node.address,
        "metrics_address": node.metrics_address or None,
        "mooncake_address": node.mooncake_address,
        "mode": node.engine.mode.value,
        "transport": s.transfer.kind.value,
        "profile": node.memory.profile.name,
        "l1_pages": node.memory.l1_pages,
        "l2_pages": node.memory.l2_pages,
        "page_bytes": node.memory.page_bytes,
        "speed_up": s.speed_up,
    }


async def serve(settings: NodeAgentSettings, on_ready: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Serve until a signal (module docstring); returns the exit status."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    hurry = asyncio.Event()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
            pass
    node = NodeAgent(settings)
    try:
        await node.start()
        if on_ready is not None:
            on_ready(ready_info(node))
        stopped = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(node.failed.wait())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (stopped, failed):
            waiter.cancel()
        if node.failed.is_set():
            log.error("node %s: the engine loop failed; shutting down", node.node)
            await node.close()
            return 1
        log.info("node %s: draining (up to %.1f s)", node.node, settings.shutdown_grace_s)
        drain = asyncio.ensure_future(node.drain(settings.shutdown_grace_s))
        cut = asyncio.ensure_future(hurry.wait())
        await asyncio.wait({drain, cut}, return_when=asyncio.FIRST_COMPLETED)
        cut.cancel()
        drained = drain.done() and drain.result()
        drain.cancel()
        await node.close()
        return 0 if drained else 1
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run(settings: NodeAgentSettings, on_ready: Callable[[dict[str, Any]], None] | None = None) -> int:
    """`serve` on a fresh event loop."""
    return asyncio.run(serve(settings, on_ready))
