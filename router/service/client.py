"""`NodeClient`: the router's gRPC client to one node agent (grpc.aio), every call with a deadline.

- unary calls: `submit_prefill`, `switch_phase`, `get_state`, `cancel` (an abandoned request's prefill);
- `submit_decode`: the server stream of one decode (the caller iterates it and may cancel it);
- `StreamEvents`: one subscription kept open in a task; each message goes to `on_event`. When the stream
  fails, or goes silent for `liveness_s` and the node then does not answer a `GetState` probe within
  `probe_timeout_s` (a hung or stopped process: detected within 5 s by default), the node is reported
  down (`on_down`, once) and the client resubscribes with exponential backoff
  (`backoff_first_s` doubling up to `backoff_max_s`); the first message of a new subscription (a state
  snapshot) reports it up again (`on_up`). A new subscription starts with a KV snapshot, so the router's
  directory is rebuilt from it;
- `PushCounts`: one client stream kept open in a task, fed from a queue (`push_counts` never blocks); after a
  broken stream the client reconnects and `on_up` lets the owner resend the node's full counts.

Every call carries the cluster credentials of the endpoint (`NodeCredentials`: the token as
`authorization` metadata, and/or mutual TLS).

Boundary: transport only; what the messages mean is the owner's (`backend.LiveRouter`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Phase, SwitchMode
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.proto.convert import SwitchHow, counts_to_proto, switch_request_to_proto

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)
_END = object()
LIVENESS_S = 3.0
"""Silence on a node's event stream (which carries a state snapshot every second by default) after which
the node is probed."""
PROBE_TIMEOUT_S = 2.0
"""Deadline of that probe: a node is marked down within LIVENESS_S + PROBE_TIMEOUT_S = 5 s of going silent."""

CANCEL_TIMEOUT_S = 2.0
"""Deadline of a `Cancel` call (the node answers from its event loop at once)."""


class _Silent(Exception):
    """A node's event stream went silent and the node did not answer a probe."""
MAX_GENERATION = (1 << 53) - 1
"""Largest switch generation a node agent accepts (its `limits.MAX_GENERATION`); the router neither sends
nor believes a larger one, so its next generation (max + 1) can never overflow."""


def _local_error(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.OUT_OF_RANGE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def generation_in_range(event: pb.NodeEvent) -> bool:
    """False for an event carrying a switch generation no conforming node agent reports."""
    kind = event.WhichOneof("body")
    if kind == "state":
        return event.state.generation <= MAX_GENERATION
    if kind == "switch_completed":
        return event.switch_completed.generation <= MAX_GENERATION
    if kind == "handed_back":
        return event.handed_back.generation <= MAX_GENERATION
    return True


class CredentialsError(ValueError):
    """Cluster credentials are missing, unreadable or malformed (the message names the file)."""


@dataclass(frozen=True, slots=True)
class NodeCredentials:
    """What the router presents to node agents: the cluster token (sent as `authorization: Bearer <token>`
    metadata on every call) and/or mutual TLS PEM bytes (certificate chain, key, cluster CA)."""

    token: str | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    tls_ca: bytes | None = None
    server_name: str | None = None
    """With TLS: the name the node agents' certificates carry, checked instead of the address dialled."""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer " + self.token),) if self.token else ()


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()[: 1 << 20]
    except OSError as error:
        raise CredentialsError(f"{what} {str(path)!r}: cannot read it ({error.strerror or error})") from error
    if not data.strip():
        raise CredentialsError(f"{what} {str(path)!r}: the file is empty")
    return data


def load_node_credentials(
    token_file: Path | None, cert: Path | None, key: Path | None, ca: Path | None, insecure: bool, server_name: str | None = None
) -> NodeCredentials | None:
    """The router's cluster credentials from files; None for an explicitly insecure cluster. Raises
    `CredentialsError` when none are given without `insecure`, or when a file is bad."""
    token = None
    if token_file is not None:
        raw = _read(token_file, "cluster token file")
        try:
            token = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise CredentialsError(f"cluster token file {str(token_file)!r}: the token must be ASCII") from None
        if not 16 <= len(token) <= 4096 or not token.isprintable() or " " in token:
            raise CredentialsError(f"cluster token file {str(token_file)!r}: 16-4096 printable characters without spaces")
    paths = (cert, key, ca)
    if any(p is not None for p in paths) and not all(p is not None for p in paths):
        raise CredentialsError("mutual TLS needs all three of tls_cert_file, tls_key_file and tls_ca_file")
    tls = tuple(_read(p, "TLS file") for p in paths if p is not None)
    if token is None and not tls:
        if insecure:
            return None
        raise CredentialsError(
            "no cluster credentials for the node agents: give cluster_token_file or the tls_* files, "
            "or --insecure (local runs only)"
        )
    if not tls:
        return NodeCredentials(token)
    cert_pem, key_pem, ca_pem = tls
    return NodeCredentials(token, cert_pem, key_pem, ca_pem, server_name)


def open_channel(address: str, credentials: NodeCredentials | None) -> grpc.aio.Channel:
    """A channel to a node agent with mutual TLS when `credentials` has it (else insecure), with keepalive
    pings. The token is not the channel's: every call passes `credentials.metadata()`."""
    if credentials is not None and credentials.tls_ca is not None:
        tls = grpc.ssl_channel_credentials(credentials.tls_ca, credentials.tls_key, credentials.tls_cert)
        name = (("grpc.ssl_target_name_override", credentials.server_name),) if credentials.server_name else ()
        return grpc.aio.secure_channel(address, tls, options=(*CHANNEL_OPTIONS, *name))
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    node: NodeId
    address: str
    credentials: NodeCredentials | None = None
    """What to present to this node (None: an insecure cluster)."""


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
        liveness_s: float = LIVENESS_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.node = endpoint.node
        self.address = endpoint.address
        self.rpc_timeout_s = rpc_timeout_s
        self.on_event, self.on_down, self.on_up = on_event, on_down, on_up
        self.backoff_first_s, self.backoff_max_s = backoff_first_s, backoff_max_s
        self.liveness_s, self.probe_timeout_s = liveness_s, probe_timeout_s
        self.channel = open_channel(endpoint.address, endpoint.credentials)
        self.metadata = endpoint.credentials.metadata() if endpoint.credentials is not None else ()
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
        return await self.stub.SubmitPrefill(message, timeout=self.rpc_timeout_s, metadata=self.metadata)

    def submit_decode(self, message: pb.SubmitDecodeRequest, timeout: float) -> grpc.aio.UnaryStreamCall:
        return self.stub.SubmitDecode(message, timeout=max(0.001, timeout), metadata=self.metadata)

    async def switch_phase(
        self, phase: Phase, generation: int, timeout: float, mode: SwitchMode = SwitchMode.IN_PLACE, relaunch_s: float = 0.0
    ) -> pb.SwitchPhaseResponse:
        # `mode` RELAUNCH: the node serves nothing for `relaunch_s` seconds of its clock and answers once it serves
        # `phase` (`timeout` must cover the downtime); a bad mode or downtime raises ValueError before sending.
        """SwitchPhase; a generation outside [0, MAX_GENERATION], sent or answered, fails as OUT_OF_RANGE
        (an `AioRpcError`, like any refused call) and is never sent or believed."""
        if not 0 <= generation <= MAX_GENERATION:
            raise _local_error(f"switch generation {generation} is outside [0, {MAX_GENERATION}]")
        request = switch_request_to_proto(phase, generation, SwitchHow(mode, relaunch_s))
        answer = await self.stub.SwitchPhase(request, timeout=timeout, metadata=self.metadata)
        if answer.generation > MAX_GENERATION:
            raise _local_error(f"node {self.node} answered switch generation {answer.generation} > {MAX_GENERATION}")
        return answer

    async def cancel(self, request_id: str, reason: str) -> pb.CancelResponse:
        """Cancel the request's prefill and decode on this node (whichever it holds); idempotent."""
        message = pb.CancelRequest(request_id=request_id, reason=reason[:256])
        return await self.stub.Cancel(message, timeout=min(self.rpc_timeout_s, CANCEL_TIMEOUT_S), metadata=self.metadata)

    async def get_state(self) -> pb.NodeState:
        return await self.stub.GetState(pb.GetStateRequest(), timeout=self.rpc_timeout_s, metadata=self.metadata)

    def push_counts(self, counts: Mapping[PageHash, int]) -> None:
        """Queue a count update (sent on the node's PushCounts stream)."""
        if counts and not self._closed:
            self._counts.put_nowait(dict(counts))

    # --- background streams --------------------------------------------------------------------------
    async def _events(self) -> None:
        backoff = self.backoff_first_s
        while not self._closed:
            reason = "event stream ended"
            call: grpc.aio.UnaryStreamCall | None = None
            try:
                call = self.stub.StreamEvents(pb.StreamEventsRequest(subscriber="router"), metadata=self.metadata)
                async for event in self._watched(call):
                    if not self.up:
                        self.up = True
                        backoff = self.backoff_first_s
                        self.on_up(self.node)
                    if not generation_in_range(event):
                        log.warning("node %s: event with a switch generation above %d ignored", self.node, MAX_GENERATION)
                        continue
                    self.on_event(self.node, event)
            except _Silent as silent:
                reason = str(silent)
                call.cancel()  # type: ignore[union-attr]  # _Silent comes from _watched(call): call is set
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

    async def _watched(self, call: grpc.aio.UnaryStreamCall) -> AsyncIterator[pb.NodeEvent]:
        """The stream's messages; when none arrives for `liveness_s`, the node is asked for its state with
        a `probe_timeout_s` deadline, and one that does not answer raises `_Silent` (a stopped or hung
        node is thus noticed within liveness_s + probe_timeout_s, whatever TCP and keepalives do)."""
        it = call.__aiter__()
        loop = asyncio.get_running_loop()
        while True:
            pending = loop.create_task(it.__anext__())
            try:
                while True:
                    done, _ = await asyncio.wait({pending}, timeout=self.liveness_s)
                    if done:
                        break
                    try:
                        await self.stub.GetState(pb.GetStateRequest(), timeout=self.probe_timeout_s, metadata=self.metadata)
                    except grpc.aio.AioRpcError as error:
                        raise _Silent(
                            f"no event for {self.liveness_s:g} s and no answer to a state probe within "
                            f"{self.probe_timeout_s:g} s ({error.code().name})"
                        ) from None
            except BaseException:
                pending.cancel()
                raise
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event

    async def _updates(self) -> AsyncIterator[pb.CountUpdate]:
        while True:
            item = await self._counts.get()
            if item is _END:
                return
            self._sequence += 1
            yield counts_to_proto(item, self._sequence)  # type: ignore[arg-type]  # the queue holds counts and the _END marker

    async def _pushes(self) -> None:
        backoff = self.backoff_first_s
        while not self._closed:
            try:
                await self.stub.PushCounts(self._updates(), metadata=self.metadata)
                return
            except grpc.aio.AioRpcError as error:
                log.debug("node %s: count stream broke (%s); reconnecting", self.node, error.code().name)
            await asyncio.sleep(backoff)
            backoff = min(self.backoff_max_s, backoff * 2)
