"""The end of the collocated warmup on a small simulated cluster (router/core/control.py `WarmupExit`): with the
staged exit no prefill waits on a node that is still draining its local decodes; ordering every node at once
(the earlier behaviour) makes prefills wait there, which is what the staged exit removes."""

from __future__ import annotations

import dataclasses

import pytest

from evolving_infra.router.core.control import RecordKind, WarmupExit
from evolving_infra.sim.cluster import build_cluster, initial_commands
from evolving_infra.sim.kernel import Kernel
from evolving_infra.sim.records import RequestRecord
from evolving_infra.sim.state import ClusterState
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.workloads import generate

WARMUP, SCORED = 120.0, 60.0


def _run(exit: WarmupExit) -> ClusterState:
    """Putnam (long outputs: a collocated node holds many local decodes at the warmup's end) on 1P2D."""
    cfg = build_config("evolving", nodes=3, split="1P2D", agents=24, warmup_s=WARMUP, duration_s=SCORED, seed=0)
    state = build_cluster(cfg, trace_from_records(generate("putnam", 72, 0), source="putnam"))
    state.control.settings = dataclasses.replace(state.control.settings, warmup_exit=exit)
    kernel = Kernel()
    kernel.apply(initial_commands(state))
    kernel.run(until=WARMUP + SCORED)
    return state


def _waited_on_draining(state: ClusterState) -> list[RequestRecord]:
    """Requests whose prefill waited on a node between its order to prefill and that switch's completion (the
    node was draining its decodes then)."""
    ordered: dict[str, float] = {}
    completed: dict[str, float] = {}
    for r in state.control.log:
        if r.kind is RecordKind.SWITCH_ORDERED and r.detail.startswith("prefill") and r.node is not None:
            ordered.setdefault(r.node, r.at)
        elif r.kind is RecordKind.SWITCH_COMPLETED and r.detail == "prefill" and r.node in ordered:
            completed.setdefault(r.node, r.at)
    assert ordered and set(completed) == set(ordered)  # the prefill side did move and serve
    return [rec for rec in state.records if rec.prefill_node in completed
            and rec.queued < completed[rec.prefill_node] and rec.prefill_start > ordered[rec.prefill_node]]


@pytest.fixture(scope="module")
def runs() -> dict[WarmupExit, ClusterState]:
    return {exit: _run(exit) for exit in WarmupExit}


def test_after_the_warmup_no_prefill_waits_on_a_node_draining_decodes(runs: dict[WarmupExit, ClusterState]) -> None:
    state = runs[WarmupExit.STAGED]
    assert _waited_on_draining(state) == []
    after = [r for r in state.records if r.issued >= WARMUP]
    assert len(after) > 20 and all(r.prefill_start >= r.queued for r in after)
    # every node ends where the initial split puts it, and the window serves requests
    assert {n: t.phase for n, t in state.core.nodes.items()} == dict(state.control.settings.initial)


def test_ordering_every_node_at_once_makes_prefills_wait_behind_decodes(runs: dict[WarmupExit, ClusterState]) -> None:
    staged, at_once = runs[WarmupExit.STAGED], runs[WarmupExit.AT_ONCE]
    assert len(_waited_on_draining(at_once)) > 0

    def early_ttft(state: ClusterState) -> float:
        early = [r for r in state.records if WARMUP <= r.issued < WARMUP + 30]
        return sum(r.first_token - r.issued for r in early) / len(early)

    assert early_ttft(staged) < early_ttft(at_once)
