"""A node's next step run within its iteration's end event (`Kernel.run_inline`, `sim.stepping`), and a decode node's
quiet iterations run as one event (`sim.quiet`), against every step through the queue (`ClusterState.inline_steps =
False`, which turns both off): the same simulation, byte for byte, and the same kernel counts, on a closed-loop agent
workload with a collocated warmup (switches, local decodes, iteration-time noise, a model fitter during warmup) and
on the open-loop Mooncake trace (decode batches of one or two, where most steps run inline and most decode
iterations are quiet). Each run also takes quiet runs, and has some of them cut short (settled) by a request
reaching the node."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest

from evolving_infra.cli.bench_sim import MOONCAKE, PEER_PROFILE
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.export import request_row
from evolving_infra.sim.run import simulate, workload_trace
from evolving_infra.node_agent.engine import StepOutput
from evolving_infra.sim import quiet
from evolving_infra.sim.kernel import Command, Event
from evolving_infra.sim.state import ClusterState, SimNode
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.mooncake import convert_mooncake, read_mooncake


def _queued(state: ClusterState) -> None:
    state.inline_steps = False


def _both(cfg: SimConfig, trace: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    taken: Counter[str] = Counter()
    begin, settle = quiet.begin, quiet.settle

    def counted_begin(state: ClusterState, node: SimNode, out: StepOutput) -> Event | None:
        run = begin(state, node, out)
        taken["runs"] += run is not None
        return run

    def counted_settle(state: ClusterState, node: SimNode, now: float, *, last: bool = False) -> list[Command]:
        taken["settled"] += node.quiet is not None and not last
        return settle(state, node, now, last=last)

    monkeypatch.setattr(quiet, "begin", counted_begin)
    monkeypatch.setattr(quiet, "settle", counted_settle)
    runs = []
    inlined = []
    for prepare in (_queued, None):
        taken.clear()
        result = simulate(cfg, trace, keep_state=True, prepare=prepare)
        assert result.state is not None
        kernel = result.state.kernel
        inlined.append(0 if kernel is None else kernel.inlined)
        runs.append((json.dumps(result.metrics.to_dict(), sort_keys=True), [request_row(r) for r in result.records],
                     result.events))  # fmt: skip
    assert inlined[0] == 0
    assert taken["runs"] > 10 and taken["settled"] > 0, taken  # (of the second run)
    return runs[0], runs[1], inlined[1]


def test_inline_steps_give_the_same_closed_loop_run(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = build_config("evolving", nodes=3, split="1P2D", agents=6, warmup_s=60.0, duration_s=180.0, seed=3)
    queued, inline, inlined = _both(cfg, workload_trace("cc", 6, 3), monkeypatch)
    assert len(queued[1]) > 20
    assert inlined > 100
    assert inline == queued


def test_inline_steps_give_the_same_open_loop_run(monkeypatch: pytest.MonkeyPatch) -> None:
    if not MOONCAKE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{MOONCAKE} is missing (CI always has shared/ beside the clone)")
        pytest.skip(f"{MOONCAKE} is not available")
    records, _ = convert_mooncake(read_mooncake(MOONCAKE)[:60], name="mooncake", source=str(MOONCAKE))
    cfg = build_config("evolving", profile=PEER_PROFILE, nodes=5, split="2P3D", seed=0, warmup_s=0.0,
                       models="profile", collocated_warmup=False, agents=None, exact_models=True)  # fmt: skip
    queued, inline, inlined = _both(cfg, trace_from_records(records), monkeypatch)
    assert len(queued[1]) == 60
    assert inlined > queued[2] // 4, "most decode steps of batches of one or two should run inline"
    assert inline == queued
