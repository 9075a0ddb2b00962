"""`NodeAgentServicer`: the full `evolving_infra.v1.NodeAgent` gRPC service of a live node (grpc.aio).

Each RPC converts its message at the edge (`api.convert`), calls the `NodeAgent`, and converts back;
failures become status codes (`errors`): the RejectReason of a refused request goes in the trailing
metadata `evolving-reject-reason`. `ReadPages` and `GetTransferEndpoint` are the page servicer's
(`api.pages_service.PagesServicer`), composed: its blocking page stream runs in worker threads, one
message at a time, so copying bytes never blocks the event loop.

Boundary: wire formats and status codes; the node decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

import grpc

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId
from evolving_infra.node_agent.api.convert import (
    counts_from_proto,
    decode_request_from_proto,
    phase_from_proto,
    phase_to_proto,
    prefill_request_from_proto,
)
from evolving_infra.node_agent.api.limits import (
    MAX_CANCEL_REASON_CHARS,
    MAX_COUNT_PAGES,
    MAX_REQUEST_ID_CHARS,
    MAX_SUBSCRIBER_CHARS,
    check_count,
    check_id,
)
from evolving_infra.node_agent.api.pages_service import PagesServicer
from evolving_infra.node_agent.service.decodes import Accepted, Finished, Tokens
from evolving_infra.node_agent.service.errors import ServiceError, to_service_error
from evolving_infra.node_agent.service.events import SubscriberDropped
from evolving_infra.node_agent.service.metrics import NodeMetrics
from evolving_infra.proto.convert import switch_how_from_proto
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

if TYPE_CHECKING:
    from evolving_infra.node_agent.service.node import NodeAgent


ROUTER_SUBSCRIBER = "router"
"""The subscriber name the router's StreamEvents subscription uses (router.service.client)."""


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _ThreadContext:
    """The part of a servicer context the page servicer uses, for running it on a worker thread."""

    def __init__(self) -> None:
        self.active = True

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(code, details)

    def is_active(self) -> bool:
        return self.active


async def _abort(context: grpc.aio.ServicerContext, error: ServiceError, counted: NodeMetrics | None = None, method: str = "") -> None:
    if counted is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT:
        counted.invalid.labels(method).inc()
    await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata())


class NodeAgentServicer(rpc.NodeAgentServicer):
    """Serves one `NodeAgent` (see the module docstring)."""

    def __init__(self, node: NodeAgent) -> None:
        self.node = node
        self.pages = PagesServicer(node.arena, node.node, node.mooncake_address)

    # --- control -------------------------------------------------------------------------------------
    async def SwitchPhase(  # noqa: N802
        self, request: pb.SwitchPhaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.SwitchPhaseResponse:
        try:
            target = phase_from_proto(request.target, "SwitchPhaseRequest.target")
            outcome = await self.node.switch(target, request.generation, switch_how_from_proto(request))
        except Exception as error:
            await _abort(context, to_service_error(error))
            raise  # unreachable: abort raises
        return pb.SwitchPhaseResponse(
            phase=phase_to_proto(outcome.phase),
            generation=outcome.generation,
            drain_seconds=outcome.drain_seconds,
            switch_seconds=outcome.switch_seconds,
            handed_back=list(outcome.handed_back),
            already_serving=outcome.already_serving,
        )

    async def GetState(self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext) -> pb.NodeState:  # noqa: N802
        return self.node.state()

    async def PushCounts(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.CountUpdate], context: grpc.aio.ServicerContext
    ) -> pb.PushCountsResponse:
        updates = pages = 0
        async for update in request_iterator:
            try:
                check_count(len(update.pages), "CountUpdate.pages (count)", 0, MAX_COUNT_PAGES)
                counts = counts_from_proto(update)
            except ValueError as error:
                await _abort(context, to_service_error(error), self.node.metrics, "PushCounts")
            self.node.push_counts(counts)
            updates += 1
            pages += len(counts)
        return pb.PushCountsResponse(updates=updates, pages=pages)

    # --- requests ------------------------------------------------------------------------------------
    async def SubmitPrefill(  # noqa: N802
        self, request: pb.SubmitPrefillRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitResponse:
        try:
            req = prefill_request_from_proto(request)
            addresses = {NodeId(run.peer): run.peer_address for run in request.fetch if run.peer_address}
            ahead = self.node.submit_prefill(req, addresses)
        except Exception as error:
            await _abort(context, to_service_error(error), self.node.metrics, "SubmitPrefill")
            raise
        return pb.SubmitResponse(accepted=True, queue_position=ahead)

    async def SubmitDecode(  # noqa: N802
        self, request: pb.SubmitDecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DecodeProgress]:
        rid = request.request_id
        try:
            req, _ = decode_request_from_proto(request)
            runs = [
                (self.node.mover.address_of(NodeId(run.peer), run.peer_address), tuple(PageHash(p) for p in run.pages))
                for run in request.fetch
            ]
            async for item in self.node.decode(req, runs):
                yield _progress(rid, item)
        except (ServiceError, ValueError) as error:
            await _abort(context, to_service_error(error), self.node.metrics, "SubmitDecode")

    async def Cancel(self, request: pb.CancelRequest, context: grpc.aio.ServicerContext) -> pb.CancelResponse:  # noqa: N802
        try:
            check_id(request.request_id, "CancelRequest.request_id", MAX_REQUEST_ID_CHARS)
            reason = request.reason[:MAX_CANCEL_REASON_CHARS]
            if reason and not (reason.isascii() and reason.isprintable()):
                raise ValueError("CancelRequest.reason: must be printable ASCII (no control characters)")
            prefill, decode = self.node.cancel(request.request_id, reason)
        except Exception as error:
            await _abort(context, to_service_error(error), self.node.metrics, "Cancel")
            raise
        return pb.CancelResponse(prefill_cancelled=prefill, decode_cancelled=decode)

    # --- pages ---------------------------------------------------------------------------------------
    async def ReadPages(  # noqa: N802
        self, request: pb.ReadPagesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PageChunk]:
        executor = self.node.serve_executor  # never the transfer threads (see NodeAgent._start)
        thread_context = _ThreadContext()
        stream = self.pages.ReadPages(request, thread_context)
        pending: Future[pb.PageChunk | None] | None = None
        try:
            while True:
                pending = executor.submit(next, stream, None)
                chunk = await asyncio.wrap_future(pending)
                pending = None
                if chunk is None:
                    return
                self.node.metrics.served_bytes.inc(sum(len(p.data) for p in chunk.pieces))
                yield chunk
        except _Aborted as aborted:
            await context.abort(aborted.code, aborted.details)
        finally:
            thread_context.active = False
            if pending is not None:  # a page copy still runs on its thread: close the stream after it
                pending.add_done_callback(lambda _: stream.close())
            else:
                stream.close()

    async def GetTransferEndpoint(  # noqa: N802
        self, request: pb.GetTransferEndpointRequest, context: grpc.aio.ServicerContext
    ) -> pb.TransferEndpoint:
        return self.pages.GetTransferEndpoint(request, _ThreadContext())

    # --- events --------------------------------------------------------------------------------------
    async def StreamEvents(  # noqa: N802
        self, request: pb.StreamEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.NodeEvent]:
        if not self.node.accepting:
            await _abort(context, ServiceError(grpc.StatusCode.UNAVAILABLE, f"node {self.node.node} is shutting down"))
        if request.subscriber:
            try:
                check_id(request.subscriber, "StreamEventsRequest.subscriber", MAX_SUBSCRIBER_CHARS)
            except ValueError as error:
                await _abort(context, to_service_error(error), self.node.metrics, "StreamEvents")
        if request.subscriber == ROUTER_SUBSCRIBER:
            self.node.router_subscribed()
        hub = self.node.hub
        sub = hub.subscribe(request.subscriber or context.peer())
        self.node.metrics.subscribers.set(len(hub))
        try:
            async for event in sub:
                yield event
        except SubscriberDropped as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{error}; subscribe again")
        finally:
            hub.unsubscribe(sub)
            self.node.metrics.subscribers.set(len(hub))


def _progress(rid: str, item: Accepted | Tokens | Finished) -> pb.DecodeProgress:
    if isinstance(item, Accepted):
        return pb.DecodeProgress(request_id=rid, accepted=pb.SubmitResponse(accepted=True, queue_position=item.queue_position))
    if isinstance(item, Tokens):
        tokens = pb.DecodeProgress.Tokens(new_tokens=item.new, total_tokens=item.total, time=item.time)
        return pb.DecodeProgress(request_id=rid, tokens=tokens)
    return pb.DecodeProgress(request_id=rid, finished=pb.DecodeProgress.Finished(output_tokens=item.output_tokens, time=item.time))
