"""A live node agent's request-progress events on StreamEvents: each prefill's start (published when the
iteration that runs its first chunk launches, before that iteration's report) and finish (with the prompt
tokens the engine reused), and the queued requests a switch hands back, streamed as the switch begins,
before the drain ends and before the SwitchPhase answer.

The node runs in-process (grpc.aio on 127.0.0.1, engine sped up) and is driven through its gRPC API only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeMode
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

PT = 64
DEADLINE = 20.0


def chain(name: str, n: int, parent: int = 0) -> list[PageHash]:
    return chain_hashes((f"{name}:{i}".encode() for i in range(n)), parent)


async def scenario() -> dict[str, Any]:
    settings = NodeAgentSettings(
        node="ev", mode=NodeMode.PREFILL, grpc_port=0, metrics_port=0, metrics_enabled=False, speed_up=2.0,
        l1_pages=4096, l2_pages=4096, page_bytes=4096, state_interval_s=0, insecure=True,
    )  # fmt: skip
    node = NodeAgent(settings)
    await node.start()
    channel = grpc.aio.insecure_channel(node.address)
    stub = rpc.NodeAgentStub(channel)
    events: list[tuple[str, Any]] = []
    subscribed = asyncio.Event()

    async def watch() -> None:
        async for event in stub.StreamEvents(pb.StreamEventsRequest(subscriber="test")):
            kind = event.WhichOneof("body")
            events.append((kind, getattr(event, kind)))
            subscribed.set()

    watcher = asyncio.get_running_loop().create_task(watch())
    out: dict[str, Any] = {}
    try:
        await asyncio.wait_for(subscribed.wait(), DEADLINE)
        out["snapshot_flag"] = next(body.prefill_events for kind, body in events if kind == "state")
        shared = chain("shared", 64)
        prompts = {
            "first": shared,
            "again": shared + chain("again", 2, shared[-1]),  # reuses the first one's pages once it ran
            **{f"q{i}": chain(f"q{i}", 256) for i in range(4)},
        }
        for rid, pages in prompts.items():
            reply = await stub.SubmitPrefill(
                pb.SubmitPrefillRequest(request_id=rid, branch_id=rid, prompt_pages=pages, prompt_tokens=len(pages) * PT,
                                        t_acc=1.0)  # fmt: skip
            )
            assert reply.accepted
        started_ids = lambda: {b.request_id for k, b in events if k == "prefill_started"}  # noqa: E731
        loop = asyncio.get_running_loop()
        end = loop.time() + DEADLINE
        while not {"first", "again", "q0"} <= started_ids():
            assert loop.time() < end, "timed out waiting for the first prefills to start"
            await asyncio.sleep(0.01)
        answer_task = asyncio.ensure_future(
            stub.SwitchPhase(pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1), timeout=DEADLINE)
        )
        while not any(k == "handed_back" for k, _ in events):
            assert loop.time() < end, "timed out waiting for the hand-back event"
            await asyncio.sleep(0.005)
        out["answer_done_at_hand_back"] = answer_task.done()
        out["switch_completed_at_hand_back"] = any(k == "switch_completed" for k, _ in events)
        answer = await answer_task
        out["answer_handed"] = list(answer.handed_back)
        await asyncio.sleep(0.2)
        out["events"] = list(events)
    finally:
        watcher.cancel()
        await channel.close()
        await node.close(grace=None)
    return out


def test_prefill_starts_finishes_and_hand_backs_are_streamed() -> None:
    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    events = out["events"]
    kinds = [k for k, _ in events]
    assert out["snapshot_flag"] is True
    started = {b.request_id: (i, b) for i, (k, b) in enumerate(events) if k == "prefill_started"}
    finished = {b.request_id: (i, b) for i, (k, b) in enumerate(events) if k == "prefill_finished"}
    (handed,) = [b for k, b in events if k == "handed_back"]
    # the hand-back came while the switch was still draining, and names what the answer names, once
    assert not out["answer_done_at_hand_back"] and not out["switch_completed_at_hand_back"]
    assert list(handed.request_ids) == out["answer_handed"] and handed.request_ids
    assert handed.generation == 1 and handed.node == "ev"
    assert len(set(handed.request_ids)) == len(handed.request_ids)
    # every prefill either ran (started, then finished) or was handed back without starting
    assert set(finished) | set(handed.request_ids) == {"first", "again", "q0", "q1", "q2", "q3"}
    assert not set(started) & set(handed.request_ids) and set(started) == set(finished)
    for rid, (i, s) in started.items():
        j, f = finished[rid]
        assert i < j and s.node == f.node == "ev" and s.time <= f.time
        assert f.cached_tokens == s.cached_tokens and f.tokens == s.prompt_tokens and f.pages == f.tokens // PT
    # the engine's own measure of reuse: nothing for the first prompt, its 64 pages for the one sharing them
    assert started["first"][1].cached_tokens == 0
    assert started["again"][1].cached_tokens == 64 * PT
    # a start is published at its iteration's launch: before the report of the iteration that ran its chunk
    first_start = started["first"][0]
    first_report = next(i for i, k in enumerate(kinds) if k == "iteration" and events[i][1].prefill)
    assert first_start < first_report
