"""`Flight`: the live router's record of one request being served, and the ids its attempts use on the wire.

An attempt is one try at serving the request: a prefill on one node, then a decode on another. Each attempt
has its own wire id (`AttemptIds`): the first is the request's own id, every later one `<id>~<n>` with `n`
from a router-wide serial, so no two attempts of the router share an id even when a client reuses a request
id. A node that still holds an id (an abandoned attempt of an earlier router run) refuses it with
ALREADY_EXISTS; the attempt then takes the next serial and is sent again.

What a flight learns from its prefill node's events (`PrefillStarted`, `PrefillFinished`) is kept per
attempt (`AttemptProgress`) and reset when the next attempt starts, so a report of an earlier attempt never
counts for a later one; in particular the cached tokens reported to the client are what the engine reused
for the attempt that served the request.

Boundary: plain records and id generation; the router (`backend.LiveRouter`) drives them.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from evolving_infra.core.types import NodeId
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.core import RoutedRequest
from evolving_infra.router.http.backend import ServingNodes


@dataclass
class AttemptProgress:
    """What the prefill node reported of the current attempt (router times in seconds)."""

    sent_at: float | None = None
    started_at: float | None = None
    reused_tokens: int | None = None
    """Prompt tokens the engine reused (its measurement); None until the node reports it."""
    restored_tokens: int = 0
    finished: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Flight:
    """One request being served: the core's record, its current attempt, and what interrupts that attempt."""

    req: RoutedRequest
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    tokens_sent: int = 0
    token_messages: int = 0
    """Token messages of the serving attempt (one per decode iteration that produced tokens)."""
    finished: bool = False
    wire: str = ""
    """The id the nodes see for the current attempt."""
    progress: AttemptProgress = field(default_factory=AttemptProgress)
    routed_cached: int = 0
    """The routing decision's estimate of the current attempt's reused prompt tokens."""

    prefill_loss: bool = False
    """The interrupt is the loss of the attempt's prefill node (not its decode node)."""
    refused: frozenset[NodeId] = frozenset()
    """Nodes that refused the request's prefill for their phase (switching or switched away from prefill): its
    later attempts are routed elsewhere while another node accepts prefill (`RouterCore.route`'s `exclude`)."""

    def interrupt(self, reason: str, prefill_loss: bool = False) -> None:
        self.reason = reason
        self.prefill_loss = prefill_loss
        self.interrupted.set()

    def new_attempt(self, wire: str, routed_cached: int) -> None:
        self.interrupted.clear()
        self.reason = ""
        self.prefill_loss = False
        self.wire = wire
        self.progress = AttemptProgress()
        self.routed_cached = routed_cached

    def rename(self, wire: str) -> None:
        """Send the attempt again under `wire`; reports that came for the old id (another's) are dropped."""
        self.wire = wire
        self.progress = AttemptProgress(sent_at=self.progress.sent_at)

    @property
    def cached_tokens(self) -> int:
        """Reused prompt tokens to report: the engine's measurement for this attempt, else the estimate."""
        measured = self.progress.reused_tokens
        return self.routed_cached if measured is None else measured

    def serving(self) -> ServingNodes | None:
        """The nodes serving the current attempt, and its wait in the prefill queue when known."""
        req = self.req
        if req.prefill_node is None:
            return None
        p = self.progress
        queue_s = None
        if p.sent_at is not None and p.started_at is not None:
            queue_s = max(0.0, p.started_at - p.sent_at)
        return ServingNodes(str(req.prefill_node), str(req.decode_node) if req.decode_node else None, queue_s)


class AttemptIds:
    """Wire ids of attempts (see the module docstring)."""

    def __init__(self) -> None:
        self._serial = itertools.count(1)

    def first(self, flight: Flight) -> str:
        """The id of the flight's next attempt: its own id on the first, a fresh `<id>~<n>` after that."""
        return flight.req.id if flight.req.attempt == 0 else self.fresh(flight)

    def fresh(self, flight: Flight) -> str:
        """A new id no attempt of this router used (after a node refused the last one as a duplicate)."""
        return f"{flight.req.id}~{next(self._serial)}"


def started(flight: Flight, report: pb.PrefillStarted, now: float) -> None:
    """The attempt's prefill node reported its start (with what the engine reused)."""
    p = flight.progress
    p.started_at = now
    p.reused_tokens = report.cached_tokens
    p.restored_tokens = report.restored_tokens
    p.started.set()


def finished(flight: Flight, report: pb.PrefillFinished, now: float) -> None:
    """The attempt's prefill node reported its end (a start report missed is taken as given)."""
    p = flight.progress
    p.finished = True
    if p.reused_tokens is None:
        p.reused_tokens = report.cached_tokens
    if p.started_at is None:
        p.started_at = now
        p.started.set()
