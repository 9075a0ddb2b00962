"""Conversions between protobuf messages of `evolving_infra.v1` and the core's dataclasses.

Protobuf stays at the edge: services convert incoming messages here and hand dataclasses inward, and
convert outgoing dataclasses here. Every `*_from_proto` validates what the wire cannot (UNSPECIFIED
enums, parallel arrays of equal length) and raises ValueError naming the field; servers answer that
with INVALID_ARGUMENT. Round trips `from_proto(to_proto(x)) == x` hold for every valid value. Conversions
of the pure core's values (phases, tiers, KV events, iteration reports, counts) are shared with the router and
live in `evolving_infra.proto.convert`; they are re-exported here.

Boundary: pure functions; no gRPC calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, RequestId
from evolving_infra.node_agent.engine.outputs import PrefillFinished, PrefillStarted, SwitchReport, SwitchState
from evolving_infra.core.fetch import FetchRun
from evolving_infra.node_agent.engine.requests import DecodeRequest, PrefillRequest
from evolving_infra.node_agent.api.limits import MAX_PROMPT_PAGES, check_count, check_request_fields
from evolving_infra.node_agent.engine.tier import TierGauges
from evolving_infra.node_agent.transfer.base import TransportKind
from evolving_infra.proto.convert import (  # noqa: F401 - re-exported: the node agent's edge in one place
    fetch_run_to_proto,
    fetch_runs_from_proto,
    counts_from_proto,
    counts_to_proto,
    iteration_from_proto,
    iteration_to_proto,
    kv_batch_from_proto,
    kv_batch_to_proto,
    kv_event_from_proto,
    kv_event_to_proto,
    mode_from_proto,
    mode_to_proto,
    phase_from_proto,
    phase_to_proto,
    prefill_item_from_proto,
    prefill_item_to_proto,
    reverse_enum,
    tier_from_proto,
    tier_to_proto,
)
from evolving_infra.proto.v1 import node_agent_pb2 as pb

_SWITCH = {
    SwitchState.SERVING: pb.SWITCH_STATE_SERVING,
    SwitchState.DRAINING: pb.SWITCH_STATE_DRAINING,
    SwitchState.SWITCHED: pb.SWITCH_STATE_SWITCHED,
}
_TRANSPORT = {TransportKind.MOONCAKE_TCP: pb.TRANSPORT_KIND_MOONCAKE_TCP, TransportKind.GRPC: pb.TRANSPORT_KIND_GRPC}


# --- enums ----------------------------------------------------------------------------------------
def switch_state_to_proto(state: SwitchState) -> pb.SwitchState:
    return _SWITCH[state]


def switch_state_from_proto(value: int, field: str = "switch_state") -> SwitchState:
    return reverse_enum(_SWITCH, value, field, "SwitchState")


def transport_kind_to_proto(kind: TransportKind) -> pb.TransportKind:
    return _TRANSPORT[kind]


def transport_kind_from_proto(value: int, field: str = "transport") -> TransportKind:
    return reverse_enum(_TRANSPORT, value, field, "TransportKind")


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


# --- requests -------------------------------------------------------------------------------------
def trace_to_proto(headers: Mapping[str, str]) -> pb.TraceContext:
    """W3C trace headers (`traceparent`, `tracestate`; other keys are not carried)."""
    return pb.TraceContext(traceparent=headers.get("traceparent", ""), tracestate=headers.get("tracestate", ""))


def trace_from_proto(message: pb.TraceContext) -> dict[str, str]:
    """The non-empty trace headers."""
    headers = {"traceparent": message.traceparent, "tracestate": message.tracestate}
    return {k: v for k, v in headers.items() if v}


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


def _check_bounds(where: str, message: pb.SubmitPrefillRequest | pb.SubmitDecodeRequest) -> None:
    fetch = [(run.peer, len(run.pages), run.peer_address) for run in message.fetch]
    check_request_fields(
        where, message.request_id, message.branch_id, len(message.prompt_pages), message.prompt_tokens,
        message.output_tokens, message.t_acc, fetch,
    )  # fmt: skip
    if message.HasField("generated_pages"):
        check_count(len(message.generated_pages.pages), f"{where}.generated_pages (count)", 0, MAX_PROMPT_PAGES)


def prefill_request_from_proto(message: pb.SubmitPrefillRequest) -> PrefillRequest:
    """The engine's request, its ids, sizes and numbers bounded first (`limits`); the engine's own checks
    raise ValueError naming the request."""
    _check_bounds("SubmitPrefillRequest", message)
    prompt = tuple(PageHash(p) for p in message.prompt_pages)
    return PrefillRequest(
        request=RequestId(message.request_id),
        branch=BranchId(message.branch_id),
        prompt_pages=prompt,
        prompt_tokens=message.prompt_tokens,
        output_tokens=message.output_tokens,
        t_acc=message.t_acc,
        fetch=fetch_runs_from_proto(message.fetch, prompt),
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
    """The engine's request and where its prompt KV is to be fetched from (bounded first, as a prefill)."""
    _check_bounds("SubmitDecodeRequest", message)
    req = DecodeRequest(
        request=RequestId(message.request_id),
        branch=BranchId(message.branch_id),
        prompt_pages=tuple(PageHash(p) for p in message.prompt_pages),
        prompt_tokens=message.prompt_tokens,
        output_tokens=message.output_tokens,
        t_acc=message.t_acc,
        generated_pages=_generated(message),
    )
    return req, fetch_runs_from_proto(message.fetch, req.prompt_pages)
