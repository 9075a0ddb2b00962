"""`NodeAgent`: one node's live service, assembled: engine core, host arena, transport, runner, event
hub, metrics, the gRPC server and the metrics endpoint. It is the runner's sink (engine outputs go to
the arena sync, the event hub, decode streams and metrics) and carries out the servicer's operations.

Lifecycle: `await start()` (binds, starts the engine loop), serve, `await drain(grace)` (refuse new work
with UNAVAILABLE, let accepted work finish), `await close()`. Everything runs on one event loop; only
transfers and page streaming run in worker threads.

Decode path: `decode()` checks the request, stages its prompt pages (kept in the arena until the decode
ends), pulls the missing ones from the prefill node (waiting until that node's prefill has written
them), submits it to the engine and yields `Accepted`, `Tokens` ... `Finished` as the runner publishes.
A caller that goes away (the stream is cancelled) cancels the decode in the engine, queued or running.

Events: besides KV events, iteration reports, switch reports and state snapshots, the node publishes each
prefill's start (with the prompt tokens the engine reused) and finish, and, when a switch begins, the ids of
the queued requests it hands back (before the drain, so the router routes them again at once). While it holds
prefills it publishes its state, with its prefill queue, at every engine step (`queue_report`).

Switch modes (`SwitchHow`): IN_PLACE drains as above; IN_PLACE_STRAND_KV also evicts every cached page once
the switch completes; RELAUNCH terminates the engine at once (`_relaunch`): every request it holds is handed
back (decode streams end with ABORTED), its KV is cleared (`KvCleared` of every tier), the node reports
SWITCH_STATE_RELAUNCHING with no mode and refuses work (UNAVAILABLE) for the downtime, then a fresh, empty
engine serves the new phase and the switch completes as any other.

Boundary: wiring and request bookkeeping; scheduling is the engine's, wire formats the servicer's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from evolving_infra.core.eviction import eviction_policy
from evolving_infra.core.itermodel import IterationRecord
from evolving_infra.core.kv_events import KvCleared, KvEvent
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, NodeMode, Phase, SwitchMode
from evolving_infra.node_agent.engine import (
    DecodeFinished,
    DecodeRequest,
    EngineCore,
    EngineGauges,
    PrefillFinished,
    PrefillQueue,
    PrefillRequest,
    PrefillStarted,
    SwitchReport,
    SwitchState,
)
from evolving_infra.node_agent.api.auth import AuthMode, blocking_channel, load_credentials
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.node_agent.service import messages
from evolving_infra.node_agent.service.decodes import Accepted, DecodeCheck, DecodeTable, Failed, Finished, Tokens
from evolving_infra.node_agent.service.errors import ServiceError, to_service_error, unavailable
from evolving_infra.node_agent.service.events import EventHub
from evolving_infra.node_agent.service.kvsync import ArenaSync
from evolving_infra.node_agent.service.metrics import MetricsServer, NodeMetrics
from evolving_infra.node_agent.service.mover import KvMover
from evolving_infra.node_agent.service.runner import EngineRunner, NodeClock
from evolving_infra.node_agent.service.settings import NodeAgentSettings, resolve_memory
from evolving_infra.node_agent.service.switch_generations import Generation, SwitchAction, decide_switch
from evolving_infra.node_agent.transfer import KvArena, Transport, TransportKind, make_transport
from evolving_infra.node_agent.transfer.channels import CHANNEL_OPTIONS, PeerChannels
from evolving_infra.proto.convert import SwitchHow
from evolving_infra.proto.v1 import node_agent_pb2 as pb

log = logging.getLogger(__name__)

Progress = Accepted | Tokens | Finished


@dataclass(frozen=True, slots=True)
class SwitchOutcome:
    """What `switch` reports back (seconds on the node clock)."""

    phase: Phase
    generation: int
    drain_seconds: float
    switch_seconds: float
    handed_back: tuple[str, ...]
    already_serving: bool


class NodeAgent:
    """The live node (see the module docstring). Attributes are ready after `start()`."""

    def __init__(self, settings: NodeAgentSettings) -> None:
        self.settings = settings
        self.node = NodeId(settings.node)
        self.accepting = False
        self.generation = Generation()
        self.address = ""
        self.metrics_address = ""
        self.mooncake_address: str | None = None
        self.metrics = NodeMetrics()
        self.failed = asyncio.Event()
        self._draining: tuple[Phase, int] | None = None
        self._switch_done: asyncio.Future[SwitchReport] | None = None
        self._switch_started = 0.0
        self._state_task: asyncio.Task[None] | None = None
        self._members_task: asyncio.Task[None] | None = None
        self._server: object | None = None
        self._metrics_server: MetricsServer | None = None
        self._transport: Transport | None = None
        self._reused: dict[str, int] = {}
        """Prompt tokens the engine reused for each running prefill (from its start), for its finish report."""
        self._strand_kv = False
        """Whether the switch in progress drops the node's cached KV when it completes (IN_PLACE_STRAND_KV)."""
        self.relaunching = False
        self._relaunch: asyncio.Task[None] | None = None
        self._queue_reported = False
        """Whether the last state published at an engine step listed prefills."""

    # --- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Build the node and start serving; on failure everything built so far is closed again."""
        try:
            await self._start()
        except BaseException:
            await self.close(grace=None)
            raise

    async def _start(self) -> None:
        from evolving_infra.node_agent.service.server import start_aio_server
        from evolving_infra.node_agent.service.servicer import NodeAgentServicer

        s = self.settings
        self.credentials = load_credentials(s.cluster_token_file, s.tls_cert_file, s.tls_key_file, s.tls_ca_file, s.insecure, s.tls_server_name)
        if self.credentials.mode is AuthMode.INSECURE:
            log.warning("node %s: serving WITHOUT authentication (--insecure): anyone who reaches %s:%s may call it",
                        self.node, s.host, s.grpc_port)  # fmt: skip
        memory = resolve_memory(s, load_profile(s.profile))
        self.memory = memory
        self.engine = self._new_engine(s.mode)
        self.arena = KvArena(memory.arena_slots, memory.page_bytes)
        credentials = self.credentials
        self.channels = PeerChannels(lambda address: blocking_channel(address, credentials, CHANNEL_OPTIONS))
        self._transport = make_transport(s.transfer, self.arena, self.channels)
        if s.transfer.kind is TransportKind.MOONCAKE_TCP:
            self.mooncake_address = getattr(self._transport, "address", None)
        self.executor = ThreadPoolExecutor(max_workers=s.workers, thread_name_prefix=f"kv-{self.node}")
        # Pages served to peers stream on threads of their own: a node whose transfer threads all wait on peers'
        # streams must still serve its own pages, or two nodes reading from each other deadlock until the
        # transfers' deadline (tests/node_agent/test_service_transfers.py).
        self.serve_executor = ThreadPoolExecutor(max_workers=s.workers, thread_name_prefix=f"serve-{self.node}")
        l2 = self.engine.pool.l2
        self.sync = ArenaSync(self.arena, l2.contains, l2.is_writing, lambda page: self.engine.pool.l1.contains(page))
        self.clock = NodeClock(s.speed_up)
        self.mover = KvMover(self._transport, self.executor, self.metrics, s.peers, s.peer_networks)
        self.runner = EngineRunner(self.engine, self.clock, self, self.mover)
        self.runner.on_failure = self._engine_failed
        self.decodes = DecodeTable()
        self.hub = EventHub(s.event_queue, self._snapshot)
        self.hub.on_drop = lambda sub: self.metrics.dropped.inc()
        self.metrics.state(self.engine.mode, self.engine.switch_state, 0)
        self.metrics.engine_gauges(self.engine.gauges())
        servicer = NodeAgentServicer(self)
        self._server = server = await start_aio_server(
            servicer, s.host, s.grpc_port, allow_wildcard=s.allow_wildcard_host, credentials=self.credentials,
            on_denied=lambda method: self.metrics.denied.inc(),
        )
        self.address = server.address
        if s.metrics_enabled:
            self._metrics_server = MetricsServer(self.metrics)
            self.metrics_address = await self._metrics_server.start(s.host, s.metrics_port)
        self.runner.start()
        if s.state_interval_s > 0:
            self._state_task = asyncio.get_running_loop().create_task(self._tick_state(s.state_interval_s))
        if s.peer_service is not None:  # no fetch is allowed until the first lookup answered (then refreshed)
            self.mover.policy.members = frozenset()
            self._members_task = asyncio.get_running_loop().create_task(self._track_members(s.peer_service))
        self.accepting = True

    def _new_engine(self, mode: NodeMode) -> EngineCore:
        s = self.settings
        noise = 0.0 if s.exact_models else s.noise
        rng = random.Random(s.seed) if noise > 0 else None
        return EngineCore(
            self.node, self.memory.profile, mode, eviction_policy(s.eviction), s.data_plane, noise, rng,
            check_invariants=s.check_invariants, exact_models=s.exact_models,
        )

    def _engine_failed(self, error: BaseException) -> None:
        self.accepting = False
        self.failed.set()

    async def drain(self, grace: float) -> bool:
        """Refuse new work (UNAVAILABLE), then wait up to `grace` seconds for accepted work to finish."""
        self.accepting = False
        if self._server is not None:
            await self._server.not_serving()  # type: ignore[attr-defined]  # a grpc.aio server, typed object
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.runner.busy() or len(self.decodes):
            if loop.time() >= deadline or self.runner.failure is not None:
                log.warning("node %s: %d decode stream(s) and engine work left after the drain", self.node, len(self.decodes))
                return False
            await asyncio.sleep(0.01)
        return True

    async def close(self, grace: float | None = 2.0) -> None:
        """Stop everything that was started (safe to call on a partly started node)."""
        self.accepting = False
        if self._state_task is not None:
            self._state_task.cancel()
        if self._members_task is not None:
            self._members_task.cancel()
        if self._relaunch is not None:
            self._relaunch.cancel()
        if hasattr(self, "hub"):
            self.hub.close()
        if self._server is not None:
            await self._server.stop(grace)  # type: ignore[attr-defined]  # a grpc.aio server, typed object
            self._server = None
        if hasattr(self, "runner"):
            await self.runner.stop()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
            self._metrics_server = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if hasattr(self, "channels"):
            self.channels.close()
        if hasattr(self, "executor"):
            self.executor.shutdown(wait=False, cancel_futures=True)
        if hasattr(self, "serve_executor"):
            self.serve_executor.shutdown(wait=False, cancel_futures=True)

    async def _resolve_members(self, service: str) -> None:
        """The cluster's node agents: every address `service` (host:port) resolves to; kept as it was when the
        lookup fails (a DNS hiccup must not refuse every fetch once members are known), and logged."""
        host, _, port = service.rpartition(":")
        try:
            lookup = asyncio.get_running_loop().getaddrinfo(host, int(port) if port.isdigit() else None)
            infos = await asyncio.wait_for(lookup, timeout=max(1.0, self.settings.peer_refresh_s))
        except (OSError, asyncio.TimeoutError) as error:
            log.warning("node %s: resolving the cluster's node agents (%s) failed: %s", self.node, service, error)
            return
        self.mover.policy.members = frozenset(str(info[4][0]) for info in infos)

    async def _track_members(self, service: str) -> None:
        while True:
            await self._resolve_members(service)
            await asyncio.sleep(self.settings.peer_refresh_s)

    # --- operations (called by the servicer) ---------------------------------------------------------
    def _check_accepting(self, work: bool = True) -> None:
        if not self.accepting:
            raise unavailable(self.node)
        if work and self.relaunching:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"node {self.node} is relaunching for a phase switch")

    def _draining_now(self) -> bool:
        return self.engine.switch_state is SwitchState.DRAINING

    def submit_prefill(self, req: PrefillRequest, addresses: dict[NodeId, str]) -> int:
        self._check_accepting()
        resolved = {run.peer: self.mover.address_of(run.peer, addresses.get(run.peer, "")) for run in req.fetch}
        try:
            ahead = self.runner.submit_prefill(req, resolved)
        except Exception as error:
            self.metrics.request("prefill", "rejected")
            raise to_service_error(error, self._draining_now()) from error
        self.metrics.request("prefill", "accepted")
        return ahead

    async def decode(self, req: DecodeRequest, runs: Sequence[tuple[str, tuple[PageHash, ...]]]) -> AsyncIterator[Progress]:
        """Run one decode (module docstring); `runs` are (peer address, pages). Raises ServiceError."""
        self._check_accepting()
        try:
            check = DecodeCheck(self.engine, self.arena)
            check.validate(req, runs, self.decodes, self._draining[0] if self._draining else None)
        except Exception as error:
            self.metrics.request("decode", "rejected")
            raise to_service_error(error, self._draining_now()) from error
        entry = self.decodes.add(req)
        self.sync.stage(req.prompt_pages)
        try:
            await self._pull(entry.request, runs)
            if entry.cancelled:
                raise ServiceError(grpc.StatusCode.ABORTED, entry.cancel_reason)
            position = self.runner.submit_decode(req)
        except BaseException as error:
            self._end_decode(req.request)
            if not isinstance(error, Exception):
                raise
            if not entry.cancelled:  # a cancelled one was counted as handed back by the switch
                self.metrics.request("decode", "rejected")
            raise to_service_error(error, self._draining_now()) from error
        entry.submitted = True
        self.metrics.request("decode", "accepted")
        done = False
        try:
            yield Accepted(position)
            while True:
                item = await entry.queue.get()
                if isinstance(item, Failed):
                    done = True
                    raise ServiceError(item.code, item.message)
                yield item
                if isinstance(item, Finished):
                    done = True
                    return
        finally:
            if not done:  # the caller went away (stream cancelled): stop decoding for nobody
                self.cancel_decode(req.request)

    def cancel_decode(self, request: str) -> bool:
        """Drop a decode whose caller went away, queued or running: the engine frees its GPU pages, the
        staged prompt pages are released, and it is counted (`requests_total{outcome="cancelled"}`)."""
        if self.decodes.get(request) is None:
            return False
        self._end_decode(request)
        cancelled = self.runner.cancel_decode(request)
        if cancelled:
            self.metrics.request("decode", "cancelled")
            log.info("node %s: decode %s cancelled (its caller went away)", self.node, request)
        return cancelled

    def cancel(self, request: str, reason: str = "") -> tuple[bool, bool]:
        """The `Cancel` RPC: drop the request's prefill and its decode, whichever this node holds, queued or
        running (their pages' slots are freed and the requests behind them admitted); each drop is counted
        (`requests_total{outcome="cancelled"}`). Returns (prefill dropped, decode dropped); idempotent."""
        self._check_accepting(work=False)
        prefill = self.runner.cancel_prefill(request)
        if prefill:
            self._reused.pop(request, None)
            self.metrics.request("prefill", "cancelled")
            log.info("node %s: prefill %s cancelled (%s)", self.node, request, reason or "no reason given")
        entry = self.decodes.get(request)
        decode = False
        if entry is not None and not entry.submitted:  # still pulling its prompt: `decode` ends it after the pull
            entry.cancelled, entry.cancel_reason = True, f"cancelled by the router ({reason or 'no reason given'})"
            decode = True
            self.metrics.request("decode", "cancelled")
        elif entry is not None:
            decode = self.cancel_decode(request)
            if decode:
                entry.queue.put_nowait(Failed(grpc.StatusCode.CANCELLED, f"request {request} cancelled: {reason}"))
        return prefill, decode

    async def _pull(self, request: str, runs: Sequence[tuple[str, tuple[PageHash, ...]]]) -> None:
        entry = self.decodes.get(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.decode_pull_timeout_s
        cancelled = lambda: entry is None or entry.cancelled  # noqa: E731
        await asyncio.gather(*(self.mover.pull(address, pages, deadline, cancelled) for address, pages in runs))

    def _end_decode(self, request: str) -> None:
        entry = self.decodes.pop(request)
        if entry is not None:
            self.sync.unstage(entry.pages)

    def push_counts(self, counts: dict[PageHash, int]) -> None:
        self.runner.set_counts(counts)

    def router_subscribed(self) -> None:
        """A router (re)subscribed: the counts a previous router pushed may describe branches it no longer
        knows (a restarted router starts empty), so they are cleared; the router pushes all of its own
        counts once it sees the subscription's first message."""
        self.runner.clear_counts()

    def state(self) -> pb.NodeState:
        return messages.node_state(self.engine, self.generation.value, self.clock.now(), self.relaunching)

    async def switch(self, target: Phase, generation: int, how: SwitchHow = SwitchHow()) -> SwitchOutcome:
        self._check_accepting(work=False)
        decision = decide_switch(self.generation, self.engine.mode, self._draining, target, generation, self.node)
        action = decision.action
        if action is SwitchAction.INVALID:
            self.metrics.invalid.labels("SwitchPhase").inc()
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, decision.message)
        if action in (SwitchAction.STALE, SwitchAction.CONFLICT):
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, decision.message)
        if action is SwitchAction.BUSY:
            raise ServiceError(grpc.StatusCode.ABORTED, decision.message)
        if action is SwitchAction.ALREADY:
            return SwitchOutcome(target, generation, 0.0, 0.0, (), True)
        if action is SwitchAction.ADOPT:
            self.generation = Generation(generation, True)
            self.metrics.generation.set(generation)
            return SwitchOutcome(target, generation, 0.0, 0.0, (), True)
        if action is SwitchAction.JOIN:
            assert self._switch_done is not None
            report = await asyncio.shield(self._switch_done)
            return SwitchOutcome(target, generation, report.drain, self.clock.now() - report.began, (), False)
        if how.mode is SwitchMode.RELAUNCH:
            return await self._relaunch_to(target, generation, how.relaunch_s)
        self._strand_kv = how.mode is SwitchMode.IN_PLACE_STRAND_KV
        return await self._switch(target, generation)

    async def _relaunch_to(self, target: Phase, generation: int, downtime: float) -> SwitchOutcome:
        """RELAUNCH (module docstring): terminate the engine now, serve nothing for `downtime` seconds of the node
        clock, then serve `target` with a fresh engine. The relaunch runs on even if the caller goes away."""
        started = self.clock.now()
        old_mode, old_runner = self.engine.mode, self.runner
        self._switch_done = asyncio.get_running_loop().create_future()
        self._draining = (target, generation)
        self._switch_started = started
        self.generation = Generation(generation, True)
        self.metrics.generation.set(generation)
        self.relaunching = True
        old_runner.halt()
        queue = self.engine.prefill_queue()
        prefills = [r.request for r in queue.running] + list(queue.queued)
        reason = f"node {self.node} relaunches for a switch to {target.value} (generation {generation})"
        decodes = self.decodes.cancel_pending(reason)  # still pulling: `decode` ends them once the pull returns
        for entry in self.decodes:
            if entry.submitted:
                decodes.append(entry.request)
                self._fail_decode(entry.request, grpc.StatusCode.ABORTED, reason)
        self._reused.clear()
        self._queue_reported = False
        self.metrics.request("prefill", "handed_back", len(prefills))
        self.metrics.request("decode", "handed_back", len(decodes))
        self.metrics.state(None, None, generation)
        self.engine = self._new_engine(NodeMode.of(target))
        l2 = self.engine.pool.l2
        self.sync.holds, self.sync.writing = l2.contains, l2.is_writing
        self.runner = EngineRunner(self.engine, self.clock, self, self.mover)
        self.runner.on_failure = self._engine_failed
        self.kv_events((KvCleared(self.node, None, started),))
        self.hub.publish(messages.state_body(self.state()))
        handed = prefills + decodes
        if handed:
            self.hub.publish(messages.handed_back_body(self.node, handed, generation, started))
        self._relaunch = asyncio.get_running_loop().create_task(
            self._relaunched(old_runner, old_mode, NodeMode.of(target), started, downtime, len(handed))
        )
        report = await asyncio.shield(self._switch_done)
        return SwitchOutcome(target, generation, 0.0, report.completed - started, tuple(handed), False)

    async def _relaunched(
        self, old: EngineRunner, source: NodeMode, target: NodeMode, started: float, downtime: float, handed: int
    ) -> None:
        await old.stop()
        await asyncio.sleep(self.clock.wall_delay(started + downtime))
        now = self.clock.now()
        self.sync.apply_events((KvCleared(self.node, None, now),))  # pages a cancelled fetch wrote meanwhile
        self.relaunching = False
        self.runner.start()
        self.switch_completed(SwitchReport(self.node, source, target, started, now, handed))

    async def _switch(self, target: Phase, generation: int) -> SwitchOutcome:
        started = self.clock.now()
        self._switch_done = asyncio.get_running_loop().create_future()
        self._draining = (target, generation)
        self._switch_started = started
        self.generation = Generation(generation, True)
        self.metrics.generation.set(generation)
        try:
            begun = self.runner.begin_switch(target)
        except Exception as error:  # the decision ruled out every refusal the engine knows; a bug if reached
            self._draining = None
            raise to_service_error(error) from error
        handed = [str(getattr(r, "request", "")) for r in begun.handed_back]
        for req in begun.handed_back:
            if isinstance(req, DecodeRequest):
                self._fail_decode(req.request, grpc.StatusCode.ABORTED, f"handed back by a switch to {target.value}")
        if target is Phase.PREFILL:
            handed.extend(self.decodes.cancel_pending(f"handed back by a switch to prefill (generation {generation})"))
        self.metrics.request("prefill", "handed_back", sum(isinstance(r, PrefillRequest) for r in begun.handed_back))
        self.metrics.request("decode", "handed_back", len(handed) - sum(isinstance(r, PrefillRequest) for r in begun.handed_back))
        self.hub.publish(messages.state_body(self.state()))  # draining first: re-routing then avoids this node
        if handed:  # at once, so the router routes them again while the running requests drain
            self.hub.publish(messages.handed_back_body(self.node, handed, generation, started))
        report = await asyncio.shield(self._switch_done)
        return SwitchOutcome(target, generation, report.drain, self.clock.now() - started, tuple(handed), False)

    def _fail_decode(self, request: str, code: grpc.StatusCode, message: str) -> None:
        entry = self.decodes.get(request)
        if entry is not None:
            entry.queue.put_nowait(Failed(code, message))
            self._end_decode(request)

    # --- the runner's sink ---------------------------------------------------------------------------
    def kv_events(self, events: tuple[KvEvent, ...]) -> None:
        self.sync.apply_events(events)
        for body in messages.kv_bodies(events):
            self.hub.publish(body)

    def iteration(self, record: IterationRecord) -> None:
        self.metrics.iteration(record)
        self.hub.publish(messages.iteration_body(record))

    def decode_tokens(self, request: str, new: int, time: float) -> None:
        self.metrics.tokens.inc(new)
        entry = self.decodes.get(request)
        if entry is not None:
            entry.produced += new
            entry.queue.put_nowait(Tokens(new, entry.produced, time))

    def decode_finished(self, done: DecodeFinished) -> None:
        self.metrics.request("decode", "finished")
        entry = self.decodes.get(done.request)
        if entry is not None:
            entry.queue.put_nowait(Finished(done.output_tokens, done.time))
            self._end_decode(done.request)

    def prefill_started(self, started: PrefillStarted) -> None:
        self._reused[started.request] = started.cached_tokens
        self.hub.publish(messages.prefill_started_body(self.node, started))

    def prefill_finished(self, done: PrefillFinished) -> None:
        self.metrics.request("prefill", "finished")
        reused = self._reused.pop(done.request, 0)
        if not done.local_decode:
            # The decode node pulls the prompt from this arena: pages only L1 holds (L2 evicted them while L1
            # kept them, and this prefill reused them) are written in for as long as a pull may wait; else the
            # prompt could never be pulled, and every retry of the request, reusing the same L1 pages here,
            # would fail the same way.
            exposed = self.sync.expose(done.pages)
            if exposed.pages:
                asyncio.get_running_loop().call_later(self.settings.decode_pull_timeout_s, self.sync.unexpose, exposed)
        self.hub.publish(messages.prefill_finished_body(self.node, done, reused))

    def switch_completed(self, report: SwitchReport) -> None:
        if self._strand_kv:
            self._strand_kv = False
            self.sync.drop_exposed()
            self.runner.drop_cached_kv()
        took = self.clock.now() - self._switch_started
        self.metrics.switched(report, took)
        self.metrics.state(self.engine.mode, self.engine.switch_state, self.generation.value)
        self.hub.publish(messages.switch_body(report, self.generation.value))
        self.hub.publish(messages.state_body(self.state()))
        self._draining = None
        if self._switch_done is not None and not self._switch_done.done():
            self._switch_done.set_result(report)

    def gauges(self, gauges: EngineGauges) -> None:
        self.metrics.engine_gauges(gauges)
        self.metrics.arena_gauges(self.arena.gauges())
        self.sync.retry()

    def fetch_settled(self, pages: Sequence[PageHash]) -> None:
        self.sync.reconcile(pages)

    def queue_report(self, queue: PrefillQueue, time: float) -> None:
        """At an engine step: the state with the prefill queue as of the step, while the node holds prefills
        (and once when the last one left), so the router's queue of this node stays fresh."""
        held = bool(queue.running or queue.queued)
        if not (held or self._queue_reported):
            return
        self._queue_reported = held
        if len(self.hub):
            state = messages.node_state(self.engine, self.generation.value, time, queue=queue)
            self.hub.publish(messages.state_body(state))

    # --- events --------------------------------------------------------------------------------------
    def _snapshot(self) -> list[dict[str, object]]:
        now = self.clock.now()
        return [messages.state_body(self.state()), *messages.kv_bodies(messages.kv_snapshot(self.engine, now))]

    async def _tick_state(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.metrics.subscribers.set(len(self.hub))
            self.metrics.arena_gauges(self.arena.gauges())
            if len(self.hub):
                self.hub.publish(messages.state_body(self.state()))
