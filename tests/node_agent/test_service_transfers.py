"""Two node agents reading each other's pages at once, each with a single transfer thread.

A node's transfer threads block on the peer's `ReadPages` stream while they read. If serving a stream needed one
of those same threads, two nodes reading from each other would each wait for the other's thread until the
transfers' deadline (60 s), and every such fetch would fail and recompute. Serving runs on threads of its own, so
both reads complete. Nodes run in-process on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeMode
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.node_agent.transfer import TransportKind, TransportSettings

PAGES = 200  # about the size of the fetches that stalled a loaded local cluster


def settings(node: str) -> NodeAgentSettings:
    values: dict[str, Any] = dict(
        node=node, mode=NodeMode.PREFILL, grpc_port=0, metrics_port=0, metrics_enabled=False, speed_up=20.0,
        l2_pages=2048, l1_pages=2048, page_bytes=4096, state_interval_s=0, insecure=True, workers=1,
        transfer=TransportSettings(kind=TransportKind.GRPC),
    )  # fmt: skip
    return NodeAgentSettings(**values)


def hold(node: NodeAgent, name: str) -> list[PageHash]:
    """Pages written into `node`'s arena, as after a prefill there."""
    pages = chain_hashes(f"{name}:{i}".encode() for i in range(PAGES))
    node.arena.reserve(pages)
    for page in pages:
        node.arena.commit(page, None)
    return pages


def test_two_nodes_with_one_transfer_thread_each_read_each_others_pages_at_once() -> None:
    async def scenario() -> tuple[int, int, bool, bool]:
        a, b = NodeAgent(settings("a")), NodeAgent(settings("b"))
        await a.start()
        try:
            await b.start()
            on_a, on_b = hold(a, "a"), hold(b, "b")
            # Bounded well below the transports' 60 s deadline: a deadlock shows as a timeout here.
            from_b, from_a = await asyncio.wait_for(
                asyncio.gather(a.mover.read(b.address, on_b), b.mover.read(a.address, on_a)), 30
            )
            return len(from_b.moved), len(from_a.moved), all(p in a.arena for p in on_b), all(p in b.arena for p in on_a)
        finally:
            await a.close(grace=None)
            await b.close(grace=None)

    assert asyncio.run(scenario()) == (PAGES, PAGES, True, True)
