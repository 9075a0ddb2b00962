"""The live request path's details against real node agents on loopback: the decode node bound only when the
prefill starts, hand-backs re-routed while the switch still drains, attempt ids that never clash, a node that
refused a prefill for its switch passed over by that request's later attempts, cached tokens as the serving
attempt's node measured them, and the serving nodes reported to the client.

Node agents run in-process (grpc.aio on 127.0.0.1); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from evolving_infra.core.pages import token_page_hashes
from evolving_infra.core.types import NodeId, NodeMode, Phase
from evolving_infra.node_agent.engine.errors import WrongPhase
from evolving_infra.node_agent.engine.phase_switch import PhaseSwitch
from evolving_infra.node_agent.service.errors import to_service_error
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.core import RoutedRequest
from evolving_infra.router.planner import Outcome, PlannerDecision, SwitchMode
from evolving_infra.router.routing import RouteRequest
from evolving_infra.router.core.control import SwitchOrder
from evolving_infra.router.service import LocalSplitApplier
from evolving_infra.router.service.flights import AttemptIds, Flight

from .test_service_live import DEADLINE, Cluster, run, until

P, D, C = NodeMode.PREFILL, NodeMode.DECODE, NodeMode.COLLOCATED


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{j}" for j in range(n))


def retries(c: Cluster) -> dict[str, float]:
    return {x.labels["reason"]: x.value for m in c.router.metrics.retries.collect() for x in m.samples
            if x.name.endswith("_total")}  # fmt: skip


def counter(metric: Any) -> float:
    return sum(x.value for m in metric.collect() for x in m.samples if x.name.endswith("_total"))


class EventLog:
    """Records the prefill reports the router receives (wrapping its report handler)."""

    def __init__(self, c: Cluster) -> None:
        self.started: dict[str, pb.PrefillStarted] = {}
        inner = c.router.reports.on_event

        def on_event(node: NodeId, event: pb.NodeEvent) -> None:
            if event.WhichOneof("body") == "prefill_started":
                self.started[event.prefill_started.request_id] = event.prefill_started
            inner(node, event)

        for client in c.router.clients.values():
            client.on_event = on_event


def test_a_queued_prefill_holds_no_decode_binding_until_its_node_starts_it() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # p0 at a tenth of the wall clock: the long prompt's first chunk (8,192 tokens) runs for about 3.5 s, so the
        # short request arrives while it runs and stays queued behind it however slowly this process is scheduled
        async with Cluster({"p0": P, "d0": D}, speed_up=1.0, speed_ups={"p0": 0.1}) as c:
            p0, d0 = c.agents["p0"], c.agents["d0"]
            long = asyncio.ensure_future(c.complete(words("L", 12000), "long", max_tokens=2))
            await until(lambda: p0.engine.gauges().prefill_running >= 1, "the long prefill running", 10)
            short = asyncio.ensure_future(c.complete(words("S", 200), "short", max_tokens=2))
            await until(lambda: any(f.req.branch.endswith("/short") and f.req.prefill_node for f in c.router.flights.values()),
                        "the short request routed", 10)  # fmt: skip
            (flight,) = [f for f in c.router.flights.values() if f.req.branch.endswith("/short")]
            await until(lambda: flight.progress.sent_at is not None and p0.engine.gauges().prefill_queued >= 1,
                        "the short prefill queued behind the long one", 10)  # fmt: skip
            await asyncio.sleep(0.05)  # let any early binding happen
            out["queued"] = p0.engine.gauges().prefill_queued
            # (the long request stays bound to d0 until d0 accepts its decode, after its prefill)
            out["while_queued"] = (flight.req.decode_node, flight.req.id in c.router.core.nodes[NodeId("d0")].bound,
                                   flight.wire in d0.decodes)  # fmt: skip
            out["long_started"] = any(f.progress.started.is_set() for f in c.router.flights.values() if f is not flight)
            await until(lambda: flight.req.decode_node is not None, "the short request bound", 20)
            out["bound_after_start"] = (flight.progress.started.is_set(), flight.req.decode_node)
            out["results"] = [(s, a["usage"]["completion_tokens"]) for s, a in await asyncio.gather(long, short)]
        return out

    out = run(scenario)
    assert out["queued"] >= 1 and out["long_started"]
    # no decode binding, no reservation, and no decode sent to the decode node while queued
    assert out["while_queued"] == (None, False, False)
    assert out["bound_after_start"] == (True, "d0")
    assert out["results"] == [(200, 2), (200, 2)]


def test_local_switch_reroutes_handed_back_requests_before_the_drain_completes() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # p0 slow (as below): its running and queued requests stay long enough to be seen under any load
        async with Cluster({"p0": P, "p1": P, "d0": D}, speed_up=1.0, speed_ups={"p0": 0.25}) as c:
            loop = asyncio.get_running_loop()
            resent: list[tuple[float, str]] = []
            p1_client = c.router.clients[NodeId("p1")]
            inner_submit = p1_client.submit_prefill

            async def submit(message: pb.SubmitPrefillRequest) -> pb.SubmitResponse:
                resent.append((loop.time(), message.request_id))
                return await inner_submit(message)

            p1_client.submit_prefill = submit  # type: ignore[method-assign]
            tasks = [asyncio.ensure_future(c.complete(words(f"x{i}y", 6000), f"s{i}", max_tokens=2)) for i in range(8)]
            p0 = c.agents["p0"].engine
            await until(lambda: p0.gauges().prefill_queued >= 1 and p0.gauges().prefill_running >= 1,
                        "a request running and one queued at p0", DEADLINE)  # fmt: skip
            decision = PlannerDecision({"p0": Phase.DECODE, "p1": Phase.PREFILL, "d0": Phase.DECODE}, SwitchMode.IN_PLACE,
                                       Outcome.SWITCH, "test", None)  # type: ignore[arg-type]
            began = loop.time()
            effects = c.router.control.decided(decision, c.router.now())
            orders = [e for e in effects if isinstance(e, SwitchOrder)]
            assert [o.node for o in orders] == ["p0"]
            await LocalSplitApplier(c.router).apply(orders, None, c.router.now())
            answered = loop.time()
            results = await asyncio.gather(*tasks)
            out["statuses"] = [s for s, _ in results]
            out["tokens"] = [a.get("usage", {}).get("completion_tokens", a) for _, a in results]
            out["rerouted_at"] = [t for t, rid in resent if "~" in rid and t >= began]
            out["window"] = (began, answered)
            out["retries"] = retries(c)
            out["handed"] = c.agents["p0"].metrics.requests.labels("prefill", "handed_back")._value.get()
            out["p0"] = c.router.core.nodes[NodeId("p0")].phase
        return out

    out = run(scenario)
    began, answered = out["window"]
    assert out["statuses"] == [200] * 8 and out["tokens"] == [2] * 8  # none lost
    assert out["handed"] >= 1 and out["retries"].get("handed_back", 0) == out["handed"]  # each re-routed once
    assert len(out["rerouted_at"]) == out["handed"]
    assert all(t < answered for t in out["rerouted_at"])  # re-routed while p0 still drained its running prefill
    assert out["p0"] is Phase.DECODE


async def a_state_then_late_reports(c: Cluster, node: NodeId) -> tuple[pb.NodeState, Callable[[NodeId, pb.NodeEvent], None]]:
    """Waits for `node`'s next state report (applied as usual); its later events are then held back (they come
    late). Returns that state and the router's own handler, to deliver a stale report by hand."""
    states: list[pb.NodeState] = []
    inner = c.router.reports.on_event

    def on_event(source: NodeId, event: pb.NodeEvent) -> None:
        if states:
            return  # late: not delivered
        if event.WhichOneof("body") == "state":
            states.append(event.state)
        inner(source, event)

    c.router.clients[node].on_event = on_event
    await until(lambda: bool(states), f"a state report of {node}", 10)
    return states[0], inner


def test_a_switched_node_gets_no_old_phase_work_before_its_next_report_and_a_stale_draining_state_is_ignored() -> None:
    """The SwitchPhase answer ends a switch before the node's next state report: the node's mode follows at once
    (no prefill offered to a node that serves decode now), and a state snapshot still draining from prefill that
    arrives after the answer (taken before the switch ended) changes neither its phase nor its mode."""

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": P, "p1": P, "d0": D}, speed_up=1.0) as c:
            state, inner = await a_state_then_late_reports(c, NodeId("p0"))
            track = c.router.core.nodes[NodeId("p0")]
            decision = PlannerDecision({"p0": Phase.DECODE, "p1": Phase.PREFILL, "d0": Phase.DECODE}, SwitchMode.IN_PLACE,
                                       Outcome.SWITCH, "test", None)  # type: ignore[arg-type]
            orders = [e for e in c.router.control.decided(decision, c.router.now()) if isinstance(e, SwitchOrder)]
            await LocalSplitApplier(c.router).apply(orders, None, c.router.now())
            out["after_answer"] = (track.phase, track.mode, [t.id for t in c.router.core.accepting(Phase.PREFILL)])
            stale = pb.NodeState()
            stale.CopyFrom(state)  # as p0 reported before the switch, now draining from prefill
            stale.switch_state = pb.SWITCH_STATE_DRAINING
            inner(NodeId("p0"), pb.NodeEvent(state=stale))
            out["after_stale"] = (track.phase, track.mode, [t.id for t in c.router.core.accepting(Phase.PREFILL)])
            status, answer = await c.complete(words("z", 300), "after", max_tokens=2)
            out["served"] = (status, answer.get("usage", {}).get("completion_tokens"), retries(c))
        return out

    out = run(scenario)
    assert out["after_answer"] == (Phase.DECODE, NodeMode.DECODE, ["p1"])
    assert out["after_stale"] == (Phase.DECODE, NodeMode.DECODE, ["p1"])
    assert out["served"] == (200, 2, {})


def test_a_node_leaving_the_warmup_serves_its_new_phase_at_the_answer_and_a_stale_collocated_state_is_ignored() -> None:
    """The end of the collocated warmup is a switch like the planner's: once its SwitchPhase answer says c0 serves
    decode (the staged exit's first step of a node bound for prefill), c0 gets no prefill before its next state
    report, and a collocated snapshot taken before the end and arriving after it neither gives c0 both phases back
    nor touches its phase."""

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        initial = {"c0": Phase.PREFILL, "c1": Phase.DECODE}
        async with Cluster({"c0": C, "c1": C}, speed_up=1.0, warmup_s=3600.0, initial_split=initial) as c:
            state, inner = await a_state_then_late_reports(c, NodeId("c0"))
            track = c.router.core.nodes[NodeId("c0")]
            out["warmup"] = (track.phase, track.mode, sorted(t.id for t in c.router.core.accepting(Phase.PREFILL)))
            effects = c.router.control._end_warmup(c.router.now())
            orders = [e for e in effects if isinstance(e, SwitchOrder) and e.node == "c0"]
            await LocalSplitApplier(c.router).apply(orders, None, c.router.now())
            out["orders"] = [(o.node, o.phase) for o in orders]
            out["after_answer"] = (track.phase, track.mode, [t.id for t in c.router.core.accepting(Phase.PREFILL)])
            stale = pb.NodeState()
            stale.CopyFrom(state)  # as c0 reported during the warmup
            inner(NodeId("c0"), pb.NodeEvent(state=stale))
            out["after_stale"] = (track.phase, track.mode, [t.id for t in c.router.core.accepting(Phase.PREFILL)])
        return out

    out = run(scenario)
    assert out["warmup"] == (None, C, ["c0", "c1"])
    assert out["orders"] == [("c0", Phase.DECODE)]
    assert out["after_answer"] == (Phase.DECODE, D, ["c1"])
    assert out["after_stale"] == (Phase.DECODE, D, ["c1"])


def test_attempt_ids_are_unique_per_attempt() -> None:
    ids = AttemptIds()
    route = RouteRequest(id="a77.r2", branch="b", page_hashes=(), prompt_tokens=10, output_tokens=1, t_acc=1.0,
                         page_tokens=64)  # type: ignore[arg-type]  # fmt: skip
    seen: list[str] = []
    for _ in range(3):  # the same client request id sent three times (a client retrying it)
        flight = Flight(RoutedRequest(route, (), 0))
        for attempt in range(4):
            flight.req.attempt = attempt
            seen.append(ids.first(flight))
        seen.append(ids.fresh(flight))
    assert seen.count("a77.r2") == 3  # only first attempts use the bare id; a node holding it gets a fresh one
    rest = [s for s in seen if s != "a77.r2"]
    assert len(set(rest)) == len(rest) and all(s.startswith("a77.r2~") for s in rest)


def test_a_node_still_holding_the_request_id_gets_the_attempt_under_a_fresh_id() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # p0 at a twentieth of the wall clock and a blocker longer than a chunk (8,192 tokens): no iteration takes
        # both, and "dup-1" stays queued for about 7 s, time for the request below to be routed under any load
        async with Cluster({"p0": P, "d0": D}, speed_up=1.0, speed_ups={"p0": 0.05}) as c:
            client = c.router.clients[NodeId("p0")]
            for rid, n in (("blocker", 64 * 140), ("dup-1", 64 * 4)):  # "dup-1": an abandoned attempt still queued
                ids = tuple(range(1 + len(rid), n + len(rid)))
                await client.submit_prefill(pb.SubmitPrefillRequest(
                    request_id=rid, branch_id=rid, prompt_pages=list(token_page_hashes(ids, 64)), prompt_tokens=len(ids),
                    t_acc=1.0,
                ))  # fmt: skip
            out["held"] = c.agents["p0"].engine.gauges().prefill_queued
            sent: list[str] = []
            inner = client.submit_prefill

            async def submit(message: pb.SubmitPrefillRequest) -> pb.SubmitResponse:
                sent.append(message.request_id)
                return await inner(message)

            client.submit_prefill = submit  # type: ignore[method-assign]
            body = {"model": "evolving-emulated", "prompt": words("d", 100), "max_tokens": 3}
            headers = {"x-evolving-branch-id": "dup", "X-Request-Id": "dup-1"}
            async with c.session.post(f"{c.server.url}/v1/completions", json=body, headers=headers) as response:
                out["status"], answer = response.status, await response.json()
            out["tokens"] = answer["usage"]["completion_tokens"]
            out["retries"] = retries(c)
            out["sent"] = sent
        return out

    out = run(scenario)
    assert (out["status"], out["tokens"]) == (200, 3)
    assert out["held"] >= 1 and len(out["sent"]) == 2 and out["sent"][0] == "dup-1" and out["sent"][1].startswith("dup-1~")
    assert not out["retries"]  # renamed, not counted as a failed attempt


def _prefill_refusal(node: NodeId, switched: bool) -> grpc.aio.AioRpcError:
    """What a node agent answers a prefill while it switches to decode (`switched`: after the switch), as its
    engine words the refusal and its service maps it to a status and a reject reason."""
    switch = PhaseSwitch(node, NodeMode.PREFILL)
    switch.begin(Phase.DECODE, 0.0)
    if switched:
        switch.complete(1.0)
    try:
        switch.check_accepts(Phase.PREFILL)
    except WrongPhase as refused:
        error = to_service_error(refused, draining=not switched)
    else:
        raise AssertionError("the switching node accepted prefill work")
    trailing = grpc.aio.Metadata(*error.trailing_metadata())
    return grpc.aio.AioRpcError(error.code, grpc.aio.Metadata(), trailing, details=error.message)


@pytest.mark.parametrize("switched", [False, True], ids=["draining", "switched"])
def test_a_node_refusing_prefill_for_its_switch_gets_none_of_the_requests_later_attempts(switched: bool) -> None:
    # The refusing node's reports still say it serves prefill (its next state report is late), so the core
    # keeps it a candidate, and cache-aware routing prefers it: the prompt was sent there first.
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": P, "p1": P, "d0": D}, speed_up=1.0) as c:
            sent: list[tuple[NodeId, str]] = []
            for node in (NodeId("p0"), NodeId("p1")):
                client = c.router.clients[node]

                async def submit(
                    message: pb.SubmitPrefillRequest, node: NodeId = node, inner: Any = client.submit_prefill
                ) -> pb.SubmitResponse:
                    sent.append((node, message.request_id))
                    if node == sent[0][0]:  # the node the request went to first is switching to decode
                        raise _prefill_refusal(node, switched)
                    return await inner(message)

                client.submit_prefill = submit  # type: ignore[method-assign]
            status, answer = await c.complete(words("s", 200), "refused", max_tokens=3)
            out["status"], out["answer"], out["sent"], out["retries"] = status, answer, sent, retries(c)
            out["candidate"] = c.router.core.nodes[sent[0][0]].accepts(Phase.PREFILL)
        return out

    out = run(scenario)
    assert out["status"] == 200 and out["answer"]["usage"]["completion_tokens"] == 3, out["answer"]
    (refusing, first), (serving, second) = out["sent"]
    assert serving != refusing and second != first  # the second attempt went to the other prefill node
    assert out["retries"] == {"failed_precondition": 1.0}
    assert out["candidate"]  # still a prefill candidate for other requests: only its next report moves it


class _FailedCall:
    """A decode stream that fails at once (the decode node lost before the first token)."""

    def __aiter__(self) -> _FailedCall:
        return self

    async def __anext__(self) -> pb.DecodeProgress:
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "injected")

    def cancel(self) -> bool:
        return True


def test_cached_tokens_are_the_serving_attempts_measured_reuse_and_count_once() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": P, "d0": D}, speed_up=1.0) as c:
            log = EventLog(c)
            d0 = c.router.clients[NodeId("d0")]
            inner = d0.submit_decode
            calls: list[str] = []

            def submit_decode(message: pb.SubmitDecodeRequest, timeout: float) -> Any:
                calls.append(message.request_id)
                return _FailedCall() if len(calls) == 1 else inner(message, timeout)

            d0.submit_decode = submit_decode  # type: ignore[method-assign]
            prompt = words("c", 600)
            status, events = await c.complete(prompt, "retry", max_tokens=3, stream=True)
            usage = json.loads(events[-2])["usage"]
            out["status"], out["cached"], out["prompt"] = status, usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]
            out["calls"] = list(calls)
            out["measured"] = {rid: log.started[rid].cached_tokens for rid in calls if rid in log.started}
            out["metric_prompt"] = counter(c.router.metrics.prompt_tokens)
            out["metric_cached"] = counter(c.router.metrics.cached_tokens)
            # two requests sharing a prefix at once: the second is routed before the first's pages are known
            # (estimate 0) and starts after the first stored them (the engine reuses them)
            shared = words("z", 12000)
            a = asyncio.ensure_future(c.complete(shared, "za", max_tokens=2))
            await until(lambda: any(f.req.branch.endswith("/za") and f.progress.started.is_set() for f in c.router.flights.values()),
                        "the first shared prompt started", 10)  # fmt: skip
            b = asyncio.ensure_future(c.complete(shared + " tail words", "zb", max_tokens=2))
            await until(lambda: any(f.req.branch.endswith("/zb") and f.wire for f in c.router.flights.values()), "routed", 10)
            (fb,) = [f for f in c.router.flights.values() if f.req.branch.endswith("/zb")]
            out["estimate_b"] = fb.routed_cached
            wire_b = fb.wire
            (_, ans_a), (_, ans_b) = await asyncio.gather(a, b)
            out["cached_b"] = ans_b["usage"]["prompt_tokens_details"]["cached_tokens"]
            out["measured_b"] = log.started[wire_b].cached_tokens
        return out

    out = run(scenario)
    assert out["status"] == 200 and len(out["calls"]) == 2 and out["calls"][0] != out["calls"][1]
    serving = out["calls"][1]
    # the retry on the same node reuses what the failed attempt computed, and says so as the engine measured it
    assert out["cached"] == out["measured"][serving] > 0
    assert out["metric_prompt"] == out["prompt"] and out["metric_cached"] == out["cached"]  # counted once
    assert out["estimate_b"] == 0 and out["cached_b"] == out["measured_b"] > 0


def test_responses_name_the_serving_nodes_in_headers_and_usage() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": P, "d0": D}) as c:
            for stream in (False, True):
                body: dict[str, Any] = {"model": "evolving-emulated", "prompt": words("h", 50), "max_tokens": 2, "stream": stream}
                if stream:
                    body["stream_options"] = {"include_usage": True}
                url = f"{c.server.url}/v1/completions"
                async with c.session.post(url, json=body, headers={"x-evolving-branch-id": f"h{stream}"}) as response:
                    heads = (response.headers.get("x-evolving-prefill-node"), response.headers.get("x-evolving-decode-node"))
                    if stream:
                        lines = [ln.decode().strip()[6:] async for ln in response.content if ln.startswith(b"data: ")]
                        usage = json.loads(lines[-2])["usage"]
                    else:
                        usage = (await response.json())["usage"]
                out[stream] = (response.status, heads, usage["evolving"])
        return out

    out = run(scenario)
    for stream in (False, True):
        status, heads, ext = out[stream]
        assert status == 200 and heads == ("p0", "d0")
        assert ext["prefill_node"] == "p0" and ext["decode_node"] == "d0" and ext["queue_s"] >= 0


def test_a_switch_the_operator_drives_has_its_hand_backs_rerouted_from_the_event_stream() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # p0 runs at a quarter of the wall clock (a 6,000-token prefill takes over a second): once it holds a running
        # request and a queued one it keeps both long enough to be seen, however slowly this process is scheduled
        async with Cluster({"p0": P, "p1": P, "d0": D}, speed_up=1.0, speed_ups={"p0": 0.25}) as c:
            sends: list[tuple[str, str]] = []  # (branch, prefill node) of every attempt, in order
            inner = c.router.core.prefill_sent

            def prefill_sent(req: RoutedRequest) -> Any:
                sends.append((req.branch, str(req.prefill_node)))
                return inner(req)

            c.router.core.prefill_sent = prefill_sent  # type: ignore[method-assign]
            tasks = [asyncio.ensure_future(c.complete(words(f"k{i}y", 6000), f"k{i}", max_tokens=2)) for i in range(8)]
            p0 = c.agents["p0"]
            await until(lambda: p0.engine.gauges().prefill_queued >= 1 and p0.engine.gauges().prefill_running >= 1,
                        "a request running and one queued at p0", DEADLINE)  # fmt: skip
            # as under the Kubernetes applier: the operator, not the router, calls SwitchPhase
            switch = asyncio.ensure_future(p0.switch(Phase.DECODE, 1))
            await until(lambda: retries(c).get("handed_back", 0) >= 1, "a hand-back re-routed", 10)
            out["switch_done_at_reroute"] = switch.done()
            outcome = await switch
            results = await asyncio.gather(*tasks)
            out["handed"] = len(outcome.handed_back)
            out["statuses"] = [s for s, _ in results]
            out["tokens"] = [a.get("usage", {}).get("completion_tokens", a) for _, a in results]
            out["retries"] = retries(c)
            out["sends"] = sends
            await until(lambda: c.router.core.nodes[NodeId("p0")].phase is Phase.DECODE, "the router sees p0 decode", 10)
        return out

    out = run(scenario)
    assert not out["switch_done_at_reroute"], out  # (each assertion shows the whole outcome if it fails)
    assert out["statuses"] == [200] * 8 and out["tokens"] == [2] * 8, out
    assert out["handed"] >= 1 and out["retries"].get("handed_back") == out["handed"], out
    # Under load a request may reach p0 after its switch began but before the router saw it: p0 refuses it
    # (failed_precondition) and it is re-routed. No other retry, and no request is ever sent to p0 twice (a
    # handed-back or refused request goes elsewhere).
    assert set(out["retries"]) <= {"handed_back", "failed_precondition"}, out
    to_p0 = [branch for branch, node in out["sends"] if node == "p0"]
    assert len(to_p0) == len(set(to_p0)), out["sends"]
    assert len(out["sends"]) == 8 + sum(out["retries"].values()), out
