"""Policies as plugins: a prefill routing policy declared in a test module (tests/plugins/lowest_id_policy.py,
which no other file names) runs in the simulator and in the local cluster's router process; unknown policies
and settings are refused with the field named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from evolving_infra.core.plugins import PolicyError
from evolving_infra.local.agents import ClientSettings
from evolving_infra.local.cluster import ClusterSpec, check_policies
from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.local.run import LocalRunConfig, run_local
from evolving_infra.sim.replay import ReplayMode
from evolving_infra.sim.run import simulate
from evolving_infra.sim.systems import build_config

PLUGIN = str(Path(__file__).resolve().parent.parent / "plugins" / "lowest_id_policy.py")
NAME = "test-lowest-id"


def test_a_plugin_policy_runs_in_the_simulator() -> None:
    trace = PRESETS[PresetName.TINY].trace(0)
    settings: dict[str, Any] = {"nodes": 4, "split": "2P2D", "warmup_s": 0.0, "models": "profile",
                                "collocated_warmup": False, "agents": 4}  # fmt: skip
    result = simulate(build_config("evolving", prefill_routing=NAME, plugins=[PLUGIN], **settings), trace, keep_state=True)
    assert len(result.records) == len(trace.requests)
    assert {r.prefill_node for r in result.records} == {"n0"}  # the lowest prefill node, every time
    assert result.state is not None and result.state.router.routed == len(trace.requests)
    skip = simulate(build_config("evolving", prefill_routing=NAME, routing_settings={"skip": 1}, plugins=[PLUGIN],
                                 **settings), trace)  # fmt: skip
    assert {r.prefill_node for r in skip.records} == {"n1"}  # its settings reach it


def test_unknown_policies_and_bad_plugin_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="unknown prefill routing policy 'test-nowhere'"):
        build_config("evolving", prefill_routing="test-nowhere")
    with pytest.raises(ValidationError, match=r"routing_settings.*skip must be >= 0"):
        build_config("evolving", prefill_routing=NAME, routing_settings={"skip": -1}, plugins=[PLUGIN])
    with pytest.raises(ValidationError, match="plugins: .*is not a file"):
        build_config("evolving", plugins=["/nonexistent/policy.py"])
    with pytest.raises(PolicyError, match="unknown planner policy 'magic'"):
        check_policies(ClusterSpec(planner="magic"))


def test_a_plugin_policy_runs_in_the_local_clusters_router(tmp_path: Path) -> None:
    preset = PRESETS[PresetName.TINY]
    trace = preset.trace(0)
    spec = ClusterSpec(nodes=3, prefill=2, speed_up=10.0, planner="static", routing=NAME, plugins=(PLUGIN,),
                       routing_settings={"skip": 1})  # fmt: skip
    check_policies(spec)
    config = LocalRunConfig(cluster=spec, mode=ReplayMode.closed_loop(4), client=ClientSettings(speed_up=10.0),
                            workdir=tmp_path / "work")  # fmt: skip
    result = run_local(config, trace)
    records = result.replay.records
    assert len(records) == len(trace.requests) and result.replay.progress.failed == 0
    assert {r.prefill_node for r in records} == {"n1"}  # the plugin, with its settings, chose every prefill node
