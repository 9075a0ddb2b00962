"""`EventHub`: fans a node's `NodeEvent`s out to any number of `StreamEvents` subscribers.

Each subscriber gets its own bounded queue and its own gap-free `sequence` (1, 2, ...). It starts with a
state snapshot and a KV snapshot (`KvCleared` of every tier, then `KvStored` of every resident page with
its parent), taken in the same event-loop step as the subscription, then every event as published.
Replaying later KV events on top of the snapshot gives the node's resident sets: each event sets a
page's presence, so an event already reflected in the snapshot changes nothing when it comes again.
A subscriber whose queue is full is dropped (its stream ends with RESOURCE_EXHAUSTED and it resubscribes)
rather than silently missing events; publishing never blocks.

Boundary: fan-out and ordering of protobuf messages; the messages come from the node (`node.NodeAgent`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from evolving_infra.proto.v1 import node_agent_pb2 as pb

_END = object()


class SubscriberDropped(Exception):
    """The subscriber fell more than its queue size behind."""


class Subscription:
    """One subscriber's queue; iterate it for `NodeEvent`s."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.queue: asyncio.Queue[object] = asyncio.Queue(maxsize=size)
        self.sequence = 0
        self.dropped = False

    def offer(self, body: dict[str, object]) -> bool:
        """Queue one message (False if the queue is full: the subscriber is then dropped)."""
        if self.dropped:
            return False
        try:
            self.queue.put_nowait(pb.NodeEvent(sequence=self.sequence + 1, **body))  # type: ignore[arg-type]  # body holds one oneof field of NodeEvent
        except asyncio.QueueFull:
            self.dropped = True
            return False
        self.sequence += 1
        return True

    def close(self) -> None:
        """End the stream after what is queued (a slot is made if the queue is full)."""
        if self.queue.full():
            self.dropped = True
            try:
                self.queue.get_nowait()
            except asyncio.QueueEmpty:  # pragma: no cover - full queue
                pass
        self.queue.put_nowait(_END)

    async def __aiter__(self) -> AsyncIterator[pb.NodeEvent]:
        while True:
            item = await self.queue.get()
            if item is _END:
                if self.dropped:
                    raise SubscriberDropped(f"subscriber {self.name!r} fell more than {self.queue.maxsize} events behind")
                return
            yield item  # type: ignore[misc]  # the queue holds events and the _END marker


class EventHub:
    """Subscribers and publication (see the module docstring)."""

    def __init__(self, queue_size: int, snapshot: Callable[[], list[dict[str, object]]]) -> None:
        self.queue_size = queue_size
        self.snapshot = snapshot
        self._subs: list[Subscription] = []
        self.dropped = 0
        self.on_drop: Callable[[Subscription], None] | None = None

    def __len__(self) -> int:
        return len(self._subs)

    def subscribe(self, name: str) -> Subscription:
        snapshot = self.snapshot()
        sub = Subscription(name, max(self.queue_size, len(snapshot) + 1))
        for body in snapshot:
            sub.offer(body)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def publish(self, body: dict[str, object]) -> None:
        """Send one message body, e.g. `{"kv": KvEventBatch}` or `{"iteration": IterationReport}`."""
        for sub in list(self._subs):
            if not sub.offer(body):
                self._subs.remove(sub)
                self.dropped += 1
                sub.close()
                if self.on_drop is not None:
                    self.on_drop(sub)

    def close(self) -> None:
        """End every subscriber's stream (shutdown)."""
        for sub in self._subs:
            sub.close()
        self._subs = []
