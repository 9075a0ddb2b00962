"""`NodeClient`: the router's gRPC client to one node agent (grpc.aio), every call with a deadline.

- unary calls: `submit_prefill`, `switch_phase`, `get_state`;
- `submit_decode`: the server stream of one decode (the caller iterates it and may cancel it);
- `StreamEvents`: one subscription kept open in a task; each message goes to `on_event`. When the stream
  fails the node is reported down (`on_down`, once) and the client resubscribes with exponential backoff
  (`backoff_first_s` doubling up to `backoff_max_s`); the first message of a new subscription (a state
  snapshot) reports it up again (`on_up`). A new subscription starts with a KV snapshot, so the router's
  directory is rebuilt from it;
- `PushCounts`: one client stream kept open in a task, fed from a queue (`push_counts` never blocks); after a
  broken stream the client reconnects and `on_up` lets the owner resend the node's full counts.

Boundary: transport only; what the messages mean is the owner's (`backend.LiveRouter`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import grpc

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.proto.convert import counts_to_proto, phase_to_proto

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)
_END = object()


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    node: NodeId
    address: str


class NodeClient:
    """One node agent (see the module docstring)."""

    def __init__(
        self,
        endpoint: NodeEndpoint,
        *,
        rpc_timeout_s: float,
        on_event: Callable[[NodeId, pb.NodeEvent], None],
        on_down: Callable[[NodeId, str], None],
        on_up: Callable[[NodeId], None],
        backoff_first_s: float = 0.05,
        backoff_max_s: float = 2.0,
    ) -> None:
        self.node = endpoint.node
        self.address = endpoint.address
        self.rpc_timeout_s = rpc_timeout_s
        self.on_event, self.on_down, self.on_up = on_event, on_down, on_up
        self.backoff_first_s, self.backoff_max_s = backoff_first_s, backoff_max_s
        self.channel = grpc.aio.insecure_channel(endpoint.address, options=CHANNEL_OPTIONS)
        self.stub = rpc.NodeAgentStub(self.channel)
        self.up = False
        self._closed = False
        self._counts: asyncio.Queue[object] = asyncio.Queue()
        self._sequence = 0
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._events(), name=f"events-{self.node}"),
            loop.create_task(self._pushes(), name=f"counts-{self.node}"),
        ]

    async def close(self) -> None:
        self._closed = True
        self._counts.put_nowait(_END)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        await self.channel.close(grace=None)

    # --- calls ---------------------------------------------------------------------------------------
    async def submit_prefill(self, message: pb.SubmitPrefillRequest) -> pb.SubmitResponse:
        return await self.stub.SubmitPrefill(message, timeout=self.rpc_timeout_s)

    def submit_decode(self, message: pb.SubmitDecodeRequest, timeout: float) -> grpc.aio.UnaryStreamCall:
        return self.stub.SubmitDecode(message, timeout=max(0.001, timeout))

    async def switch_phase(self, phase: object, generation: int, timeout: float) -> pb.SwitchPhaseResponse:
        request = pb.SwitchPhaseRequest(target=phase_to_proto(phase), generation=generation)
        return await self.stub.SwitchPhase(request, timeout=timeout)

    async def get_state(self) -> pb.NodeState:
        return await self.stub.GetState(pb.GetStateRequest(), timeout=self.rpc_timeout_s)

    def push_counts(self, counts: Mapping[PageHash, int]) -> None:
        """Queue a count update (sent on the node's PushCounts stream)."""
        if counts and not self._closed:
            self._counts.put_nowait(dict(counts))

    # --- background streams --------------------------------------------------------------------------
    async def _events(self) -> None:
        backoff = self.backoff_first_s
        while not self._closed:
            reason = "event stream ended"
            try:
                call = self.stub.StreamEvents(pb.StreamEventsRequest(subscriber="router"))
                async for event in call:
                    if not self.up:
                        self.up = True
                        backoff = self.backoff_first_s
                        self.on_up(self.node)
                    self.on_event(self.node, event)
            except grpc.aio.AioRpcError as error:
                reason = f"{error.code().name}: {error.details()}"
            except Exception as error:  # noqa: BLE001 - a bad message must not end the subscription loop
                log.exception("node %s: event handling failed", self.node)
                reason = f"{type(error).__name__}: {error}"
            if self._closed:
                return
            if self.up:
                self.up = False
                self.on_down(self.node, reason)
            await asyncio.sleep(backoff)
            backoff = min(self.backoff_max_s, backoff * 2)

    async def _updates(self) -> AsyncIterator[pb.CountUpdate]:
        while True:
            item = await self._counts.get()
            if item is _END:
                return
            self._sequence += 1
            yield counts_to_proto(item, self._sequence)  # type: ignore[arg-type]

    async def _pushes(self) -> None:
        backoff = self.backoff_first_s
        while not self._closed:
            try:
                await self.stub.PushCounts(self._updates())
                return
            except grpc.aio.AioRpcError as error:
                log.debug("node %s: count stream broke (%s); reconnecting", self.node, error.code().name)
            await asyncio.sleep(backoff)
            backoff = min(self.backoff_max_s, backoff * 2)
