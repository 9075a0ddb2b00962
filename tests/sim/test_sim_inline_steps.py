"""A node's next step run within its iteration's end event (`Kernel.run_inline`, `sim.stepping`) against every
step through the queue (`ClusterState.inline_steps = False`): the same simulation, byte for byte, and the same
kernel counts, on a closed-loop agent workload with a collocated warmup (switches, local decodes) and on the
open-loop Mooncake trace (decode batches of one or two, where most steps run inline)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from evolving_infra.cli.bench_sim import MOONCAKE, PEER_PROFILE
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.export import request_row
from evolving_infra.sim.run import simulate, workload_trace
from evolving_infra.sim.state import ClusterState
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.mooncake import convert_mooncake, read_mooncake


def _queued(state: ClusterState) -> None:
    state.inline_steps = False


def _both(cfg: SimConfig, trace: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    runs = []
    inlined = []
    for prepare in (_queued, None):
        result = simulate(cfg, trace, keep_state=True, prepare=prepare)
        assert result.state is not None
        kernel = result.state.kernel
        inlined.append(0 if kernel is None else kernel.inlined)
        runs.append((json.dumps(result.metrics.to_dict(), sort_keys=True), [request_row(r) for r in result.records],
                     result.events))  # fmt: skip
    assert inlined[0] == 0
    return runs[0], runs[1], inlined[1]


def test_inline_steps_give_the_same_closed_loop_run() -> None:
    cfg = build_config("evolving", nodes=3, split="1P2D", agents=6, warmup_s=60.0, duration_s=180.0, seed=3)
    queued, inline, inlined = _both(cfg, workload_trace("cc", 6, 3))
    assert len(queued[1]) > 20
    assert inlined > 100
    assert inline == queued


def test_inline_steps_give_the_same_open_loop_run() -> None:
    if not MOONCAKE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{MOONCAKE} is missing (CI always has shared/ beside the clone)")
        pytest.skip(f"{MOONCAKE} is not available")
    records, _ = convert_mooncake(read_mooncake(MOONCAKE)[:60], name="mooncake", source=str(MOONCAKE))
    cfg = build_config("evolving", profile=PEER_PROFILE, nodes=5, split="2P3D", seed=0, warmup_s=0.0,
                       models="profile", collocated_warmup=False, agents=None, exact_models=True)  # fmt: skip
    queued, inline, inlined = _both(cfg, trace_from_records(records))
    assert len(queued[1]) == 60
    assert inlined > queued[2] // 4, "most decode steps of batches of one or two should run inline"
    assert inline == queued
