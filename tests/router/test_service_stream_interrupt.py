"""The live router's read of a decode stream (`LiveRouter._next`) when the attempt's prefill node is lost.

Once tokens have streamed, the decode node holds the prompt KV, so the loss of the prefill node must not end the
request: the router keeps reading the same stream. Cancelling the pending read would end it (an async generator,
as grpc.aio's response iterator is, is finished once an exception went through it) and turn the loss into an
in-stream error for the client (seen in the chaos test `kill -9 prefill node n0`: "decode stream ended early").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from evolving_infra.router.service.backend import LiveRouter, _Retry
from evolving_infra.router.service.flights import Flight


def _flight(tokens_sent: int) -> Flight:
    flight = Flight(req=SimpleNamespace(id="r1"))  # type: ignore[arg-type]  # only the id is read here
    flight.tokens_sent = tokens_sent
    return flight


async def _stream(gate: asyncio.Event) -> AsyncIterator[str]:
    yield "tokens-1"
    await gate.wait()  # the next message is on its way
    yield "tokens-2"
    yield "finished"


async def _read(flight: Flight, it: AsyncIterator[Any]) -> Any:
    router = object.__new__(LiveRouter)
    return await router._next(flight, it, asyncio.get_running_loop().time() + 30)


def test_a_prefill_node_lost_after_tokens_streamed_leaves_the_stream_intact() -> None:
    async def main() -> list[str]:
        gate = asyncio.Event()
        flight = _flight(tokens_sent=1)
        it = _stream(gate).__aiter__()
        got = [await _read(flight, it)]
        pending = asyncio.ensure_future(_read(flight, it))
        await asyncio.sleep(0.01)
        flight.interrupt("node n0 became unavailable", prefill_loss=True)
        await asyncio.sleep(0.01)
        gate.set()
        got.append(await pending)
        got.append(await _read(flight, it))
        assert not flight.interrupted.is_set() and not flight.prefill_loss
        return got

    assert asyncio.run(main()) == ["tokens-1", "tokens-2", "finished"]


@pytest.mark.parametrize(("tokens_sent", "prefill_loss"), [(0, True), (1, False)])
def test_other_interrupts_retry_the_attempt(tokens_sent: int, prefill_loss: bool) -> None:
    async def main() -> None:
        gate = asyncio.Event()
        flight = _flight(tokens_sent)
        it = _stream(gate).__aiter__()
        await _read(flight, it)
        pending = asyncio.ensure_future(_read(flight, it))
        await asyncio.sleep(0.01)
        flight.interrupt("node went away", prefill_loss=prefill_loss)
        with pytest.raises(_Retry, match="node went away"):
            await pending

    asyncio.run(main())


def test_a_prefill_nodes_relaunch_marks_its_flights_as_a_prefill_loss() -> None:
    """A relaunch hands back the flights it touches as a lost node does (`on_down`): the prefill node's as a
    prefill loss, so a first token already on its way keeps the stream (the live Dynamo relaunch test saw a
    request fail with 'handed back by node p0's relaunch' after its first token), the decode node's not."""
    from evolving_infra.core.types import NodeId, Phase
    from evolving_infra.router.service.reports import NodeReports

    def flight(rid: str, prefill: str, decode: str | None, tokens: int) -> Flight:
        f = Flight(req=SimpleNamespace(id=rid, prefill_node=NodeId(prefill), decode_node=decode))  # type: ignore[arg-type]
        f.tokens_sent = tokens
        return f

    flights = {"a": flight("a", "p0", "d0", 0), "b": flight("b", "p1", "p0", 3), "c": flight("c", "p0", "d1", 2),
               "d": flight("d", "p1", "d0", 0)}  # fmt: skip
    pushed: list[Any] = []
    core = SimpleNamespace(clear_node=lambda node, now: ("cleared", node), switch_begun=lambda node, phase: None)
    router = SimpleNamespace(core=core, flights=flights, push=pushed.append, now=lambda: 1.0,
                             refresh_gauges=lambda: None)  # fmt: skip
    track = SimpleNamespace(mode="prefill", target=Phase.DECODE, phase=Phase.PREFILL, pool=None,
                            forget_report=lambda: None)  # fmt: skip
    NodeReports(router)._relaunching(NodeId("p0"), track)  # type: ignore[arg-type]
    assert pushed == [("cleared", "p0")] and track.mode is None
    a, b, c, d = (flights[k] for k in "abcd")
    assert a.interrupted.is_set() and a.prefill_loss  # its prefill node: a token on its way keeps the stream
    assert b.interrupted.is_set() and not b.prefill_loss  # its decode node: the prompt KV is gone, retry
    assert not c.interrupted.is_set()  # streaming already: the decode node holds the KV
    assert not d.interrupted.is_set()  # not on the relaunching node
