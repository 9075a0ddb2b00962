"""`LiveRouter`: the `RouterBackend` of the HTTP front end, driving the router core against live node agents.

Request path (`complete`): the prompt's token ids become page hashes (`token_page_hashes`); the core admits the
request (E.1) and routes it; the prefill goes to its node with the fetch plan (SubmitPrefill); no decode room is
held while it waits in that node's queue: when the node reports the prefill's start (`PrefillStarted` on its
event stream) the core binds a decode node with KV room, and the decode goes to that node naming the prefill
node as the KV source (SubmitDecode; the decode node waits for the prompt's pages). A node that reports no
prefill starts (`NodeState.prefill_events` false: an older node agent) gets its decode bound once it accepted
the prefill. The decode's progress comes back as `TokenChunk`s, the first with `cached_tokens` (what the engine
reused for the serving attempt, as its node reported; the routing estimate if it reported nothing) and the
serving nodes. Count changes are pushed to the nodes as they happen; a branch finish releases its counts.

Cancellation: an attempt abandoned while its prefill was queued or running (the client went away, the deadline
passed, or the attempt is routed again) has its prefill cancelled on that node (`Cancel`, in the background,
counted in `evolving_router_prefill_cancels_total`); its decode stream, if opened, is cancelled, which drops
the decode on its node.

Failures: before the first token an attempt that fails (a node unreachable or refusing, a queued request handed
back by a switch, the node's event stream lost) is re-routed from scratch, up to `max_attempts`, within the
request's deadline, under a new wire id (`flights.AttemptIds`); after it, the stream ends with `NodeUnavailable`.
A node that refused the prefill for its phase (FAILED_PRECONDITION with reject reason WRONG_PHASE or DRAINING:
it switches, or switched, away from prefill) is passed over by the request's later attempts while another node
accepts prefill (`Flight.refused`), even before its state report says so.
No node accepting prefill, or no decode room within `bind_wait_s`, is `NoCapacity` (503). A node whose event
stream breaks is taken out of routing, its pages leave the directory and its counts are released; it comes back
when its stream does.

Node reports (`StreamEvents`) and availability are applied by `reports.NodeReports`.

Boundary: asyncio I/O around `RouterCore`; every routing decision is the core's.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Sequence

import grpc
import xxhash

from evolving_infra.core.eviction import uses_branch_counts
from evolving_infra.core.pages import token_page_hashes
from evolving_infra.core.types import NodeId, NodeMode, Phase
from evolving_infra.proto.convert import REJECT_REASON_KEY
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.branch_snapshot import BranchSnapshots
from evolving_infra.router.core import CoreSettings, FetchRun, NodeTrack, PushCounts, RoutedRequest, RouterCore
from evolving_infra.router.core.control import ControlCore, ControlSettings
from evolving_infra.router.core.models import ModelBook, ModelOrigin
from evolving_infra.core.rng import RandomStreams
from evolving_infra.router.planner import WindowConfig
from evolving_infra.router.planner.registry import PLANNERS
from evolving_infra.router.http.backend import (
    BranchRef, CompletionRequest, FinishOutcome, FinishReason, ModelCard, Readiness, TokenChunk,
)  # fmt: skip
from evolving_infra.router.http.errors import DeadlineExceeded, InvalidRequest, NoCapacity, NodeUnavailable
from evolving_infra.router.routing import RouteRequest
from evolving_infra.router.routing.registry import DECODE_BINDING, PREFILL_ROUTING
from evolving_infra.router.service.client import NodeClient, NodeEndpoint
from evolving_infra.router.service.flights import AttemptIds, Flight
from evolving_infra.router.service.metrics import RouterServiceMetrics
from evolving_infra.router.service.models import ModelShape
from evolving_infra.router.service.reports import NodeReports
from evolving_infra.router.service.settings import RouterSettings, planner_settings
from evolving_infra.router.service.wire import decode_to, prefill_to

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.05
"""Wait before a request's second attempt, doubled for each further one."""

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
}  # fmt: skip
_CLIENT_FAULT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}
"""Node answers that blame the request itself (400); every other non-retryable answer is a 5xx with a retry hint."""
_PHASE_REFUSALS = frozenset(pb.RejectReason.Name(r) for r in (pb.REJECT_REASON_WRONG_PHASE, pb.REJECT_REASON_DRAINING))
"""Reject reasons of a node that takes no work of the refused phase now (it serves another, or it switches)."""
_RENAMES = 3
"""Fresh wire ids an attempt tries when its prefill node already holds the one sent."""


class _Retry(Exception):
    """This attempt failed in a way a fresh routing may fix."""


class LiveRouter:
    """See the module docstring. `start()` connects to the nodes; `close()` disconnects."""

    def __init__(
        self, settings: RouterSettings, shape: ModelShape, endpoints: Sequence[NodeEndpoint],
        metrics: RouterServiceMetrics | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.shape = shape
        self.metrics = metrics or RouterServiceMetrics()
        streams = RandomStreams(settings.seed)
        core_settings = CoreSettings(shared_pool=settings.shared_pool, reserve_on_bind=True,
                                     kv_capacity_tokens=shape.l1_tokens, node_kv_pages=shape.node_kv_pages)  # fmt: skip
        self.core = RouterCore(
            {},
            router=PREFILL_ROUTING.build(settings.prefill_routing, settings.routing_settings, streams.seeded("prefill-router")),
            binder=DECODE_BINDING.build(settings.decode_routing, settings.decode_settings, streams.seeded("decode-binder")),
            settings=core_settings,
        )
        self.control = ControlCore(
            self.core,
            PLANNERS.build(settings.planner, planner_settings(settings), streams.seeded("relaunch")),
            ControlSettings(
                initial={NodeId(n): phase for n, phase in settings.initial_split.items()},
                warmup_s=settings.warmup_s,
                fit_interval_s=settings.fit_interval_s,
                window=WindowConfig(settings.window_s, settings.slices),
            ),
            ModelBook(shape, ModelOrigin.FITTED if settings.warmup_s > 0 else ModelOrigin.PROFILE),
        )
        """The cluster's control core: warmup, models, planner, switch orders (driven by `planning.ControlLoop`)."""
        self.push_enabled = uses_branch_counts(settings.eviction)
        self.endpoints = {e.node: e for e in endpoints}
        self.clients: dict[NodeId, NodeClient] = {}
        self.flights: dict[str, Flight] = {}
        self.attempts: dict[str, Flight] = {}
        """Flights by the wire id of their current attempt."""
        self.ids = AttemptIds()
        self.progress_events: dict[NodeId, bool] = {}
        """Whether each node reports prefill starts and ends (`NodeState.prefill_events`)."""
        self._t0 = time.monotonic()
        self._cancels: set[asyncio.Task[None]] = set()
        """Cancel calls in flight (abandoned prefills, `_cancel_prefill`)."""
        self.reports = NodeReports(self)
        for node in self.endpoints:
            self.core.nodes[node] = NodeTrack(node, None)
        self.snapshots: BranchSnapshots | None = None
        """Keeps the branch table in `branch_snapshot_file` across restarts (`router.branch_snapshot`)."""
        if settings.branch_snapshot_file is not None:
            self.snapshots = BranchSnapshots(self.core.branches, settings.branch_snapshot_file, settings.branch_snapshot_interval_s)

    # --- lifecycle -----------------------------------------------------------------------------------
    def now(self) -> float:
        """Router time: seconds since the router started."""
        return time.monotonic() - self._t0

    async def start(self) -> None:
        if self.snapshots is not None:  # before the nodes connect: each node's `on_up` pushes its restored counts
            self.metrics.branches_restored.set(self.snapshots.load(self.endpoints))
            self.snapshots.start()
        for endpoint in self.endpoints.values():
            client = NodeClient(
                endpoint, rpc_timeout_s=self.settings.rpc_timeout_s, on_event=self.reports.on_event,
                on_down=self.reports.on_down, on_up=self.reports.on_up,
            )  # fmt: skip
            self.clients[endpoint.node] = client
            client.start()

    async def wait_ready(self, timeout: float) -> bool:
        """Wait until every node reported its state (at most `timeout` seconds)."""
        end = asyncio.get_running_loop().time() + timeout
        while any(t.current_mode() is None for t in self.core.nodes.values()):
            if asyncio.get_running_loop().time() > end:
                return False
            await asyncio.sleep(0.01)
        return True

    async def close(self) -> None:
        for flight in list(self.flights.values()):
            flight.interrupt("the router is shutting down")
        if self._cancels:
            await asyncio.wait(set(self._cancels), timeout=2.0)
        if self.snapshots is not None:
            await self.snapshots.close()
        await asyncio.gather(*(c.close() for c in self.clients.values()), return_exceptions=True)

    # --- RouterBackend --------------------------------------------------------------------------------
    def models(self) -> Sequence[ModelCard]:
        return [ModelCard(id=self.settings.model_name)]

    def readiness(self) -> Readiness:
        if not self.core.accepting(Phase.PREFILL):
            return Readiness(False, "no node agent serves prefill")
        if not self.core.accepting(Phase.DECODE):
            return Readiness(False, "no node agent serves decode")
        return Readiness(True)

    async def finish_branch(self, branch: BranchRef) -> FinishOutcome:
        scoped = branch.scoped_id()
        if scoped not in self.core.branches:
            return FinishOutcome.NOT_FOUND
        self.push(self.core.end_branch(scoped, self.now()))
        self.metrics.branches.set(len(self.core.branches))
        return FinishOutcome.FINISHED

    async def complete(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        flight = self._admit(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (request.timeout_s or self.settings.request_timeout_s)
        try:
            for attempt in range(1, self.settings.max_attempts + 1):
                try:
                    async for chunk in self._attempt(flight, request, deadline):
                        yield chunk
                    return
                except _Retry as retry:
                    if flight.tokens_sent:
                        raise NodeUnavailable(f"request {flight.req.id}: {retry}") from None
                    self.metrics.retries.labels(reason=_reason(str(retry))).inc()
                    self.core.release_prefill(flight.req, lost_kv=True, now=self.now())
                    if attempt == self.settings.max_attempts or loop.time() >= deadline:
                        raise NodeUnavailable(
                            f"request {flight.req.id} failed {attempt} time(s) before its first token; last: {retry}",
                            retry_after_s=1.0,
                        ) from None
                    log.info("request %s: attempt %d failed (%s); routing again", flight.req.id, attempt, retry)
                    # Back off before routing again: a node that failed reports its new state within moments, and
                    # an immediate retry would pick it again on the old view (one that refused the prefill for its
                    # phase is passed over by this request's attempts anyway, however late its report).
                    await asyncio.sleep(min(RETRY_BACKOFF_S * 2 ** (attempt - 1), max(0.0, deadline - loop.time())))
        finally:
            self._end(flight)

    # --- request path ---------------------------------------------------------------------------------
    def _admit(self, request: CompletionRequest) -> Flight:
        ids = request.prompt_token_ids
        if not ids:
            raise InvalidRequest("the prompt has no tokens", "prompt")
        if request.request_id in self.flights:
            raise InvalidRequest(f"request id {request.request_id} is already in flight", "X-Request-Id")
        pt = self.shape.page_tokens
        pages = tuple(token_page_hashes(ids, pt))
        output = request.max_tokens or self.settings.default_max_tokens
        branch = request.branch.scoped_id()
        route = RouteRequest(
            id=request.request_id, branch=branch, page_hashes=pages, prompt_tokens=len(ids), output_tokens=output,
            t_acc=self.shape.t_acc, page_tokens=pt,
            parent_branch=request.parent.scoped_id() if request.parent is not None else None,
        )  # fmt: skip
        version = self.core.admit(branch, pages)
        flight = Flight(RoutedRequest(route, pages, version))
        self.flights[flight.req.id] = flight
        return flight

    def _route(self, flight: Flight) -> tuple[NodeId, int, tuple[FetchRun, ...]]:
        req = flight.req
        started = time.perf_counter()
        routed = self.core.route(req, self.now(), exclude=flight.refused)
        if routed is None:
            raise NoCapacity("no node agent accepts prefill work now", retry_after_s=1.0)
        self.metrics.routing_seconds.observe(time.perf_counter() - started)
        self.metrics.routed(routed.decision)
        d = routed.decision
        self.metrics.lost_reuse.inc(d.recompute_tokens)
        self.metrics.fetch_pages.inc(sum(len(r.pages) for r in routed.fetch))
        self.push(routed.counts)
        send = self.core.prefill_sent(req)
        return send.node, d.cached_tokens, send.fetch

    async def _attempt(self, flight: Flight, request: CompletionRequest, deadline: float) -> AsyncIterator[TokenChunk]:
        req = flight.req
        node, routed_cached, fetch = self._route(flight)
        flight.new_attempt(self.ids.first(flight), routed_cached)
        self.attempts[flight.wire] = flight
        addresses = {n: e.address for n, e in self.endpoints.items()}
        trace = pb.TraceContext(traceparent=request.traceparent or "", tracestate=request.tracestate or "")
        loop = asyncio.get_running_loop()
        call: grpc.aio.UnaryStreamCall | None = None
        prefill_sent = False
        ended = "the attempt ended"
        try:
            flight.progress.sent_at = self.now()
            try:
                await self._submit_prefill(flight, node, fetch, addresses, trace)
            except asyncio.CancelledError:
                prefill_sent = True  # the node may have accepted it before the caller went away
                raise
            prefill_sent = True
            if self.progress_events.get(node, False):
                await self._wait_started(flight, deadline)
            p = flight.progress
            restored = p.restored_tokens if p.reused_tokens is not None else req.routed_restore
            self.core.prefill_started(node, req, flight.cached_tokens, restored, self.now())
            await self._bind(flight, deadline)
            target = req.decode_node
            assert target is not None
            call = self.clients[target].submit_decode(
                decode_to(req, flight.wire, node, addresses[node], trace), deadline - loop.time()
            )
            it = call.__aiter__()
            while True:
                try:
                    message = await self._next(flight, it, deadline)
                except StopAsyncIteration:
                    raise _Retry(f"decode stream of node {target} ended early") from None
                except grpc.aio.AioRpcError as error:
                    raise self._classify(error, target) from None
                kind = message.WhichOneof("progress")
                if kind == "accepted":
                    # The request counts as bound to its decode node (the binder's view, its KV reservation) until
                    # the node accepts it, as in the simulator: handing it over when the call goes out left a
                    # burst's requests counted nowhere while their KV was pulled, and all bound to one node.
                    self.core.decode_handover(req)
                    if not req.prefill_done:
                        self.push(self.core.prefill_finished(node, req.id, req, self.now()))
                    self.push(self.core.decode_submitted(req, self.now()))
                elif kind == "tokens":
                    n = message.tokens.new_tokens
                    ids = tuple(message.tokens.token_ids) or self._stand_in(request, flight.tokens_sent, n)
                    first = flight.tokens_sent == 0
                    flight.tokens_sent += len(ids)
                    flight.token_messages += 1
                    yield self._served(flight, ids) if first else TokenChunk(ids)
                elif kind == "finished":
                    flight.finished = True
                    self.core.decode_finished(target, req, self.now())
                    iterations = max(1, flight.token_messages) if flight.tokens_sent else 0
                    self.control.request_finished(flight.tokens_sent, float(iterations), self.now())
                    reason = FinishReason.LENGTH if request.max_tokens else FinishReason.STOP
                    chunk = self._served(flight, ()) if flight.tokens_sent == 0 else TokenChunk(())
                    yield TokenChunk((), finish_reason=reason, cached_tokens=chunk.cached_tokens, serving=chunk.serving)
                    return
        except BaseException as error:
            ended = _ended(error)
            raise
        finally:
            self.attempts.pop(flight.wire, None)
            if call is not None and not flight.finished:
                call.cancel()
            if prefill_sent and not flight.finished and not flight.progress.finished and not req.prefill_done:
                self._cancel_prefill(node, flight.wire, ended)

    def _cancel_prefill(self, node: NodeId, wire: str, reason: str) -> None:
        """The attempt was abandoned while its prefill was queued or running on `node`: tell the node to drop
        it (frees its queue entry and GPU slots; the router's own counts are released by `release_prefill` or
        `forget`). In the background, so a client that went away is not kept waiting; a node that is down
        already lost it."""
        client = self.clients.get(node)
        if client is None or not client.up:
            return
        task = asyncio.get_running_loop().create_task(self._send_cancel(client, wire, reason), name=f"cancel-{wire}")
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _send_cancel(self, client: NodeClient, wire: str, reason: str) -> None:
        try:
            answer = await client.cancel(wire, reason)
        except grpc.aio.AioRpcError as error:
            log.info("node %s: cancelling request %s failed (%s)", client.node, wire, error.code().name)
            self.metrics.prefill_cancels.labels(outcome="failed").inc()
            return
        outcome = "cancelled" if answer.prefill_cancelled else "not_held"
        self.metrics.prefill_cancels.labels(outcome=outcome).inc()
        log.info("node %s: prefill of request %s %s (%s)", client.node, wire, outcome.replace("_", " "), reason)

    def _served(self, flight: Flight, ids: tuple[int, ...]) -> TokenChunk:
        """The first chunk of the attempt that serves the request; its prompt counts in the metrics once."""
        self.metrics.prompt_tokens.inc(flight.req.route.prompt_tokens)
        self.metrics.cached_tokens.inc(flight.cached_tokens)
        return TokenChunk(ids, cached_tokens=flight.cached_tokens, serving=flight.serving())

    async def _submit_prefill(
        self, flight: Flight, node: NodeId, fetch: tuple[FetchRun, ...], addresses: dict[NodeId, str],
        trace: pb.TraceContext,
    ) -> None:  # fmt: skip
        """Send the attempt's prefill; a node holding its wire id (ALREADY_EXISTS) gets a fresh one."""
        for _ in range(_RENAMES):
            try:
                await self.clients[node].submit_prefill(prefill_to(flight.req, flight.wire, fetch, addresses, trace))
                return
            except grpc.aio.AioRpcError as error:
                if error.code() is not grpc.StatusCode.ALREADY_EXISTS:
                    if _phase_refusal(error):  # its report may still say it serves prefill: not again for this request
                        flight.refused |= {node}
                    raise self._classify(error, node) from None
                log.info("node %s already holds request id %s; sending it under a fresh id", node, flight.wire)
                self.attempts.pop(flight.wire, None)
                flight.rename(self.ids.fresh(flight))
                self.attempts[flight.wire] = flight
        raise _Retry(f"node {node}: ALREADY_EXISTS: it holds every id tried for request {flight.req.id}")

    async def _wait_started(self, flight: Flight, deadline: float) -> None:
        """Wait until the prefill node reports the attempt's prefill started (no decode room is held meanwhile)."""
        loop = asyncio.get_running_loop()
        waits = [asyncio.ensure_future(e.wait()) for e in (flight.progress.started, flight.interrupted)]
        try:
            await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if flight.interrupted.is_set():
            raise _Retry(flight.reason)
        if not flight.progress.started.is_set():
            raise DeadlineExceeded(f"request {flight.req.id} passed its deadline in node {flight.req.prefill_node}'s queue")

    async def _next(self, flight: Flight, it: AsyncIterator[pb.DecodeProgress], deadline: float) -> pb.DecodeProgress:
        """The decode stream's next message, unless the attempt is interrupted or the deadline passes first. The
        pending read is cancelled only when this returns without its message: cancelling it ends the stream (an
        async generator that an exception left is finished), so a loss that does not touch the request waits on
        the same read."""
        loop = asyncio.get_running_loop()
        nxt = asyncio.ensure_future(it.__anext__())
        try:
            while True:
                stop = asyncio.ensure_future(flight.interrupted.wait())
                try:
                    done, _ = await asyncio.wait({nxt, stop}, timeout=max(0.0, deadline - loop.time()),
                                                 return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                finally:
                    stop.cancel()
                if nxt in done:
                    return nxt.result()
                if stop not in done:
                    raise DeadlineExceeded(f"request {flight.req.id} passed its deadline")
                if not (flight.prefill_loss and flight.tokens_sent):
                    raise _Retry(flight.reason)
                # The prefill node was lost while this message was on its way: tokens streamed, so the decode node
                # holds the prompt KV and the loss does not touch the request; keep reading.
                flight.interrupted.clear()
                flight.prefill_loss = False
        finally:
            if not nxt.done():
                nxt.cancel()

    async def _bind(self, flight: Flight, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        end = min(deadline, loop.time() + self.settings.bind_wait_s)
        while True:
            bound = self.core.bind(flight.req, self.now())
            if bound.node is not None:
                self.push(bound.counts)
                return
            if flight.interrupted.is_set():
                raise _Retry(flight.reason)
            if loop.time() >= end:
                raise NoCapacity(f"no decode node has KV room for request {flight.req.id} ({bound.binding.reason.value})",
                                 retry_after_s=1.0)  # fmt: skip
            await asyncio.sleep(0.02)

    def _classify(self, error: grpc.aio.AioRpcError, node: NodeId) -> Exception:
        code = error.code()
        too_large = _reject_reason(error) == "REJECT_REASON_TOO_LARGE"
        if code in _RETRYABLE and not too_large:
            return _Retry(f"node {node}: {code.name}: {error.details()}")
        if too_large or code in _CLIENT_FAULT:
            return InvalidRequest(f"node {node} refused the request: {error.details()}")
        # INTERNAL, UNKNOWN, DATA_LOSS, a credentials mismatch...: the cluster's fault, never the client's
        return NodeUnavailable(f"node {node} failed the request: {code.name}: {error.details()}", retry_after_s=1.0)

    def _stand_in(self, request: CompletionRequest, start: int, count: int) -> tuple[int, ...]:
        """Token ids for an engine that produces none (the emulated one): a hash of prompt and position."""
        seed = xxhash.xxh3_64_intdigest(repr(request.prompt_token_ids).encode())
        return tuple(xxhash.xxh3_64_intdigest(f"{seed}:{i}".encode()) & 0x7FFFFFFF for i in range(start, start + count))

    def _end(self, flight: Flight) -> None:
        self.flights.pop(flight.req.id, None)
        if not flight.finished:
            self.push(self.core.forget(flight.req, self.now()))
        self.refresh_gauges()

    def push(self, pushes: Sequence[PushCounts]) -> None:
        if not self.push_enabled:
            return
        for push in pushes:
            client = self.clients.get(push.node)
            if client is not None:
                client.push_counts(push.counts)

    def handed_back(self, node: NodeId, request_ids: Sequence[str]) -> None:
        """A switching node handed these queued requests back (streamed as the switch begins, and listed again
        in its SwitchPhase answer): their attempts are routed again; ids of earlier attempts are ignored."""
        for rid in request_ids:
            flight = self.attempts.get(rid)
            if flight is not None and node in (flight.req.prefill_node, flight.req.decode_node):
                flight.interrupt(f"handed back by node {node}'s phase switch")

    def switch_done(self, node: NodeId, phase: Phase) -> None:
        """`node` serves `phase` now (its state, its switch event or its SwitchPhase answer said so): its mode
        follows at once, so routing stops offering it the old phase's work before its next state report (a
        serving node's, collocated ones leaving the warmup included; one serving nothing waits for its report),
        and the control core learns it (a planner switch's end starts the cooldown)."""
        track = self.core.nodes.get(node)
        if track is not None and track.mode is not None:
            track.mode = NodeMode(phase.value)
        self.push(self.control.switch_completed(node, phase, self.now()))
        self.refresh_gauges()

    def generation_seen(self, node: NodeId, generation: int) -> None:
        self.control.generation_seen(node, generation)

    def refresh_gauges(self) -> None:
        m = self.metrics
        p, d = self.core.split_now()
        m.split.labels(phase="prefill").set(p)
        m.split.labels(phase="decode").set(d)
        m.split.labels(phase="collocated").set(self.core.collocated_now())
        m.branches.set(len(self.core.branches))
        m.directory_pages.set(self.core.directory.page_count)
        m.directory_nodes.set(len(self.core.directory.nodes()))
        for track in self.core.nodes.values():
            m.inflight.labels(node=track.id, phase="prefill").set(len(track.sent))
            m.inflight.labels(node=track.id, phase="decode").set(len(track.decode_jobs) + len(track.bound))


def _ended(error: BaseException) -> str:
    """Why an attempt ended before its request finished (the reason a Cancel carries)."""
    if isinstance(error, (GeneratorExit, asyncio.CancelledError)):
        return "the client went away"
    if isinstance(error, DeadlineExceeded):
        return "the request passed its deadline"
    if isinstance(error, _Retry):
        return f"the attempt is routed again: {error}"
    return f"the attempt failed: {type(error).__name__}"


def _reject_reason(error: grpc.aio.AioRpcError) -> str | None:
    """The `RejectReason` name a refusing node sent in its trailing metadata (None: it sent none)."""
    value = dict(error.trailing_metadata() or ()).get(REJECT_REASON_KEY)
    return value if isinstance(value, str) else None


def _phase_refusal(error: grpc.aio.AioRpcError) -> bool:
    """Whether the node refused the work for its phase (`node_agent.service.errors`: FAILED_PRECONDITION with
    reject reason WRONG_PHASE or DRAINING), rather than for the request or a passing failure."""
    return error.code() is grpc.StatusCode.FAILED_PRECONDITION and _reject_reason(error) in _PHASE_REFUSALS


def _reason(message: str) -> str:
    for word in ("handed back", "unavailable", "UNAVAILABLE", "ABORTED", "NOT_FOUND", "FAILED_PRECONDITION"):
        if word in message:
            return word.lower().replace(" ", "_")
    return "other"
