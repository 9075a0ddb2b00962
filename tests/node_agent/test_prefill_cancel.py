"""A prefill whose client went away is cancelled on its node, queued or running (issue 17, item 5).

Engine level (property-tested): `EngineCore.cancel_prefill` of any subset of prefills, in any stage
(waiting for host or GPU room, fetching, loading, running), keeps every pool conserved, leaves no pin or
slot of a cancelled request behind, and lets the requests queued behind it run to the end.

Service level (in-process node on 127.0.0.1, every wait bounded): the `Cancel` RPC frees the queue entry
of a queued prefill and the GPU slots of a running one, counts it (`requests_total{phase="prefill",
outcome="cancelled"}`), answers `cancelled=false` for a request the node does not hold, and the node
serves the next prefill at once. Fuzzed `Cancel` messages are answered OK or INVALID_ARGUMENT, never a crash.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.eviction import EvictionPolicyName, eviction_policy
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, NodeMode
from evolving_infra.node_agent.api.convert import prefill_request_from_proto
from evolving_infra.node_agent.engine import EngineCore
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.node_agent.service.settings import resolve_memory
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

PT = 64
DEADLINE = 20.0


def chain(name: str, n: int, parent: int = 0) -> list[PageHash]:
    return chain_hashes((f"{name}:{i}".encode() for i in range(n)), parent)


def node_settings(node: str, mode: NodeMode, **extra: Any) -> NodeAgentSettings:
    values: dict[str, Any] = dict(
        node=node, mode=mode, grpc_port=0, metrics_port=0, metrics_enabled=False, speed_up=1.0, l2_pages=2048,
        l1_pages=256, page_bytes=256, state_interval_s=0, insecure=True,
    )  # fmt: skip
    values.update(extra)
    return NodeAgentSettings(**values)


def small_engine(l1_pages: int = 64, l2_pages: int = 128) -> EngineCore:
    memory = resolve_memory(
        node_settings("x", NodeMode.PREFILL, l1_pages=l1_pages, l2_pages=l2_pages), load_profile("deepseek-v4-flash-4xh200-tp4")
    )
    return EngineCore(NodeId("x"), memory.profile, NodeMode.PREFILL, eviction_policy(EvictionPolicyName.LRU), check_invariants=True)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=6),
    st.data(),
)
def test_engine_cancel_prefill_keeps_pools_conserved_and_frees_the_queue(
    requests: list[tuple[int, bool]], data: st.DataObject
) -> None:
    engine = small_engine()
    pt = engine.profile.page_tokens
    now = 0.0
    ids: list[str] = []
    for i, (pages, fetched) in enumerate(requests):
        prompt = tuple(chain(f"p{i}", pages))
        fetch = [pb.FetchRun(peer="peer", pages=prompt[: max(1, pages // 2)])] if fetched and pages > 1 else []
        message = pb.SubmitPrefillRequest(request_id=f"r{i}", branch_id="b", prompt_pages=prompt, prompt_tokens=pages * pt,
                                          t_acc=1.0, fetch=fetch)  # fmt: skip
        engine.submit_prefill(prefill_request_from_proto(message), now)
        ids.append(f"r{i}")
    for _ in range(data.draw(st.integers(0, 4), label="steps before")):
        out = engine.step(now)
        now += max(out.duration, 0.001)
    held = set(engine.prefill_queue().queued) | {c.request for c in engine.prefill_queue().running}
    cancel = data.draw(st.lists(st.sampled_from(ids), unique=True), label="cancelled")
    for rid in cancel:
        effects = engine.cancel_prefill(rid, now)
        assert effects.applied == (rid in held)
        engine.check_invariants()
        for pool in (engine.pool.l1, engine.pool.l2):
            assert rid not in pool.owners()
    assert not engine.cancel_prefill("never-here", now).applied
    # the others run to the end (fetches complete as the driver would report them)
    finished: set[str] = set()
    for rid in held - set(cancel):
        engine.fetch_completed(rid, now)
    for _ in range(400):
        out = engine.step(now)
        finished |= {f.request for f in out.prefills_finished}
        if out.kind.value == "idle" and not engine.prefill_queue().queued and not engine.prefill_queue().running:
            break
        now += max(out.duration, 0.001)
    assert finished == held - set(cancel)
    g = engine.gauges()
    assert g.prefill_queued == g.prefill_running == 0
    assert g.pool.l1.pinned == 0 and g.pool.l2.pinned == 0


async def until(check: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def cancel_scenario() -> dict[str, Any]:
    # speed_up 1 and long prompts: a prefill runs for seconds, so it is cancelled mid-run
    node = NodeAgent(node_settings("pre", NodeMode.PREFILL, l1_pages=1024, l2_pages=4096))
    await node.start()
    out: dict[str, Any] = {}
    try:
        async with grpc.aio.insecure_channel(node.address) as channel:
            stub = rpc.NodeAgentStub(channel)
            idle = node.engine.gauges().pool.l1
            prompts = {rid: chain(rid, 600) for rid in ("running", "queued")}
            for rid, prompt in prompts.items():
                await stub.SubmitPrefill(pb.SubmitPrefillRequest(
                    request_id=rid, branch_id="b-" + rid, prompt_pages=prompt, prompt_tokens=600 * PT, t_acc=1.0,
                ))  # fmt: skip
            await until(lambda: node.engine.gauges().prefill_running == 1, "the first prefill to run")
            g = node.engine.gauges()
            out["busy"] = (g.prefill_running, g.prefill_queued, g.pool.l1.in_use + g.pool.l1.pinned)
            answer = await stub.Cancel(pb.CancelRequest(request_id="queued", reason="client disconnected"), timeout=5)
            out["queued_answer"] = (answer.prefill_cancelled, answer.decode_cancelled)
            out["after_queued"] = (node.engine.gauges().prefill_queued, node.engine.gauges().prefill_running)
            answer = await stub.Cancel(pb.CancelRequest(request_id="running"), timeout=5)
            out["running_answer"] = answer.prefill_cancelled
            g = node.engine.gauges()
            out["after"] = (g.prefill_queued, g.prefill_running, g.pool.l1.pinned, g.pool.l1.in_use - idle.in_use)
            again = await stub.Cancel(pb.CancelRequest(request_id="running"), timeout=5)
            out["again"] = (again.prefill_cancelled, again.decode_cancelled)
            try:
                await stub.Cancel(pb.CancelRequest(request_id=""), timeout=5)
                out["empty"] = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                out["empty"] = error.code()
            out["cancelled"] = node.metrics.requests.labels("prefill", "cancelled")._value.get()
            node.engine.check_invariants()
            # the node serves the next prefill at once
            events = stub.StreamEvents(pb.StreamEventsRequest(subscriber="t"))
            fresh = chain("fresh", 2)
            await stub.SubmitPrefill(pb.SubmitPrefillRequest(request_id="fresh", branch_id="b-f", prompt_pages=fresh,
                                                             prompt_tokens=2 * PT, t_acc=1.0))  # fmt: skip
            async for event in events:
                if event.WhichOneof("body") == "prefill_finished":
                    out["fresh"] = event.prefill_finished.request_id
                    break
            events.cancel()
    finally:
        await node.close()
    return out


def test_cancel_rpc_frees_a_queued_and_a_running_prefill() -> None:
    out = asyncio.run(asyncio.wait_for(cancel_scenario(), 60))
    running, queued, held = out["busy"]
    assert (running, queued) == (1, 1) and held >= 600
    assert out["queued_answer"] == (True, False)
    assert out["after_queued"] == (0, 1)
    assert out["running_answer"] is True
    assert out["after"] == (0, 0, 0, 0)
    assert out["again"] == (False, False)
    assert out["empty"] is grpc.StatusCode.INVALID_ARGUMENT
    assert out["cancelled"] == 2
    assert out["fresh"] == "fresh"


async def fuzz_cancel(messages: list[tuple[str, str]]) -> list[grpc.StatusCode]:
    node = NodeAgent(node_settings("f", NodeMode.PREFILL))
    await node.start()
    codes = []
    try:
        async with grpc.aio.insecure_channel(node.address) as channel:
            stub = rpc.NodeAgentStub(channel)
            for rid, reason in messages:
                try:
                    await stub.Cancel(pb.CancelRequest(request_id=rid, reason=reason), timeout=5)
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as error:
                    codes.append(error.code())
        assert node.runner.failure is None
    finally:
        await node.close()
    return codes


@settings(max_examples=4, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=300), st.text(max_size=400)), min_size=1, max_size=40))
def test_cancel_messages_never_crash_the_node(messages: list[tuple[str, str]]) -> None:
    codes = asyncio.run(asyncio.wait_for(fuzz_cancel(messages), 60))
    for (rid, reason), code in zip(messages, codes, strict=True):
        good_id = 0 < len(rid) <= 256 and rid.isascii() and rid.isprintable()
        good_reason = not reason[:256] or (reason[:256].isascii() and reason[:256].isprintable())
        assert code is (grpc.StatusCode.OK if good_id and good_reason else grpc.StatusCode.INVALID_ARGUMENT), (rid, reason)
