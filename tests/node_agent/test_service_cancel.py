"""A decode whose caller goes away is cancelled on the node, running or queued: the engine drops it, its
GPU pages are freed, the staged prompt pages are released and it is counted. In-process nodes on
127.0.0.1 (engines sped up); every wait bounded. The engine's `cancel_decode` is also property-tested
against the pool's conservation invariant.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeMode, Tier
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

PT = 64
DEADLINE = 20.0


def chain(name: str, n: int, parent: int = 0) -> list[PageHash]:
    return chain_hashes((f"{name}:{i}".encode() for i in range(n)), parent)


def node_settings(node: str, mode: NodeMode, **extra: Any) -> NodeAgentSettings:
    values: dict[str, Any] = dict(
        node=node, mode=mode, grpc_port=0, metrics_port=0, metrics_enabled=False, speed_up=5.0, l2_pages=2048,
        l1_pages=256, page_bytes=256, state_interval_s=0, decode_pull_timeout_s=10, insecure=True,
    )  # fmt: skip
    values.update(extra)
    return NodeAgentSettings(**values)


async def until(check: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def decode_request(rid: str, prompt: list[PageHash], tokens: int, output: int, source: NodeAgent) -> pb.SubmitDecodeRequest:
    return pb.SubmitDecodeRequest(
        request_id=rid, branch_id="b-" + rid, prompt_pages=prompt, prompt_tokens=tokens, output_tokens=output,
        t_acc=1.0, fetch=[pb.FetchRun(peer=source.node, pages=prompt, peer_address=source.address)],
    )  # fmt: skip


async def scenario() -> dict[str, Any]:
    a = NodeAgent(node_settings("pre", NodeMode.PREFILL))
    b = NodeAgent(node_settings("dec", NodeMode.DECODE))
    await a.start()
    await b.start()
    out: dict[str, Any] = {}
    try:
        async with grpc.aio.insecure_channel(a.address) as ca, grpc.aio.insecure_channel(b.address) as cb:
            sa, sb = rpc.NodeAgentStub(ca), rpc.NodeAgentStub(cb)
            idle_in_use = b.engine.gauges().pool.l1.in_use
            # two prompts prefilled on the prefill node
            prompts = {rid: chain(rid, 8) for rid in ("long", "queued")}
            for rid, prompt in prompts.items():
                await sa.SubmitPrefill(pb.SubmitPrefillRequest(request_id=rid, branch_id="b-" + rid, prompt_pages=prompt,
                                                               prompt_tokens=8 * PT, t_acc=1.0))  # fmt: skip
            # "long" asks for almost every GPU page and runs for a long time; "queued" waits behind it
            long_call = sb.SubmitDecode(decode_request("long", prompts["long"], 8 * PT, 200 * PT, a), timeout=DEADLINE)
            first = [await long_call.read() for _ in range(2)]
            out["long_started"] = [m.WhichOneof("progress") for m in first]
            queued_call = sb.SubmitDecode(decode_request("queued", prompts["queued"], 8 * PT, 100 * PT, a), timeout=DEADLINE)
            await until(lambda: b.engine.gauges().decode_queued == 1, "the second decode to queue")
            out["busy"] = (b.engine.gauges().decode_running, b.engine.gauges().decode_queued, b.engine.gauges().pool.l1.in_use)
            queued_call.cancel()
            await until(lambda: b.engine.gauges().decode_queued == 0, "the queued decode to be dropped")
            long_call.cancel()
            await until(lambda: b.engine.gauges().decode_running == 0, "the running decode to be dropped")
            g = b.engine.gauges()
            out["after"] = (g.decode_running, g.decode_queued, g.pool.l1.in_use - idle_in_use, len(b.decodes))
            out["cancelled"] = b.metrics.requests.labels("decode", "cancelled")._value.get()
            b.engine.check_invariants()
            # the node serves the next decode at once
            fresh = chain("fresh", 2)
            await sa.SubmitPrefill(pb.SubmitPrefillRequest(request_id="fresh", branch_id="b-f", prompt_pages=fresh,
                                                           prompt_tokens=2 * PT, t_acc=1.0))  # fmt: skip
            progress = [m async for m in sb.SubmitDecode(decode_request("fresh", fresh, 2 * PT, 5, a), timeout=DEADLINE)]
            out["fresh"] = progress[-1].finished.output_tokens
    finally:
        await a.close()
        await b.close()
    return out


def test_a_caller_going_away_cancels_its_running_and_queued_decodes() -> None:
    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert out["long_started"] == ["accepted", "tokens"]
    running, queued, in_use = out["busy"]
    assert (running, queued) == (1, 1) and in_use >= 200
    assert out["after"] == (0, 0, 0, 0)
    assert out["cancelled"] == 2
    assert out["fresh"] == 5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 400)), min_size=1, max_size=6), st.data())
def test_engine_cancel_keeps_the_pool_conserved(requests: list[tuple[int, int]], data: st.DataObject) -> None:
    from evolving_infra.core.eviction import EvictionPolicyName, eviction_policy
    from evolving_infra.node_agent.engine import DecodeRequest, EngineCore
    from evolving_infra.node_agent.profiles import load_profile
    from evolving_infra.node_agent.service.settings import resolve_memory

    memory = resolve_memory(node_settings("x", NodeMode.DECODE), load_profile("deepseek-v4-flash-4xh200-tp4"))
    engine = EngineCore("x", memory.profile, NodeMode.DECODE, eviction_policy(EvictionPolicyName.LRU), check_invariants=True)  # type: ignore[arg-type]
    now = 0.0
    ids = []
    for i, (pages, output) in enumerate(requests):
        prompt = tuple(chain(f"c{i}", pages))
        engine.submit_decode(DecodeRequest(f"r{i}", "b", prompt, pages * PT, output, 1.0), now)  # type: ignore[arg-type]
        ids.append(f"r{i}")
    for _ in range(data.draw(st.integers(0, 5))):
        out = engine.step(now)
        now += max(out.duration, 0.001)
    for rid in data.draw(st.permutations(ids)):
        engine.cancel_decode(rid, now)
        engine.check_invariants()
    g = engine.gauges()
    assert g.decode_running == g.decode_queued == 0
    assert g.pool.l1.in_use == 0 and g.pool.l1.pinned == 0
    assert g.pool.l1.free + g.pool.l1.cached == g.pool.l1.capacity


async def counts_scenario() -> dict[str, Any]:
    node = NodeAgent(node_settings("c", NodeMode.PREFILL))
    await node.start()
    out: dict[str, Any] = {}
    try:
        async with grpc.aio.insecure_channel(node.address) as channel:
            stub = rpc.NodeAgentStub(channel)
            pages = chain("counted", 4)
            await stub.SubmitPrefill(pb.SubmitPrefillRequest(request_id="w", branch_id="b", prompt_pages=pages,
                                                             prompt_tokens=4 * PT + 1, t_acc=1.0))  # fmt: skip
            await until(lambda: set(pages) <= node.engine.resident(Tier.HOST), "the prompt in host memory")

            async def update():  # type: ignore[no-untyped-def]
                yield pb.CountUpdate(sequence=1, pages=pages, counts=[3, 3, 2, 1])

            await stub.PushCounts(update())
            out["pushed"] = [node.engine.pool.count(p) for p in pages]
            for name in ("test", "router"):
                stream = stub.StreamEvents(pb.StreamEventsRequest(subscriber=name))
                await stream.read()
                out[name] = [node.engine.pool.count(p) for p in pages]
                stream.cancel()
            node.engine.check_invariants()
    finally:
        await node.close()
    return out


def test_a_new_router_subscription_clears_counts_a_previous_router_pushed() -> None:
    out = asyncio.run(asyncio.wait_for(counts_scenario(), 60))
    assert out["pushed"] == [3, 3, 2, 1]
    assert out["test"] == [3, 3, 2, 1]  # other subscribers change nothing
    assert out["router"] == [0, 0, 0, 0]


async def cancel_rpc_scenario() -> dict[str, Any]:
    a = NodeAgent(node_settings("pre", NodeMode.PREFILL))
    b = NodeAgent(node_settings("dec", NodeMode.DECODE))
    await a.start()
    await b.start()
    out: dict[str, Any] = {}
    try:
        async with grpc.aio.insecure_channel(a.address) as ca, grpc.aio.insecure_channel(b.address) as cb:
            sa, sb = rpc.NodeAgentStub(ca), rpc.NodeAgentStub(cb)
            prompt = chain("rpc", 8)
            await sa.SubmitPrefill(pb.SubmitPrefillRequest(request_id="r", branch_id="b-r", prompt_pages=prompt,
                                                           prompt_tokens=8 * PT, t_acc=1.0))  # fmt: skip
            call = sb.SubmitDecode(decode_request("r", prompt, 8 * PT, 200 * PT, a), timeout=DEADLINE)
            out["started"] = [(await call.read()).WhichOneof("progress") for _ in range(2)]
            answer = await sb.Cancel(pb.CancelRequest(request_id="r", reason="test"), timeout=5)
            out["answer"] = (answer.prefill_cancelled, answer.decode_cancelled)
            try:
                while (await call.read()) is not grpc.aio.EOF:
                    pass
                out["stream"] = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                out["stream"] = error.code()
            await until(lambda: b.engine.gauges().decode_running == 0, "the decode to be dropped")
            out["cancelled"] = b.metrics.requests.labels("decode", "cancelled")._value.get()
            b.engine.check_invariants()
    finally:
        await a.close()
        await b.close()
    return out


def test_the_cancel_rpc_drops_a_running_decode_and_ends_its_stream() -> None:
    out = asyncio.run(asyncio.wait_for(cancel_rpc_scenario(), 60))
    assert out["started"] == ["accepted", "tokens"]
    assert out["answer"] == (False, True)
    assert out["stream"] is grpc.StatusCode.CANCELLED
    assert out["cancelled"] == 1
