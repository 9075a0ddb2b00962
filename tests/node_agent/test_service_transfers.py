"""Node agents reading each other's pages: two at once, each with a single transfer thread; and a prompt only
the prefill node's GPU tier holds, pulled after its prefill finished.

A node's transfer threads block on the peer's `ReadPages` stream while they read. If serving a stream needed one
of those same threads, two nodes reading from each other would each wait for the other's thread until the
transfers' deadline (60 s), and every such fetch would fail and recompute. Serving runs on threads of its own, so
both reads complete. Nodes run in-process on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeMode, RequestId
from evolving_infra.node_agent.engine.outputs import PrefillFinished
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.node_agent.transfer import PagesMissing, TransportKind, TransportSettings

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


def test_a_prompt_that_only_gpu_memory_holds_is_readable_once_its_prefill_finished() -> None:
    """L2 may evict pages that L1 keeps (write-through puts a page in both, each tier evicts on its own), and a
    prefill then reuses them from L1. Its decode node pulls the prompt from this node's arena: the finished
    prefill's pages are written in and kept for `decode_pull_timeout_s`, then released (L2 does not hold
    them). Before, every such pull failed NOT_FOUND, and so did each retry of the request (the retries reused
    the same L1 pages)."""

    async def scenario() -> tuple[bool, int, bool, bool]:
        a = NodeAgent(settings("a").model_copy(update={"decode_pull_timeout_s": 0.5}))
        b = NodeAgent(settings("b"))
        await a.start()
        try:
            await b.start()
            pages = chain_hashes(f"p:{i}".encode() for i in range(20))
            a.engine.pool.l1.insert_all(dict(zip(pages, (None, *pages[:-1]))), 0.0)  # L1 only, not in the arena
            try:
                await asyncio.wait_for(b.mover.read(a.address, pages), 30)
                missing_before = False
            except PagesMissing:
                missing_before = True
            done = PrefillFinished(RequestId("r"), BranchId("x"), 0.0, tuple(pages), 20 * 64, False)
            a.prefill_finished(done)
            moved = len((await asyncio.wait_for(b.mover.read(a.address, pages), 30)).moved)
            kept = all(p in a.arena for p in pages)
            await asyncio.sleep(1.5)  # past the exposure (0.5 s): released, as L2 does not hold them
            return missing_before, moved, kept, any(p in a.arena for p in pages)
        finally:
            await a.close(grace=None)
            await b.close(grace=None)

    assert asyncio.run(scenario()) == (True, 20, True, False)
