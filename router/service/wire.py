"""The node agent API's messages as the router reads and writes them (protobuf stays at this edge).

Conversions of core values (phases, KV events, iteration reports, counts) are shared with the node agent in
`evolving_infra.proto.convert`; the router's own are here: state snapshots in, prefill and decode submissions
out.

Boundary: pure functions over `evolving_infra.proto.v1` messages and the core's values.
"""

from __future__ import annotations

from collections.abc import Mapping

from evolving_infra.core.types import NodeId
from evolving_infra.proto.convert import fetch_run_to_proto
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.core import FetchRun, PoolSnapshot, RoutedRequest


def pool_from(state: pb.NodeState, page_tokens: int) -> PoolSnapshot:
    return PoolSnapshot(page_tokens, state.l1.free, state.l1.cached, state.l1.pinned, state.l2.cached, state.l2.pinned)


def prefill_to(
    req: RoutedRequest, wire_id: str, fetch: tuple[FetchRun, ...], addresses: Mapping[NodeId, str],
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
        fetch=[fetch_run_to_proto(run, addresses.get(run.peer, "")) for run in fetch],
        trace=trace,
    )


def decode_to(
    req: RoutedRequest, wire_id: str, source: NodeId, source_address: str, trace: pb.TraceContext
) -> pb.SubmitDecodeRequest:
    """The decode of `req` under `wire_id`, pulling its prompt KV from its prefill node `source`."""
    r = req.route
    fetch = []
    if req.prompt_pages:  # the whole prompt, from the prefill node
        whole = FetchRun(0, len(req.prompt_pages), frozenset((source,)), tuple(req.prompt_pages))
        fetch = [fetch_run_to_proto(whole, source_address)]
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
