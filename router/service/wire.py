"""The node agent API's messages as the router reads and writes them (protobuf stays at this edge).

The node agent has its own conversions (`node_agent.api.convert`); the layering keeps the router from
importing the node agent, so the few the router needs are here: KV events, iteration reports and state
snapshots in; prefill and decode submissions and count updates out. Reading validates what the wire cannot
and raises ValueError naming the field.

Boundary: pure functions over `evolving_infra.proto.v1` messages and the core's values.
"""

from __future__ import annotations

from collections.abc import Mapping

from evolving_infra.core.itermodel import IterationRecord, PrefillItem
from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, NodeMode, Phase, Tier
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.core import FetchPlanRun, PoolSnapshot, RoutedRequest

PHASE_TO = {Phase.PREFILL: pb.PHASE_PREFILL, Phase.DECODE: pb.PHASE_DECODE}
_PHASE_FROM = {v: k for k, v in PHASE_TO.items()}
_MODE_FROM = {
    pb.NODE_MODE_PREFILL: NodeMode.PREFILL,
    pb.NODE_MODE_DECODE: NodeMode.DECODE,
    pb.NODE_MODE_COLLOCATED: NodeMode.COLLOCATED,
}
_TIER_FROM = {pb.TIER_GPU: Tier.GPU, pb.TIER_HOST: Tier.HOST}


def _pick(table: Mapping[int, object], value: int, field: str) -> object:
    if value not in table:
        raise ValueError(f"{field}: value {value} is not allowed here (allowed: {sorted(table)})")
    return table[value]


def phase_from(value: int, field: str = "phase") -> Phase:
    return _pick(_PHASE_FROM, value, field)  # type: ignore[return-value]


def mode_from(value: int, field: str = "mode") -> NodeMode:
    return _pick(_MODE_FROM, value, field)  # type: ignore[return-value]


def kv_events_from(batch: pb.KvEventBatch) -> tuple[KvEvent, ...]:
    out: list[KvEvent] = []
    for message in batch.events:
        kind = message.WhichOneof("event")
        if kind == "stored":
            s = message.stored
            parent = PageHash(s.parent) if s.HasField("parent") else None
            tier = _pick(_TIER_FROM, s.tier, "KvStored.tier")
            out.append(KvStored(NodeId(s.node), tier, parent, tuple(PageHash(p) for p in s.pages), s.time))  # type: ignore[arg-type]
        elif kind == "removed":
            r = message.removed
            tier = _pick(_TIER_FROM, r.tier, "KvRemoved.tier")
            out.append(KvRemoved(NodeId(r.node), tier, tuple(PageHash(p) for p in r.pages), r.time))  # type: ignore[arg-type]
        elif kind == "cleared":
            c = message.cleared
            tier = None if c.tier == pb.TIER_UNSPECIFIED else _pick(_TIER_FROM, c.tier, "KvCleared.tier")
            out.append(KvCleared(NodeId(c.node), tier, c.time))  # type: ignore[arg-type]
        else:
            raise ValueError("KvEvent: none of stored, removed, cleared is set")
    return tuple(out)


def iteration_from(message: pb.IterationReport) -> IterationRecord:
    return IterationRecord(
        node=NodeId(message.node),
        phase=phase_from(message.phase, "IterationReport.phase"),
        start=message.start,
        duration=message.duration,
        prefill=tuple(PrefillItem(t_uc=i.t_uc, t_c=i.t_c, t_rst=i.t_rst) for i in message.prefill),
        decode_batch=message.decode_batch,
    )


def pool_from(state: pb.NodeState, page_tokens: int) -> PoolSnapshot:
    return PoolSnapshot(page_tokens, state.l1.free, state.l1.cached, state.l1.pinned, state.l2.cached, state.l2.pinned)


def prefill_to(
    req: RoutedRequest, wire_id: str, fetch: tuple[FetchPlanRun, ...], addresses: Mapping[NodeId, str],
    trace: pb.TraceContext,
) -> pb.SubmitPrefillRequest:
    """The prefill of `req` under `wire_id` (one id per attempt, so a node never sees an id twice)."""
    r = req.route
    return pb.SubmitPrefillRequest(
        request_id=wire_id,
        branch_id=r.branch,
        prompt_pages=list(req.prompt_pages),
        prompt_tokens=r.prompt_tokens,
        output_tokens=0,
        t_acc=r.t_acc,
        fetch=[pb.FetchRun(peer=run.peer, pages=list(run.pages), peer_address=addresses.get(run.peer, "")) for run in fetch],
        trace=trace,
    )


def decode_to(
    req: RoutedRequest, wire_id: str, source: NodeId, source_address: str, trace: pb.TraceContext
) -> pb.SubmitDecodeRequest:
    """The decode of `req` under `wire_id`, pulling its prompt KV from its prefill node `source`."""
    r = req.route
    fetch = []
    if req.prompt_pages:
        fetch = [pb.FetchRun(peer=source, pages=list(req.prompt_pages), peer_address=source_address)]
    return pb.SubmitDecodeRequest(
        request_id=wire_id,
        branch_id=r.branch,
        prompt_pages=list(req.prompt_pages),
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.output_tokens,
        t_acc=r.t_acc,
        fetch=fetch,
        trace=trace,
    )


def counts_to(counts: Mapping[PageHash, int], sequence: int) -> pb.CountUpdate:
    return pb.CountUpdate(sequence=sequence, pages=list(counts), counts=list(counts.values()))
