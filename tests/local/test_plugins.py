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
EVICTION_PLUGIN = str(Path(__file__).resolve().parent.parent / "plugins" / "mru_eviction.py")
EVICTION_NAME = "test-mru"


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


def test_a_plugin_eviction_order_runs_in_the_simulator_and_is_asked_page_by_page() -> None:
    trace = PRESETS[PresetName.TINY].trace(0)
    config = build_config("evolving", nodes=4, split="2P2D", warmup_s=0.0, models="profile", collocated_warmup=False,
                          agents=4, eviction=EVICTION_NAME, plugins=[EVICTION_PLUGIN])  # fmt: skip
    result = simulate(config, trace, keep_state=True)
    assert len(result.records) == len(trace.requests)
    assert result.state is not None
    engines = [n.engine for n in result.state.nodes.values() if n.engine is not None]
    assert engines and all(type(e.pool.l2.policy).__name__ == "MruEviction" for e in engines)
    # An engine's pool orders host pages by the plugin's key (asked page by page): most recently used first,
    # which no built-in order does. The pool checks its order against the policy's own on every eviction.
    from evolving_infra.core.pages import chain_hashes
    from evolving_infra.core.types import NodeId, Tier
    from evolving_infra.node_agent.engine import KvPool

    pool = KvPool(NodeId("n"), 8, 4, type(engines[0].pool.l2.policy)(), check=True)
    pages = chain_hashes(f"p{i}".encode() for i in range(4))
    for i, t in enumerate((1.0, 2.0, 3.0, 4.0)):
        assert pool.make_room(Tier.HOST, 1, t)
        pool.tier(Tier.HOST).reserve(f"r{i}", 1)
        pool.store(Tier.HOST, pages[i], pages[i - 1] if i else None, t, owner=f"r{i}")
        pool.release(f"r{i}", t)
    assert pool.evict(Tier.HOST, 2, 5.0) == [pages[3], pages[2]]


def test_a_plugin_eviction_order_is_accepted_by_the_node_agents_and_the_router_and_unknown_ones_refused() -> None:
    from evolving_infra.core.eviction import eviction_policy, uses_branch_counts
    from evolving_infra.core.plugins import load_plugins
    from evolving_infra.node_agent.service.settings import NodeAgentSettings
    from evolving_infra.router.service.settings import RouterSettings

    settings = NodeAgentSettings(node="n0", eviction=EVICTION_NAME, plugins=[EVICTION_PLUGIN])
    assert type(eviction_policy(settings.eviction)).__name__ == "MruEviction"  # what the node agent builds
    assert not uses_branch_counts(EVICTION_NAME) and uses_branch_counts("branch-count")  # no count pushes to it
    router = RouterSettings(nodes={"n0": "127.0.0.1:1"}, eviction=EVICTION_NAME, plugins=[EVICTION_PLUGIN])
    assert router.eviction == EVICTION_NAME
    load_plugins([EVICTION_PLUGIN])
    with pytest.raises(ValidationError, match="eviction: unknown eviction policy 'test-nowhere'"):
        NodeAgentSettings(node="n0", eviction="test-nowhere")
    with pytest.raises(ValidationError, match="eviction: unknown eviction policy 'test-nowhere'"):
        build_config("evolving", eviction="test-nowhere")
    with pytest.raises(PolicyError, match="eviction: unknown eviction policy 'test-nowhere'"):
        check_policies(ClusterSpec(eviction="test-nowhere"))


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
    # The node agents load the plugins too (they would refuse to start with an eviction order they cannot find).
    spec = ClusterSpec(nodes=3, prefill=2, speed_up=10.0, planner="static", routing=NAME,
                       plugins=(PLUGIN, EVICTION_PLUGIN), routing_settings={"skip": 1}, eviction=EVICTION_NAME)  # fmt: skip
    check_policies(spec)
    config = LocalRunConfig(cluster=spec, mode=ReplayMode.closed_loop(4), client=ClientSettings(speed_up=10.0),
                            workdir=tmp_path / "work")  # fmt: skip
    result = run_local(config, trace)
    records = result.replay.records
    assert len(records) == len(trace.requests) and result.replay.progress.failed == 0
    assert {r.prefill_node for r in records} == {"n1"}  # the plugin, with its settings, chose every prefill node
