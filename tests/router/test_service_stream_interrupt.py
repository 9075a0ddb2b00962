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
