"""Conversions between `evolving_infra.v1` messages and the pure core's values, shared by every service.

The node agent (`node_agent.api.convert`, which adds its engine's own types) and the router
(`router.service.wire`) both speak these messages; the conversions of core values live here once, with the
node report's prefill queue (`set_prefill_queue`, `prefill_queue_from_proto`) and a SwitchPhase call's mode
and downtime (`SwitchHow`). Every `*_from_proto` validates what the wire cannot (UNSPECIFIED enums, parallel
arrays of equal length) and raises ValueError naming the field. Round trips `from_proto(to_proto(x)) == x`
hold for every valid value.

Boundary: pure functions over `evolving_infra.proto.v1` messages and `evolving_infra.core` values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.itermodel import IterationRecord, PrefillItem
from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, NodeMode, Phase, SwitchMode, Tier
from evolving_infra.proto.v1 import node_agent_pb2 as pb

E = TypeVar("E")

REJECT_REASON_KEY = "evolving-reject-reason"
"""Trailing metadata key of a node's refusal: its `RejectReason` enum name (set by the node agent's
`ServiceError`, read by the router)."""

_PHASE = {Phase.PREFILL: pb.PHASE_PREFILL, Phase.DECODE: pb.PHASE_DECODE}
_MODE = {
    NodeMode.PREFILL: pb.NODE_MODE_PREFILL,
    NodeMode.DECODE: pb.NODE_MODE_DECODE,
    NodeMode.COLLOCATED: pb.NODE_MODE_COLLOCATED,
}
_TIER = {Tier.GPU: pb.TIER_GPU, Tier.HOST: pb.TIER_HOST}
_SWITCH_MODE = {
    SwitchMode.IN_PLACE: pb.SWITCH_MODE_IN_PLACE,
    SwitchMode.IN_PLACE_STRAND_KV: pb.SWITCH_MODE_IN_PLACE_STRAND_KV,
    SwitchMode.RELAUNCH: pb.SWITCH_MODE_RELAUNCH,
}


def reverse_enum(table: Mapping[E, int], value: int, field: str, enum_name: str) -> E:
    for member, number in table.items():
        if number == value:
            return member
    allowed = ", ".join(pb.DESCRIPTOR.enum_types_by_name[enum_name].values_by_number[n].name for n in table.values())
    raise ValueError(f"{field}: {enum_name} value {value} is not allowed here (allowed: {allowed})")


# --- enums ----------------------------------------------------------------------------------------
def phase_to_proto(phase: Phase) -> pb.Phase:
    return _PHASE[phase]


def phase_from_proto(value: int, field: str = "phase") -> Phase:
    return reverse_enum(_PHASE, value, field, "Phase")


def mode_to_proto(mode: NodeMode) -> pb.NodeMode:
    return _MODE[mode]


def mode_from_proto(value: int, field: str = "mode") -> NodeMode:
    return reverse_enum(_MODE, value, field, "NodeMode")


def tier_to_proto(tier: Tier | None) -> pb.Tier:
    """TIER_UNSPECIFIED stands for None (every tier), used by KvCleared only."""
    return pb.TIER_UNSPECIFIED if tier is None else _TIER[tier]


def tier_from_proto(value: int, field: str = "tier") -> Tier:
    return reverse_enum(_TIER, value, field, "Tier")


# --- phase switches ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SwitchHow:
    """How a SwitchPhase call asks the node to switch: the mode and, for RELAUNCH, the downtime in seconds."""

    mode: SwitchMode = SwitchMode.IN_PLACE
    relaunch_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.mode, SwitchMode):
            raise ValueError(f"mode must be a SwitchMode, got {self.mode!r}")
        if not (math.isfinite(self.relaunch_s) and self.relaunch_s >= 0):
            raise ValueError(f"relaunch_seconds must be a finite number >= 0, got {self.relaunch_s}")
        if self.relaunch_s > 0 and self.mode is not SwitchMode.RELAUNCH:
            raise ValueError(f"relaunch_seconds {self.relaunch_s} is set, but mode is {self.mode.value}, not relaunch")


def switch_request_to_proto(target: Phase, generation: int, how: SwitchHow = SwitchHow()) -> pb.SwitchPhaseRequest:
    return pb.SwitchPhaseRequest(
        target=phase_to_proto(target), generation=generation, mode=_SWITCH_MODE[how.mode], relaunch_seconds=how.relaunch_s
    )


def switch_how_from_proto(message: pb.SwitchPhaseRequest) -> SwitchHow:
    """The request's mode (UNSPECIFIED: in place, what an older caller means) and downtime; ValueError names
    the field that is wrong."""
    if message.mode == pb.SWITCH_MODE_UNSPECIFIED:
        mode = SwitchMode.IN_PLACE
    else:
        mode = reverse_enum(_SWITCH_MODE, message.mode, "SwitchPhaseRequest.mode", "SwitchMode")
    try:
        return SwitchHow(mode, message.relaunch_seconds)
    except ValueError as error:
        raise ValueError(f"SwitchPhaseRequest.relaunch_seconds: {error}") from None


# --- the prefill queue of a node report ------------------------------------------------------------
class RunningPrefillLike(Protocol):
    """A running chunked prefill, as the engine (`RunningChunk`) and the router (`RunningPrefill`) hold it."""

    @property
    def request(self) -> str: ...
    @property
    def remaining_tokens(self) -> int: ...
    @property
    def context_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ReportedPrefills:
    """A node report's prefill queue: (request id, remaining tokens, context tokens) of each running prefill,
    and the queued ids in the order they will run."""

    running: tuple[tuple[str, int, int], ...]
    queued: tuple[str, ...]


def set_prefill_queue(state: pb.NodeState, running: Iterable[RunningPrefillLike], queued: Iterable[str]) -> pb.NodeState:
    """Fill `state`'s prefill queue fields (and mark them reported); returns `state`."""
    state.running_prefills.extend(
        pb.RunningPrefill(request_id=r.request, remaining_tokens=r.remaining_tokens, context_tokens=r.context_tokens)
        for r in running
    )
    state.queued_prefills.extend(queued)
    state.prefill_queue_reported = True
    return state


def prefill_queue_from_proto(state: pb.NodeState) -> ReportedPrefills | None:
    """The report's prefill queue, or None when the node does not report one (an older node agent)."""
    if not state.prefill_queue_reported:
        return None
    running = []
    for i, r in enumerate(state.running_prefills):
        if not r.request_id:
            raise ValueError(f"NodeState.running_prefills[{i}].request_id is empty")
        running.append((r.request_id, r.remaining_tokens, r.context_tokens))
    return ReportedPrefills(tuple(running), tuple(state.queued_prefills))


# --- KV events ------------------------------------------------------------------------------------
def kv_event_to_proto(event: KvEvent) -> pb.KvEvent:
    if isinstance(event, KvStored):
        stored = pb.KvStored(node=event.node, tier=tier_to_proto(event.tier), pages=event.pages, time=event.time)
        if event.parent is not None:
            stored.parent = event.parent
        return pb.KvEvent(stored=stored)
    if isinstance(event, KvRemoved):
        removed = pb.KvRemoved(node=event.node, tier=tier_to_proto(event.tier), pages=event.pages, time=event.time)
        return pb.KvEvent(removed=removed)
    if isinstance(event, KvCleared):
        return pb.KvEvent(cleared=pb.KvCleared(node=event.node, tier=tier_to_proto(event.tier), time=event.time))
    raise TypeError(f"not a KV event: {event!r}")


def kv_event_from_proto(message: pb.KvEvent) -> KvEvent:
    kind = message.WhichOneof("event")
    if kind == "stored":
        s = message.stored
        parent = PageHash(s.parent) if s.HasField("parent") else None
        pages = tuple(PageHash(p) for p in s.pages)
        return KvStored(NodeId(s.node), tier_from_proto(s.tier, "KvStored.tier"), parent, pages, s.time)
    if kind == "removed":
        r = message.removed
        pages = tuple(PageHash(p) for p in r.pages)
        return KvRemoved(NodeId(r.node), tier_from_proto(r.tier, "KvRemoved.tier"), pages, r.time)
    if kind == "cleared":
        c = message.cleared
        tier = None if c.tier == pb.TIER_UNSPECIFIED else tier_from_proto(c.tier, "KvCleared.tier")
        return KvCleared(NodeId(c.node), tier, c.time)
    raise ValueError("KvEvent: none of stored, removed, cleared is set")


def kv_batch_to_proto(events: tuple[KvEvent, ...] | list[KvEvent]) -> pb.KvEventBatch:
    return pb.KvEventBatch(events=[kv_event_to_proto(e) for e in events])


def kv_batch_from_proto(message: pb.KvEventBatch) -> tuple[KvEvent, ...]:
    return tuple(kv_event_from_proto(e) for e in message.events)


# --- iteration reports ----------------------------------------------------------------------------
def prefill_item_to_proto(item: PrefillItem) -> pb.PrefillItem:
    return pb.PrefillItem(t_uc=item.t_uc, t_c=item.t_c, t_rst=item.t_rst)


def prefill_item_from_proto(message: pb.PrefillItem) -> PrefillItem:
    return PrefillItem(t_uc=message.t_uc, t_c=message.t_c, t_rst=message.t_rst)


def iteration_to_proto(record: IterationRecord) -> pb.IterationReport:
    return pb.IterationReport(
        node=record.node,
        phase=phase_to_proto(record.phase),
        start=record.start,
        duration=record.duration,
        prefill=[prefill_item_to_proto(i) for i in record.prefill],
        decode_batch=record.decode_batch,
    )


def iteration_from_proto(message: pb.IterationReport) -> IterationRecord:
    return IterationRecord(
        node=NodeId(message.node),
        phase=phase_from_proto(message.phase, "IterationReport.phase"),
        start=message.start,
        duration=message.duration,
        prefill=tuple(prefill_item_from_proto(i) for i in message.prefill),
        decode_batch=message.decode_batch,
    )


# --- branch counts --------------------------------------------------------------------------------
def counts_to_proto(counts: Mapping[PageHash, int], sequence: int = 0) -> pb.CountUpdate:
    return pb.CountUpdate(sequence=sequence, pages=list(counts), counts=list(counts.values()))


def counts_from_proto(message: pb.CountUpdate) -> dict[PageHash, int]:
    """page -> count; a page named twice keeps its last count."""
    if len(message.pages) != len(message.counts):
        raise ValueError(
            f"CountUpdate {message.sequence}: {len(message.pages)} pages but {len(message.counts)} counts "
            "(the arrays are parallel and must have equal length)"
        )
    return {PageHash(p): c for p, c in zip(message.pages, message.counts, strict=True)}


def fetch_run_to_proto(run: FetchRun, peer_address: str = "") -> pb.FetchRun:
    """A bound run as the wire carries it: the peer it is pulled from and its page hashes."""
    return pb.FetchRun(peer=run.peer, pages=run.pages, peer_address=peer_address)


def fetch_runs_from_proto(messages: Iterable[pb.FetchRun], prompt: tuple[PageHash, ...]) -> tuple[FetchRun, ...]:
    """The runs of `messages`, bound to the request's `prompt` pages: a message's pages must be prompt pages in
    prompt order; where they skip pages they become several runs. Raises ValueError naming the page otherwise."""
    return tuple(
        run
        for message in messages
        for run in FetchRun.runs_of(NodeId(message.peer), tuple(PageHash(p) for p in message.pages), prompt)
    )
