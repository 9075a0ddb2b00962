"""Conversions between protobuf messages of `evolving_infra.v1` and the core's dataclasses.

Protobuf stays at the edge: services convert incoming messages here and hand dataclasses inward, and
convert outgoing dataclasses here. Every `*_from_proto` validates what the wire cannot (UNSPECIFIED
enums, parallel arrays of equal length) and raises ValueError naming the field; servers answer that
with INVALID_ARGUMENT. Round trips `from_proto(to_proto(x)) == x` hold for every valid value.

Boundary: pure functions; no gRPC calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from evolving_infra.core.itermodel import IterationRecord, PrefillItem
from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Tier
from evolving_infra.node_agent.engine.outputs import PrefillFinished, PrefillStarted, SwitchReport, SwitchState
from evolving_infra.node_agent.engine.requests import DecodeRequest, FetchRun, PrefillRequest
from evolving_infra.node_agent.engine.tier import TierGauges
from evolving_infra.node_agent.transfer.base import TransportKind
from evolving_infra.proto.v1 import node_agent_pb2 as pb

E = TypeVar("E")

_PHASE = {Phase.PREFILL: pb.PHASE_PREFILL, Phase.DECODE: pb.PHASE_DECODE}
_MODE = {
    NodeMode.PREFILL: pb.NODE_MODE_PREFILL,
    NodeMode.DECODE: pb.NODE_MODE_DECODE,
    NodeMode.COLLOCATED: pb.NODE_MODE_COLLOCATED,
}
_TIER = {Tier.GPU: pb.TIER_GPU, Tier.HOST: pb.TIER_HOST}
_SWITCH = {
    SwitchState.SERVING: pb.SWITCH_STATE_SERVING,
    SwitchState.DRAINING: pb.SWITCH_STATE_DRAINING,
    SwitchState.SWITCHED: pb.SWITCH_STATE_SWITCHED,
}
_TRANSPORT = {TransportKind.MOONCAKE_TCP: pb.TRANSPORT_KIND_MOONCAKE_TCP, TransportKind.GRPC: pb.TRANSPORT_KIND_GRPC}


def _reverse(table: Mapping[E, int], value: int, field: str, enum_name: str) -> E:
    for member, number in table.items():
        if number == value:
            return member
    allowed = ", ".join(pb.DESCRIPTOR.enum_types_by_name[enum_name].values_by_number[n].name for n in table.values())
    raise ValueError(f"{field}: {enum_name} value {value} is not allowed here (allowed: {allowed})")


# --- enums ----------------------------------------------------------------------------------------
def phase_to_proto(phase: Phase) -> int:
    return _PHASE[phase]


def phase_from_proto(value: int, field: str = "phase") -> Phase:
    return _reverse(_PHASE, value, field, "Phase")


def mode_to_proto(mode: NodeMode) -> int:
    return _MODE[mode]


def mode_from_proto(value: int, field: str = "mode") -> NodeMode:
    return _reverse(_MODE, value, field, "NodeMode")


def tier_to_proto(tier: Tier | None) -> int:
    """TIER_UNSPECIFIED stands for None (every tier), used by KvCleared only."""
    return pb.TIER_UNSPECIFIED if tier is None else _TIER[tier]


def tier_from_proto(value: int, field: str = "tier") -> Tier:
    return _reverse(_TIER, value, field, "Tier")


def switch_state_to_proto(state: SwitchState) -> int:
    return _SWITCH[state]


def switch_state_from_proto(value: int, field: str = "switch_state") -> SwitchState:
    return _reverse(_SWITCH, value, field, "SwitchState")


def transport_kind_to_proto(kind: TransportKind) -> int:
    return _TRANSPORT[kind]


def transport_kind_from_proto(value: int, field: str = "transport") -> TransportKind:
    return _reverse(_TRANSPORT, value, field, "TransportKind")


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


# --- switch reports and gauges --------------------------------------------------------------------
def switch_report_to_proto(report: SwitchReport, generation: int) -> pb.SwitchCompleted:
    return pb.SwitchCompleted(
        node=report.node,
        source=mode_to_proto(report.source),
        target=mode_to_proto(report.target),
        began=report.began,
        completed=report.completed,
        handed_back=report.handed_back,
        generation=generation,
    )


def switch_report_from_proto(message: pb.SwitchCompleted) -> tuple[SwitchReport, int]:
    """The report and the switch generation it completed."""
    report = SwitchReport(
        node=NodeId(message.node),
        source=mode_from_proto(message.source, "SwitchCompleted.source"),
        target=mode_from_proto(message.target, "SwitchCompleted.target"),
        began=message.began,
        completed=message.completed,
        handed_back=message.handed_back,
    )
    return report, message.generation


def prefill_started_to_proto(node: NodeId, started: PrefillStarted) -> pb.PrefillStarted:
    return pb.PrefillStarted(
        node=node, request_id=started.request, time=started.time, prompt_tokens=started.prompt_tokens,
        cached_tokens=started.cached_tokens, restored_tokens=started.restored_tokens,
    )  # fmt: skip


def prefill_finished_to_proto(node: NodeId, done: PrefillFinished, cached_tokens: int) -> pb.PrefillFinished:
    """`cached_tokens`: what the engine reused for the prefill (its `PrefillStarted` report)."""
    return pb.PrefillFinished(
        node=node, request_id=done.request, time=done.time, pages=len(done.pages), tokens=done.tokens,
        cached_tokens=cached_tokens,
    )  # fmt: skip


def handed_back_to_proto(node: NodeId, request_ids: list[str], generation: int, time: float) -> pb.HandedBack:
    return pb.HandedBack(node=node, request_ids=request_ids, generation=generation, time=time)


def tier_gauges_to_proto(gauges: TierGauges) -> pb.TierGauges:
    return pb.TierGauges(
        capacity=gauges.capacity, free=gauges.free, cached=gauges.cached, pinned=gauges.pinned, in_use=gauges.in_use
    )


def tier_gauges_from_proto(message: pb.TierGauges) -> TierGauges:
    return TierGauges(message.capacity, message.free, message.cached, message.pinned, message.in_use)


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


# --- requests -------------------------------------------------------------------------------------
def trace_to_proto(headers: Mapping[str, str]) -> pb.TraceContext:
    """W3C trace headers (`traceparent`, `tracestate`; other keys are not carried)."""
    return pb.TraceContext(traceparent=headers.get("traceparent", ""), tracestate=headers.get("tracestate", ""))


def trace_from_proto(message: pb.TraceContext) -> dict[str, str]:
    """The non-empty trace headers."""
    headers = {"traceparent": message.traceparent, "tracestate": message.tracestate}
    return {k: v for k, v in headers.items() if v}


def fetch_run_to_proto(run: FetchRun, peer_address: str = "") -> pb.FetchRun:
    return pb.FetchRun(peer=run.peer, pages=run.pages, peer_address=peer_address)


def fetch_run_from_proto(message: pb.FetchRun) -> FetchRun:
    return FetchRun(NodeId(message.peer), tuple(PageHash(p) for p in message.pages))


def _generated(message: pb.SubmitPrefillRequest | pb.SubmitDecodeRequest) -> tuple[PageHash, ...] | None:
    if not message.HasField("generated_pages"):
        return None
    return tuple(PageHash(p) for p in message.generated_pages.pages)


def prefill_request_to_proto(
    req: PrefillRequest, trace: Mapping[str, str] | None = None, peer_addresses: Mapping[str, str] | None = None
) -> pb.SubmitPrefillRequest:
    addresses = peer_addresses or {}
    message = pb.SubmitPrefillRequest(
        request_id=req.request,
        branch_id=req.branch,
        prompt_pages=req.prompt_pages,
        prompt_tokens=req.prompt_tokens,
        output_tokens=req.output_tokens,
        t_acc=req.t_acc,
        fetch=[fetch_run_to_proto(run, addresses.get(run.peer, "")) for run in req.fetch],
        trace=trace_to_proto(trace or {}),
    )
    if req.generated_pages is not None:
        message.generated_pages.pages.extend(req.generated_pages)
        message.generated_pages.SetInParent()
    return message


def prefill_request_from_proto(message: pb.SubmitPrefillRequest) -> PrefillRequest:
    """The engine's request (its own checks raise ValueError naming the request)."""
    return PrefillRequest(
        request=RequestId(message.request_id),
        branch=BranchId(message.branch_id),
        prompt_pages=tuple(PageHash(p) for p in message.prompt_pages),
        prompt_tokens=message.prompt_tokens,
        output_tokens=message.output_tokens,
        t_acc=message.t_acc,
        fetch=tuple(fetch_run_from_proto(run) for run in message.fetch),
        generated_pages=_generated(message),
    )


def decode_request_to_proto(
    req: DecodeRequest, fetch: tuple[FetchRun, ...] = (), trace: Mapping[str, str] | None = None
) -> pb.SubmitDecodeRequest:
    message = pb.SubmitDecodeRequest(
        request_id=req.request,
        branch_id=req.branch,
        prompt_pages=req.prompt_pages,
        prompt_tokens=req.prompt_tokens,
        output_tokens=req.output_tokens,
        t_acc=req.t_acc,
        fetch=[fetch_run_to_proto(run) for run in fetch],
        trace=trace_to_proto(trace or {}),
    )
    if req.generated_pages is not None:
        message.generated_pages.pages.extend(req.generated_pages)
        message.generated_pages.SetInParent()
    return message


def decode_request_from_proto(message: pb.SubmitDecodeRequest) -> tuple[DecodeRequest, tuple[FetchRun, ...]]:
    """The engine's request and where its prompt KV is to be fetched from."""
    req = DecodeRequest(
        request=RequestId(message.request_id),
        branch=BranchId(message.branch_id),
        prompt_pages=tuple(PageHash(p) for p in message.prompt_pages),
        prompt_tokens=message.prompt_tokens,
        output_tokens=message.output_tokens,
        t_acc=message.t_acc,
        generated_pages=_generated(message),
    )
    return req, tuple(fetch_run_from_proto(run) for run in message.fetch)
