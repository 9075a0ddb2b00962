"""Live node agents: the prefill queue in state reports, and the three switch modes of SwitchPhase (in place,
in place then strand the KV, relaunch after a downtime).

Nodes run in-process on 127.0.0.1 with engines sped up and are driven through their gRPC API only (the tests
also look at a node's arena and engine to check what the API says). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from evolving_infra.core.kv_events import KvCleared
from evolving_infra.core.types import NodeMode, Tier
from evolving_infra.node_agent.api.convert import kv_batch_from_proto
from evolving_infra.node_agent.service import NodeAgent
from evolving_infra.proto.convert import prefill_queue_from_proto
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.directory import KvDirectory

from tests.node_agent.test_service_live import DEADLINE, PT, chain, node_settings, stub, until


class Events:
    """Every message of one StreamEvents subscription, kept in order (KV events also fed to a directory)."""

    def __init__(self, node: NodeAgent) -> None:
        self.channel, self.stub = stub(node)
        self.messages: list[pb.NodeEvent] = []
        self.directory = KvDirectory()
        self.subscribed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async for event in self.stub.StreamEvents(pb.StreamEventsRequest(subscriber="test")):
            self.messages.append(event)
            if event.WhichOneof("body") == "kv":
                self.directory.apply_all(kv_batch_from_proto(event.kv))
            self.subscribed.set()

    def bodies(self, kind: str) -> list[Any]:
        return [getattr(m, kind) for m in self.messages if m.WhichOneof("body") == kind]

    async def close(self) -> None:
        self.task.cancel()
        await self.channel.close()


def prefill(rid: str, pages: int, extra_tokens: int = 10) -> pb.SubmitPrefillRequest:
    return pb.SubmitPrefillRequest(
        request_id=rid, branch_id=rid, prompt_pages=chain(rid, pages), prompt_tokens=pages * PT + extra_tokens, t_acc=1.0
    )


async def start(name: str, mode: NodeMode, **extra: Any) -> tuple[NodeAgent, Events, grpc.aio.Channel, Any]:
    node = NodeAgent(node_settings(name, mode, **extra))
    await node.start()
    events = Events(node)
    await asyncio.wait_for(events.subscribed.wait(), DEADLINE)
    channel, node_stub = stub(node)
    return node, events, channel, node_stub


# --- the prefill queue in reports ----------------------------------------------------------------------
async def queue_reports() -> None:
    a, events, channel, sa = await start("qr", NodeMode.PREFILL, speed_up=4.0, l1_pages=4096, l2_pages=4096)
    try:
        ids = [f"r{i}" for i in range(4)]
        for rid in ids:
            assert (await sa.SubmitPrefill(prefill(rid, 512))).accepted
        await until(lambda: a.engine.gauges().prefill_queued + a.engine.gauges().prefill_running == 0, "the prefills")
        reports = [q for q in (prefill_queue_from_proto(s) for s in events.bodies("state")) if q is not None]
        busy = [q for q in reports if q.running or q.queued]
        assert busy, "no state report listed the prefills while they ran"
        for q in busy:  # each lists distinct requests, queued ones in arrival order, none running and queued
            listed = [r[0] for r in q.running] + list(q.queued)
            assert len(set(listed)) == len(listed) and set(listed) <= set(ids)
            assert list(q.queued) == [rid for rid in ids if rid in q.queued]
            assert all(0 < remaining <= 512 * PT + 10 and context >= 0 for _, remaining, context in q.running)
        # while the first one ran, the other three were reported queued behind it
        assert any([r[0] for r in q.running] == ["r0"] and list(q.queued) == ids[1:] for q in busy)
        # a running prefill's remaining tokens shrink from report to report
        r0 = [dict((r[0], r[1]) for r in q.running)["r0"] for q in busy if any(r[0] == "r0" for r in q.running)]
        assert r0 == sorted(r0, reverse=True) and len(set(r0)) > 1
        await until(lambda: prefill_queue_from_proto(events.bodies("state")[-1]) == ((), ()) or
                    (lambda q: q is not None and not q.running and not q.queued)(prefill_queue_from_proto(events.bodies("state")[-1])),
                    "a final report with an empty queue")
        state = await sa.GetState(pb.GetStateRequest())
        assert state.prefill_queue_reported and not state.running_prefills and not state.queued_prefills
    finally:
        await events.close()
        await channel.close()
        await a.close()


def test_state_reports_carry_the_prefill_queue_at_each_step_while_prefills_are_held() -> None:
    asyncio.run(asyncio.wait_for(queue_reports(), 60))


# --- relaunch --------------------------------------------------------------------------------------------
DOWNTIME = 6.0
"""Node seconds (speed_up 4: 1.5 wall seconds)."""


async def relaunch() -> None:
    a, events, channel, sa = await start("rl", NodeMode.PREFILL, speed_up=4.0, l1_pages=4096, l2_pages=4096)
    try:
        assert (await sa.SubmitPrefill(prefill("done", 8))).accepted
        await until(lambda: a.engine.gauges().prefill_running + a.engine.gauges().prefill_queued == 0, "the first prefill")
        await until(lambda: len(events.directory.holders(chain("done", 8)[0], Tier.HOST)) == 1, "its KV in the directory")
        assert len(a.arena) == 8
        held = [f"q{i}" for i in range(3)]
        for rid in held:
            assert (await sa.SubmitPrefill(prefill(rid, 256))).accepted
        await until(lambda: a.engine.gauges().prefill_running == 1, "a running prefill")
        request = pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1, mode=pb.SWITCH_MODE_RELAUNCH,
                                        relaunch_seconds=DOWNTIME)  # fmt: skip
        call = asyncio.ensure_future(sa.SwitchPhase(request, timeout=DEADLINE))
        await until(lambda: a.relaunching, "the relaunch to begin")
        # serving nothing: reports say so, and work is refused as UNAVAILABLE (retry elsewhere)
        state = await sa.GetState(pb.GetStateRequest())
        assert (state.mode, state.switch_state, state.generation) == (pb.NODE_MODE_UNSPECIFIED, pb.SWITCH_STATE_RELAUNCHING, 1)
        for refused in (sa.SubmitPrefill(prefill("late", 2)),
                        sa.SubmitDecode(pb.SubmitDecodeRequest(request_id="d", branch_id="d", prompt_tokens=5, output_tokens=3, t_acc=1.0)).read()):  # fmt: skip
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await refused
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE and "relaunching" in (error.value.details() or "")
        modes = {m.value: a.metrics.mode.labels(m.value)._value.get() for m in NodeMode}
        assert set(modes.values()) == {0.0}  # the mode gauge names no mode while it serves nothing
        joined = await sa.SwitchPhase(request, timeout=DEADLINE)  # a retry of the same call waits for the same relaunch
        answer = await call
        assert (answer.phase, answer.generation, answer.already_serving) == (pb.PHASE_DECODE, 1, False)
        assert sorted(answer.handed_back) == held and answer.switch_seconds >= DOWNTIME
        assert (joined.phase, joined.generation) == (pb.PHASE_DECODE, 1) and not joined.handed_back
        # the stream: the hand-back and a clear of every tier at once, a report saying it serves nothing, then
        # the new phase
        kinds = [m.WhichOneof("body") for m in events.messages]
        handed = events.bodies("handed_back")
        assert len(handed) == 1 and sorted(handed[0].request_ids) == held and handed[0].generation == 1
        cleared = [e for b in events.bodies("kv") for e in kv_batch_from_proto(b) if isinstance(e, KvCleared)]
        assert cleared[-1].tier is None and cleared[-1].node == "rl"
        states = events.bodies("state")
        relaunching = [s for s in states if s.switch_state == pb.SWITCH_STATE_RELAUNCHING]
        assert relaunching and all(s.mode == pb.NODE_MODE_UNSPECIFIED for s in relaunching)
        await until(lambda: events.bodies("switch_completed"), "the switch report")
        done = events.bodies("switch_completed")[-1]
        assert (done.source, done.target, done.generation) == (pb.NODE_MODE_PREFILL, pb.NODE_MODE_DECODE, 1)
        assert done.completed - done.began >= DOWNTIME and done.handed_back == 3
        assert kinds.index("handed_back") < kinds.index("switch_completed")
        assert "prefill_finished" not in kinds[kinds.index("handed_back"):]  # the terminated engine publishes nothing
        # the KV is gone: directory, arena and engine agree; the fresh engine serves decode
        assert events.directory.page_count == 0 and len(a.arena) == 0
        assert not a.engine.resident(Tier.GPU) and not a.engine.resident(Tier.HOST)
        state = await sa.GetState(pb.GetStateRequest())
        assert (state.mode, state.generation) == (pb.NODE_MODE_DECODE, 1) and state.l2.cached == 0
        progress = [m async for m in sa.SubmitDecode(pb.SubmitDecodeRequest(
            request_id="after", branch_id="after", prompt_tokens=20, output_tokens=5, t_acc=1.0), timeout=DEADLINE)]  # fmt: skip
        assert progress[-1].finished.output_tokens == 5
        assert a.metrics.mode.labels("decode")._value.get() == 1.0
        again = await sa.SwitchPhase(request, timeout=DEADLINE)  # idempotent by generation
        assert again.already_serving and not again.handed_back
    finally:
        await events.close()
        await channel.close()
        await a.close()


def test_relaunch_hands_everything_back_clears_kv_serves_nothing_for_the_downtime_then_the_new_phase() -> None:
    asyncio.run(asyncio.wait_for(relaunch(), 60))


async def relaunch_decode() -> None:
    a, events, channel, sa = await start("rd", NodeMode.DECODE, speed_up=5.0, l1_pages=4096)
    try:
        running = sa.SubmitDecode(pb.SubmitDecodeRequest(request_id="d1", branch_id="d1", prompt_tokens=10,
                                                         output_tokens=100_000, t_acc=1.0), timeout=DEADLINE)  # fmt: skip
        assert (await running.read()).accepted.accepted
        request = pb.SwitchPhaseRequest(target=pb.PHASE_PREFILL, generation=4, mode=pb.SWITCH_MODE_RELAUNCH, relaunch_seconds=1.0)
        answer = await sa.SwitchPhase(request, timeout=DEADLINE)
        assert list(answer.handed_back) == ["d1"] and answer.phase == pb.PHASE_PREFILL
        with pytest.raises(grpc.aio.AioRpcError) as error:
            while (await running.read()) is not grpc.aio.EOF:
                pass
        assert error.value.code() == grpc.StatusCode.ABORTED and "relaunch" in (error.value.details() or "")
        assert len(a.decodes) == 0 and a.engine.mode is NodeMode.PREFILL
    finally:
        await events.close()
        await channel.close()
        await a.close()


def test_relaunch_ends_running_decode_streams_with_aborted() -> None:
    asyncio.run(asyncio.wait_for(relaunch_decode(), 60))


# --- in place, stranding the KV ----------------------------------------------------------------------------
async def strand() -> None:
    a, events, channel, sa = await start("st", NodeMode.PREFILL, speed_up=10.0, l1_pages=4096, l2_pages=4096)
    try:
        assert (await sa.SubmitPrefill(prefill("kept", 16))).accepted
        await until(lambda: len(a.arena) == 16, "the prefill's KV in host memory")
        await until(lambda: events.directory.page_count == 16, "its pages in the directory")
        request = pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1, mode=pb.SWITCH_MODE_IN_PLACE_STRAND_KV)
        answer = await sa.SwitchPhase(request, timeout=DEADLINE)
        assert answer.phase == pb.PHASE_DECODE and not answer.handed_back
        await until(lambda: events.directory.page_count == 0, "the stranded pages to leave the directory")
        assert len(a.arena) == 0 and not a.engine.resident(Tier.HOST) and not a.engine.resident(Tier.GPU)
        state = await sa.GetState(pb.GetStateRequest())
        assert (state.mode, state.switch_state) == (pb.NODE_MODE_DECODE, pb.SWITCH_STATE_SWITCHED)
    finally:
        await events.close()
        await channel.close()
        await a.close()


def test_in_place_strand_kv_switches_in_place_then_drops_the_cached_kv() -> None:
    asyncio.run(asyncio.wait_for(strand(), 60))


async def bad_modes() -> None:
    a, events, channel, sa = await start("bad", NodeMode.PREFILL)
    try:
        for request, where in (
            (pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1, relaunch_seconds=3.0), "relaunch_seconds"),
            (pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1, mode=pb.SWITCH_MODE_RELAUNCH,
                                   relaunch_seconds=-2.0), "relaunch_seconds"),  # fmt: skip
            (pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1, mode=7), "SwitchPhaseRequest.mode"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await sa.SwitchPhase(request, timeout=DEADLINE)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and where in (error.value.details() or "")
        assert a.engine.mode is NodeMode.PREFILL and a.generation.value == 0
    finally:
        await events.close()
        await channel.close()
        await a.close()


def test_a_bad_switch_mode_or_downtime_is_invalid_argument_and_changes_nothing() -> None:
    asyncio.run(asyncio.wait_for(bad_modes(), 60))
