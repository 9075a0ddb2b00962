"""What the engine core tells its driver: effects of every call, and the result of one `step`.

The driver (simulator or node agent service) carries out the effects: it runs each `FetchStarted` and
reports `fetch_completed`; after a `PrefillStarted` without `local_decode` it binds a decode node; after a
`PrefillFinished` without `local_decode` it sends `pages` / `tokens` of KV there; it forwards the KV
events to the directory and the `IterationRecord`s to model fitting; and it calls `step` again at
`now + duration` (or, when idle, at `wake_at` or on new input).

Boundary: immutable values only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from evolving_infra.core.itermodel import IterationRecord
from evolving_infra.core.kv_events import KvEvent
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, NodeMode, RequestId
from evolving_infra.node_agent.engine.kvpool import PoolGauges
from evolving_infra.node_agent.engine.requests import DecodeRequest, PrefillRequest


class DataPlane(enum.Enum):
    """How prefix KV from host memory reaches GPU memory on a prefill node."""

    ASYNC_FETCH = "async-fetch"
    """Ours: fetch from peers and load into L1 while the request waits; it runs only once loaded."""
    HICACHE_LOADBACK = "hicache-loadback"
    """Baseline: runnable at once; the load into L1 starts with its prefill and delays that iteration."""


class IterationKind(enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    DECODE = "decode"


class SwitchState(enum.Enum):
    SERVING = "serving"
    """Serving its mode; no switch has happened yet."""
    DRAINING = "draining"
    """Refusing new work, finishing the running requests of the old phase."""
    SWITCHED = "switched"
    """Serving the mode of the last completed switch."""


@dataclass(frozen=True, slots=True)
class FetchStarted:
    """Pull `pages` (`tokens`, `bytes` of KV) from `peer`'s host memory into this node's host memory."""

    request: RequestId
    peer: NodeId
    pages: tuple[PageHash, ...]
    tokens: int
    bytes: int
    time: float


@dataclass(frozen=True, slots=True)
class Effects:
    """What a call other than `step` changed: KV events and fetches to start. `applied` is False when a
    late call concerned a request the engine no longer holds (handed back by a switch, or absorbed)."""

    events: tuple[KvEvent, ...] = ()
    fetches: tuple[FetchStarted, ...] = ()
    applied: bool = True


@dataclass(frozen=True, slots=True)
class PrefillStarted:
    """A prefill got its first chunk this iteration: the moment to bind a decode node (unless local)."""

    request: RequestId
    branch: BranchId
    time: float
    prompt_tokens: int
    cached_tokens: int
    restored_tokens: int
    local_decode: bool


@dataclass(frozen=True, slots=True)
class PrefillFinished:
    """A prefill completed at `time`; send `pages` (full pages) and `tokens` of KV to the decode node,
    unless `local_decode` (collocated: it decodes here, no transfer)."""

    request: RequestId
    branch: BranchId
    time: float
    pages: tuple[PageHash, ...]
    tokens: int
    local_decode: bool


@dataclass(frozen=True, slots=True)
class DecodeFinished:
    request: RequestId
    branch: BranchId
    time: float
    output_tokens: int


@dataclass(frozen=True, slots=True)
class SwitchReport:
    """A completed phase switch: `drain` seconds from `began` to `completed`."""

    node: NodeId
    source: NodeMode
    target: NodeMode
    began: float
    completed: float
    handed_back: int

    @property
    def drain(self) -> float:
        return self.completed - self.began


@dataclass(frozen=True, slots=True)
class SwitchBegun:
    """Result of `begin_switch`: the queued requests handed back (in arrival order) for re-routing."""

    handed_back: tuple[PrefillRequest | DecodeRequest, ...]
    events: tuple[KvEvent, ...]
    completed: SwitchReport | None


@dataclass(frozen=True, slots=True)
class EngineGauges:
    """Pool gauges and queue lengths. `prefill_waiting` counts queued prefills not yet runnable
    (waiting for room, a fetch or a load); `prefill_queued` counts all queued ones."""

    mode: NodeMode
    switch_state: SwitchState
    pool: PoolGauges
    prefill_queued: int
    prefill_waiting: int
    prefill_running: int
    decode_queued: int
    decode_running: int


class StepOutput(NamedTuple):
    """One iteration (or idle) starting at `now` and lasting `duration` seconds.

    An immutable named tuple (one per iteration; a frozen dataclass of this many fields is several times
    slower to make). Every field is given: the engine's `step` is the only maker."""

    now: float
    kind: IterationKind
    duration: float
    record: IterationRecord | None
    events: tuple[KvEvent, ...]
    fetches_started: tuple[FetchStarted, ...]
    prefills_started: tuple[PrefillStarted, ...]
    prefills_finished: tuple[PrefillFinished, ...]
    decode_tokens: dict[RequestId, int]
    """New tokens per running decode request; empty when the engine was made with `report_detail=False`."""
    decodes_finished: tuple[DecodeFinished, ...]
    load_stall: float
    """Seconds of the duration spent waiting for KV to reach GPU memory (HiCache load-back only)."""
    switch_completed: SwitchReport | None
    wake_at: float | None
    """When idle: the earliest time queued work becomes runnable without new input (a load finishing)."""
    gauges: EngineGauges | None
    """The engine's gauges after the step; None when the engine was made with `report_detail=False`."""

    @property
    def end(self) -> float:
        return self.now + self.duration
