"""Live node agents on loopback: KV moved between a prefill node and a decode node over gRPC and over
Mooncake TCP, a phase switch under load, switch generations, and the metrics endpoint.

Nodes run in-process (grpc.aio servers on 127.0.0.1, engines sped up) and are driven only through
their gRPC API, as the router and the operator would; the tests also look at a node's arena and engine
to check bytes and counts. The Mooncake engine listens on the wildcard address, so its variant runs this
file as a script inside a private loopback-only network namespace (as test_transfer_mooncake.py does)
and skips with the reason where none can be made. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeMode, Tier
from evolving_infra.node_agent.api.convert import iteration_from_proto, kv_batch_from_proto
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.node_agent.service.errors import REJECT_REASON_KEY
from evolving_infra.node_agent.transfer import (
    GrpcTransport,
    KvArena,
    TransportKind,
    TransportSettings,
    emulated_checksum,
)
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.router.directory import KvDirectory

PT = 64
DEADLINE = 20.0


# --- helpers -------------------------------------------------------------------------------------------
def node_settings(node: str, mode: NodeMode, kind: TransportKind = TransportKind.GRPC, **extra: Any) -> NodeAgentSettings:
    values: dict[str, Any] = dict(
        node=node, mode=mode, grpc_port=0, metrics_port=0, speed_up=20.0, l2_pages=2048, l1_pages=2048,
        page_bytes=4096, state_interval_s=0, transfer=TransportSettings(kind=kind), decode_pull_timeout_s=10,
        insecure=True,
    )
    values.update(extra)
    return NodeAgentSettings(**values)


def chain(name: str, n: int, parent: int = 0) -> list[PageHash]:
    return chain_hashes((f"{name}:{i}".encode() for i in range(n)), parent)


def intact(arena: KvArena, pages: list[PageHash]) -> bool:
    return all(
        p in arena and arena.locate(p).checksum == emulated_checksum(p, arena.page_bytes) and arena.verify(p)
        for p in pages
    )


def stub(node: NodeAgent) -> tuple[grpc.aio.Channel, rpc.NodeAgentStub]:
    channel = grpc.aio.insecure_channel(node.address)
    return channel, rpc.NodeAgentStub(channel)


async def until(check: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Watcher:
    """Feeds a node's StreamEvents into a shared KV directory; keeps sequences and reports."""

    def __init__(self, node: NodeAgent, directory: KvDirectory) -> None:
        self.channel, self.stub = stub(node)
        self.directory = directory
        self.sequences: list[int] = []
        self.iterations: list[Any] = []
        self.switches: list[pb.SwitchCompleted] = []
        self.subscribed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())

    @classmethod
    async def start(cls, node: NodeAgent, directory: KvDirectory) -> Watcher:
        """A watcher whose subscription is in place (its first message, the state snapshot, arrived)."""
        watcher = cls(node, directory)
        await asyncio.wait_for(watcher.subscribed.wait(), DEADLINE)
        return watcher

    async def _run(self) -> None:
        async for event in self.stub.StreamEvents(pb.StreamEventsRequest(subscriber="test")):
            self.subscribed.set()
            self.sequences.append(event.sequence)
            kind = event.WhichOneof("body")
            if kind == "kv":
                self.directory.apply_all(kv_batch_from_proto(event.kv))
            elif kind == "iteration":
                self.iterations.append(iteration_from_proto(event.iteration))
            elif kind == "switch_completed":
                self.switches.append(event.switch_completed)

    async def close(self) -> None:
        self.task.cancel()
        await self.channel.close()


async def decode_stream(node_stub: rpc.NodeAgentStub, request: pb.SubmitDecodeRequest) -> list[pb.DecodeProgress]:
    return [m async for m in node_stub.SubmitDecode(request, timeout=DEADLINE)]


async def metrics_text(node: NodeAgent) -> str:
    url = f"http://{node.metrics_address}/metrics"
    return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())


# --- scenario: prefill on one node, decode on another ------------------------------------------------------
async def two_nodes(kind: TransportKind) -> dict[str, Any]:
    a = NodeAgent(node_settings("pre", NodeMode.PREFILL, kind))
    b = NodeAgent(node_settings("dec", NodeMode.DECODE, kind))
    await a.start()
    await b.start()
    directory = KvDirectory()
    watchers = [await Watcher.start(a, directory), await Watcher.start(b, directory)]
    ca, sa = stub(a)
    cb, sb = stub(b)
    out: dict[str, Any] = {}
    try:
        prompt = chain("r1", 40)
        generated = chain("r1-gen", 2, prompt[-1])
        tokens1 = 40 * PT + 10
        accepted = await sa.SubmitPrefill(
            pb.SubmitPrefillRequest(request_id="r1", branch_id="b", prompt_pages=prompt, prompt_tokens=tokens1, t_acc=1.0)
        )
        decode = pb.SubmitDecodeRequest(
            request_id="r1", branch_id="b", prompt_pages=prompt, prompt_tokens=tokens1, output_tokens=118, t_acc=2.0,
            fetch=[pb.FetchRun(peer="pre", pages=prompt, peer_address=a.address)],
            generated_pages=pb.PageList(pages=generated),
        )
        progress = await asyncio.wait_for(decode_stream(sb, decode), DEADLINE)
        kinds = [m.WhichOneof("progress") for m in progress]
        out["prefill_accepted"] = accepted.accepted
        out["decode_kinds"] = [kinds[0], kinds[-1], set(kinds[1:-1]) == {"tokens"}]
        out["decode_tokens"] = sum(m.tokens.new_tokens for m in progress if m.WhichOneof("progress") == "tokens")
        out["decode_finished"] = progress[-1].finished.output_tokens
        out["decode_node_intact"] = intact(b.arena, prompt)
        # the next turn prefills on the prefill node, fetching the generated pages from the decode node
        extra = chain("r2", 20, generated[-1])
        prompt2 = prompt + generated + extra
        await sa.SubmitPrefill(
            pb.SubmitPrefillRequest(
                request_id="r2", branch_id="b", prompt_pages=prompt2, prompt_tokens=len(prompt2) * PT + 5, t_acc=1.0,
                fetch=[pb.FetchRun(peer="dec", pages=generated, peer_address=b.address)],
            )
        )
        both = prompt + generated

        def seen_on_both() -> bool:
            return all(directory.holders(p, Tier.HOST) == frozenset({"pre", "dec"}) for p in both) and all(
                "pre" in directory.holders(p, Tier.HOST) for p in extra
            )

        await until(seen_on_both, "KV events showing both copies")
        out["both_copies"] = True
        out["prefill_node_intact"] = intact(a.arena, prompt2)
        out["fetch_moved_bytes"] = a.metrics.transfer_bytes.labels(kind.value)._value.get()
        out["decode_moved_bytes"] = b.metrics.transfer_bytes.labels(kind.value)._value.get()
        out["fallback_pages"] = a.metrics.fallback_pages._value.get() + b.metrics.fallback_pages._value.get()

        async def counts() -> Any:
            yield pb.CountUpdate(sequence=1, pages=prompt, counts=[3] * len(prompt))
            yield pb.CountUpdate(sequence=2, pages=generated, counts=[0, 2])

        pushed = await sa.PushCounts(counts())
        out["pushed"] = [pushed.updates, pushed.pages]
        out["counts"] = [a.engine.pool.count(prompt[0]), a.engine.pool.count(generated[0]), a.engine.pool.count(generated[1])]
        out["gap_free"] = all(w.sequences == list(range(1, len(w.sequences) + 1)) for w in watchers)
        out["iterations"] = sorted({r.phase.value for w in watchers for r in w.iterations})
        text = await metrics_text(b)
        out["metrics_transfer_series"] = f'evolving_node_kv_transfer_bytes_total{{transport="{kind.value}"}}' in text
    finally:
        for w in watchers:
            await w.close()
        await ca.close()
        await cb.close()
        await a.close()
        await b.close()
    return out


def check_two_nodes(out: dict[str, Any], kind: TransportKind) -> None:
    assert out["prefill_accepted"]
    assert out["decode_kinds"] == ["accepted", "finished", True]
    assert out["decode_tokens"] == out["decode_finished"] == 118
    assert out["decode_node_intact"] and out["prefill_node_intact"]
    assert out["both_copies"]
    page_bytes = 4096
    assert out["decode_moved_bytes"] == 40 * page_bytes  # the prompt, pulled by the decode node
    assert out["fetch_moved_bytes"] == 2 * page_bytes  # the generated pages, fetched by the prefill node
    assert out["fallback_pages"] == 0
    assert out["pushed"] == [2, 42]
    assert out["counts"] == [3, 0, 2]
    assert out["gap_free"]
    assert out["iterations"] == ["decode", "prefill"]
    assert out["metrics_transfer_series"]


def test_prefill_and_decode_on_two_nodes_over_grpc() -> None:
    out = asyncio.run(asyncio.wait_for(two_nodes(TransportKind.GRPC), 60))
    check_two_nodes(out, TransportKind.GRPC)


def test_prefill_and_decode_on_two_nodes_over_mooncake() -> None:
    from evolving_infra.cli.bench_transfer import netns_unavailable, private_netns_command
    from evolving_infra.node_agent.transfer import mooncake_unavailable

    reason = netns_unavailable()
    if reason:
        pytest.skip(f"Mooncake tests need a private loopback-only network namespace: {reason}")
    reason = mooncake_unavailable()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "MC_LOG_LEVEL": "ERROR"}
    argv = private_netns_command([sys.executable, str(Path(__file__).resolve()), "mooncake"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"mooncake scenario failed:\n{done.stderr[-4000:]}"
    check_two_nodes(json.loads(done.stdout.strip().splitlines()[-1]), TransportKind.MOONCAKE_TCP)


# --- phase switch under load ----------------------------------------------------------------------------
async def switch_under_load() -> None:
    a = NodeAgent(node_settings("sw", NodeMode.PREFILL, speed_up=2.0, l1_pages=4096, l2_pages=4096))
    await a.start()
    directory = KvDirectory()
    watcher = await Watcher.start(a, directory)
    channel, sa = stub(a)
    try:
        prompts = {f"q{i}": chain(f"q{i}", 256) for i in range(5)}
        for rid, pages in prompts.items():
            reply = await sa.SubmitPrefill(
                pb.SubmitPrefillRequest(request_id=rid, branch_id=rid, prompt_pages=pages, prompt_tokens=256 * PT + 10, t_acc=1.0)
            )
            assert reply.accepted
        switched = await sa.SwitchPhase(pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1), timeout=DEADLINE)
        handed = list(switched.handed_back)
        finished = [rid for rid in prompts if rid not in handed]
        assert switched.phase == pb.PHASE_DECODE and switched.generation == 1 and not switched.already_serving
        assert len(set(handed)) == len(handed) and set(handed) < set(prompts)  # none lost, none twice
        assert handed and finished  # queued ones came back, the running one finished in place
        assert switched.drain_seconds > 0 and switched.switch_seconds >= switched.drain_seconds
        for rid in finished:  # ran to the end: all its KV is in host memory, and the events say so
            assert intact(a.arena, prompts[rid])
            await until(lambda r=rid: all("sw" in directory.holders(p, Tier.HOST) for p in prompts[r]), "events")
        for rid in handed:  # never ran here
            assert not any(p in a.arena or p in directory for p in prompts[rid])
        state = await sa.GetState(pb.GetStateRequest())
        assert (state.mode, state.switch_state, state.generation) == (pb.NODE_MODE_DECODE, pb.SWITCH_STATE_SWITCHED, 1)
        assert state.prefill_queued == state.prefill_running == 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await sa.SubmitPrefill(
                pb.SubmitPrefillRequest(request_id="late", branch_id="x", prompt_pages=[], prompt_tokens=10, t_acc=1.0)
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (REJECT_REASON_KEY, "REJECT_REASON_WRONG_PHASE") in tuple(refused.value.trailing_metadata())
        # it now serves decode: the finished prefill's KV is local, so the decode needs no fetch
        done = finished[0]
        progress = await decode_stream(
            sa,
            pb.SubmitDecodeRequest(
                request_id=done, branch_id=done, prompt_pages=prompts[done], prompt_tokens=256 * PT + 10,
                output_tokens=20, t_acc=2.0,
            ),
        )
        assert progress[-1].finished.output_tokens == 20
        # its host KV stays readable by peers
        reader = KvArena(512, a.arena.page_bytes)
        result = await asyncio.to_thread(GrpcTransport(reader).read_pages, a.address, prompts[done])
        assert len(result.moved) == 256 and intact(reader, prompts[done])
        assert [s.generation for s in watcher.switches] == [1]
        text = await metrics_text(a)
        for series in (
            'evolving_node_phase_switches_total{source="prefill",target="decode"} 1.0',
            'evolving_node_mode{mode="decode"} 1.0',
            'evolving_node_iteration_duration_seconds_count{phase="prefill"}',
            'evolving_node_kv_pages{state="cached",tier="host"}',
            'evolving_node_queued_requests{phase="prefill"} 0.0',
            "evolving_node_phase_switch_duration_seconds_count 1.0",
            f'evolving_node_requests_total{{outcome="handed_back",phase="prefill"}} {float(len(handed))}',
            'evolving_node_kv_served_bytes_total',
        ):
            assert series in text, series
    finally:
        await watcher.close()
        await channel.close()
        await a.close()


def test_phase_switch_under_load_hands_back_queued_and_finishes_running() -> None:
    asyncio.run(asyncio.wait_for(switch_under_load(), 60))


async def decode_switch() -> None:
    a = NodeAgent(node_settings("dsw", NodeMode.DECODE, speed_up=5.0, l1_pages=64))
    await a.start()
    channel, sa = stub(a)
    try:
        def decode(rid: str, **extra: Any) -> pb.SubmitDecodeRequest:
            return pb.SubmitDecodeRequest(request_id=rid, branch_id=rid, t_acc=8.0, **extra)

        running = sa.SubmitDecode(decode("d1", prompt_tokens=10, output_tokens=2560), timeout=DEADLINE)
        assert (await running.read()).accepted.queue_position == 0
        queued = sa.SubmitDecode(decode("d2", prompt_tokens=10, output_tokens=2560), timeout=DEADLINE)
        assert (await queued.read()).accepted.accepted  # only one fits in GPU memory at a time
        pages = chain("d3", 2)  # this node lacks them: the decode waits in its pull
        waiting = sa.SubmitDecode(
            decode("d3", prompt_pages=pages, prompt_tokens=2 * PT, output_tokens=4,
                   fetch=[pb.FetchRun(peer="self", pages=pages, peer_address=a.address)]),
            timeout=DEADLINE,
        )
        waiting_task = asyncio.ensure_future(waiting.read())
        await until(lambda: len(a.decodes) == 3, "the third decode to wait for its KV")
        assert a.engine.gauges().decode_running == 1 and a.engine.gauges().decode_queued == 1
        switched = await sa.SwitchPhase(pb.SwitchPhaseRequest(target=pb.PHASE_PREFILL, generation=1), timeout=DEADLINE)
        assert list(switched.handed_back) == ["d2", "d3"] and switched.drain_seconds > 0
        for read in (queued.read(), waiting_task):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await read
            assert error.value.code() == grpc.StatusCode.ABORTED and "handed back" in (error.value.details() or "")
        rest = []
        while (message := await running.read()) is not grpc.aio.EOF:
            rest.append(message)
        assert rest[-1].finished.output_tokens == 2560
        assert len(a.decodes) == 0 and a.engine.mode is NodeMode.PREFILL
    finally:
        await channel.close()
        await a.close()


def test_switch_away_from_decode_hands_back_queued_and_waiting_decodes() -> None:
    asyncio.run(asyncio.wait_for(decode_switch(), 60))


# --- switch generations ---------------------------------------------------------------------------------
async def generations() -> None:
    a = NodeAgent(node_settings("gen", NodeMode.DECODE))
    await a.start()
    watcher = await Watcher.start(a, KvDirectory())
    channel, sa = stub(a)

    async def switch(target: int, generation: int) -> pb.SwitchPhaseResponse:
        return await sa.SwitchPhase(pb.SwitchPhaseRequest(target=target, generation=generation), timeout=DEADLINE)

    async def refused(target: int, generation: int) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await switch(target, generation)
        return error.value.code()

    try:
        first = await switch(pb.PHASE_PREFILL, 1)
        assert (first.phase, first.already_serving) == (pb.PHASE_PREFILL, False)
        again = await switch(pb.PHASE_PREFILL, 1)
        assert (again.phase, again.generation, again.already_serving) == (pb.PHASE_PREFILL, 1, True)
        assert await refused(pb.PHASE_DECODE, 0) == grpc.StatusCode.FAILED_PRECONDITION  # stale
        assert await refused(pb.PHASE_DECODE, 1) == grpc.StatusCode.FAILED_PRECONDITION  # 1 already meant prefill
        assert await refused(pb.PHASE_UNSPECIFIED, 5) == grpc.StatusCode.INVALID_ARGUMENT
        adopted = await switch(pb.PHASE_PREFILL, 2)
        assert adopted.already_serving and (await sa.GetState(pb.GetStateRequest())).generation == 2
        back = await switch(pb.PHASE_DECODE, 3)
        assert (back.phase, back.already_serving) == (pb.PHASE_DECODE, False)
        state = await sa.GetState(pb.GetStateRequest())
        assert (state.mode, state.generation) == (pb.NODE_MODE_DECODE, 3)
        await until(lambda: len(watcher.switches) == 2, "switch reports")
        assert [(s.generation, s.target) for s in watcher.switches] == [(1, pb.NODE_MODE_PREFILL), (3, pb.NODE_MODE_DECODE)]
    finally:
        await watcher.close()
        await channel.close()
        await a.close()


def test_switch_phase_is_idempotent_by_generation_and_refuses_stale_ones() -> None:
    asyncio.run(asyncio.wait_for(generations(), 60))


# --- refusals -------------------------------------------------------------------------------------------
async def refusals() -> None:
    a = NodeAgent(node_settings("err", NodeMode.DECODE, l1_pages=64, decode_pull_timeout_s=0.3))
    await a.start()
    channel, sa = stub(a)

    async def code_of(request: pb.SubmitDecodeRequest) -> tuple[grpc.StatusCode, str, str]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await decode_stream(sa, request)
        reason = dict(error.value.trailing_metadata() or ()).get(REJECT_REASON_KEY, "")
        return error.value.code(), reason, error.value.details() or ""

    def decode(rid: str, pages: list[PageHash], tokens: int, out: int = 8, **extra: Any) -> pb.SubmitDecodeRequest:
        return pb.SubmitDecodeRequest(
            request_id=rid, branch_id="b", prompt_pages=pages, prompt_tokens=tokens, output_tokens=out, t_acc=1.0, **extra
        )

    try:
        pages = chain("e", 4)
        code, reason, _ = await code_of(decode("big", [], 10, out=64 * PT))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "REJECT_REASON_TOO_LARGE")
        code, _, details = await code_of(decode("short", pages[:3], 4 * PT))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "4 full page(s)" in details
        code, _, details = await code_of(decode("nowhere", pages, 4 * PT))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "neither held" in details
        unknown = decode("peerless", pages, 4 * PT, fetch=[pb.FetchRun(peer="ghost", pages=pages)])
        code, _, details = await code_of(unknown)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "ghost" in details
        absent = decode("absent", pages, 4 * PT, fetch=[pb.FetchRun(peer="self", pages=pages, peer_address=a.address)])
        code, _, details = await code_of(absent)  # this node never holds them: the wait ends
        assert code == grpc.StatusCode.NOT_FOUND and "does not hold 4" in details
        assert len(a.decodes) == 0 and len(a.arena) == 0  # nothing left staged
        with pytest.raises(grpc.aio.AioRpcError) as wrong:
            await sa.SubmitPrefill(pb.SubmitPrefillRequest(request_id="p", branch_id="b", prompt_tokens=10, t_acc=1.0))
        assert wrong.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        stream = sa.SubmitDecode(decode("twice", [], 10, out=400), timeout=DEADLINE)
        assert (await stream.read()).WhichOneof("progress") == "accepted"
        code, reason, _ = await code_of(decode("twice", [], 10))
        assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "REJECT_REASON_DUPLICATE")
        stream.cancel()
    finally:
        await channel.close()
        await a.close()


def test_refusals_map_to_specific_status_codes() -> None:
    asyncio.run(asyncio.wait_for(refusals(), 60))


if __name__ == "__main__":
    from evolving_infra.cli.bench_transfer import bring_loopback_up

    bring_loopback_up()  # refuses unless this is a loopback-only namespace
    result = asyncio.run(asyncio.wait_for(two_nodes(TransportKind(sys.argv[1] if sys.argv[1] != "mooncake" else "mooncake-tcp")), 90))
    print(json.dumps(result))
