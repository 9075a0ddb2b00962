"""Protobuf messages the node agent sends that no `api.convert` function builds: node state, the KV
snapshot a new `StreamEvents` subscriber starts with, and `NodeEvent` bodies (KV, iterations, prefill
starts and ends, hand-backs, switch reports, state with the prefill queue).

Boundary: pure builders from engine values (protobuf stays at the edge of the service).
"""

from __future__ import annotations

from collections.abc import Iterable

from evolving_infra.core.itermodel import IterationRecord
from evolving_infra.core.kv_events import KvCleared, KvEvent, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.api.convert import (
    handed_back_to_proto,
    iteration_to_proto,
    kv_batch_to_proto,
    mode_to_proto,
    prefill_finished_to_proto,
    prefill_started_to_proto,
    switch_report_to_proto,
    switch_state_to_proto,
    tier_gauges_to_proto,
)
from evolving_infra.node_agent.engine import EngineCore, PrefillFinished, PrefillQueue, PrefillStarted, SwitchReport
from evolving_infra.proto.convert import set_prefill_queue
from evolving_infra.proto.v1 import node_agent_pb2 as pb

SNAPSHOT_BATCH = 4096
"""Most KV events per snapshot message."""


def node_state(
    engine: EngineCore, generation: int, time: float, relaunching: bool = False, queue: PrefillQueue | None = None
) -> pb.NodeState:
    """The node's state with its prefill queue (`queue`, default: the engine's now); while `relaunching`, a node
    that serves nothing (no mode)."""
    g = engine.gauges()
    state = pb.NodeState(
        node=engine.node,
        mode=pb.NODE_MODE_UNSPECIFIED if relaunching else mode_to_proto(g.mode),
        switch_state=pb.SWITCH_STATE_RELAUNCHING if relaunching else switch_state_to_proto(g.switch_state),
        generation=generation,
        l1=tier_gauges_to_proto(g.pool.l1),
        l2=tier_gauges_to_proto(g.pool.l2),
        prefill_queued=g.prefill_queued,
        prefill_waiting=g.prefill_waiting,
        prefill_running=g.prefill_running,
        decode_queued=g.decode_queued,
        decode_running=g.decode_running,
        time=time,
        prefill_events=True,
    )
    if queue is None:
        queue = engine.prefill_queue()
    return set_prefill_queue(state, queue.running, queue.queued)


def resident_chains(node: NodeId, tier: Tier, pages: Iterable[PageHash], parent_of: dict[PageHash, PageHash | None] | None, time: float) -> list[KvStored]:
    """`KvStored` events for resident pages, parents first, consecutive links merged into chains."""
    parents = parent_of or {}
    todo = set(pages)
    children: dict[PageHash | None, list[PageHash]] = {}
    for page in todo:
        children.setdefault(parents.get(page), []).append(page)
    roots = [p for p in todo if parents.get(p) not in todo]
    events: list[KvStored] = []
    stack = sorted(roots, reverse=True)
    while stack:
        start = stack.pop()
        chain = [start]
        while True:
            kids = sorted(children.get(chain[-1], []))
            if not kids:
                break
            chain.append(kids[0])
            stack.extend(reversed(kids[1:]))
        events.append(KvStored(node, tier, parents.get(start), tuple(chain), time))
    return events


def kv_snapshot(engine: EngineCore, time: float) -> list[KvEvent]:
    """A clear of every tier, then every resident page of each tier (with its parent)."""
    events: list[KvEvent] = [KvCleared(engine.node, None, time)]
    for tier in (Tier.GPU, Tier.HOST):
        pool = engine.pool.tier(tier)
        resident = engine.resident(tier)
        events.extend(resident_chains(engine.node, tier, resident, {p: pool.parent(p) for p in resident}, time))
    return events


def kv_bodies(events: list[KvEvent] | tuple[KvEvent, ...]) -> list[dict[str, object]]:
    return [{"kv": kv_batch_to_proto(events[i : i + SNAPSHOT_BATCH])} for i in range(0, len(events), SNAPSHOT_BATCH)]


def iteration_body(record: IterationRecord) -> dict[str, object]:
    return {"iteration": iteration_to_proto(record)}


def switch_body(report: SwitchReport, generation: int) -> dict[str, object]:
    return {"switch_completed": switch_report_to_proto(report, generation)}


def state_body(state: pb.NodeState) -> dict[str, object]:
    return {"state": state}


def prefill_started_body(node: NodeId, started: PrefillStarted) -> dict[str, object]:
    return {"prefill_started": prefill_started_to_proto(node, started)}


def prefill_finished_body(node: NodeId, done: PrefillFinished, cached_tokens: int) -> dict[str, object]:
    return {"prefill_finished": prefill_finished_to_proto(node, done, cached_tokens)}


def handed_back_body(node: NodeId, request_ids: list[str], generation: int, time: float) -> dict[str, object]:
    return {"handed_back": handed_back_to_proto(node, request_ids, generation, time)}
