"""Pure parts of the local cluster driver: prompt token ids share exactly the trace's prefixes, split parsing,
settings the cluster writes, switch detection from node metrics, and a child that fails to start."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings

from evolving_infra.core.pages import token_page_hashes
from evolving_infra.local.cluster import ClusterSpec, LocalCluster, parse_split
from evolving_infra.local.monitor import ClusterMonitor, parse_metrics
from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.local.processes import Child, StartError, stop_all
from evolving_infra.local.prompts import PromptBuilder
from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.records import Trace
from evolving_infra.traces.testing import traces


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@settings(max_examples=40)
@given(traces())
def test_prompt_ids_share_exactly_the_pages_the_content_model_shares(trace: Trace) -> None:
    builder = PromptBuilder(trace)
    model = ContentModel(trace, page_tokens=16)
    ids = {r.id: builder.token_ids(r.id) for r in trace.requests}
    for r in trace.requests:
        assert len(ids[r.id]) == r.prompt_tokens
        assert all(0 <= t < 2**31 for t in ids[r.id])
    reqs = trace.requests[:12]
    for a in reqs:
        for b in reqs:
            from_ids = _common(token_page_hashes(ids[a.id], 16), token_page_hashes(ids[b.id], 16))
            expected = _common([int(h) for h in model.prompt_pages(a.id)], [int(h) for h in model.prompt_pages(b.id)])
            assert from_ids == expected, (a.id, b.id)


def test_prompt_ids_are_deterministic_and_keep_is_a_prefix_of_the_base_context() -> None:
    trace = PRESETS[PresetName.TINY].trace(0)
    one, two = PromptBuilder(trace), PromptBuilder(trace)
    for r in trace.requests:
        assert one.token_ids(r.id) == two.token_ids(r.id)
        if r.base is not None:
            base = trace.request(r.base)
            n = min(r.keep, base.prompt_tokens)
            assert n > 0 and one.token_ids(r.id)[:n] == one.token_ids(base.id)[:n]


def test_parse_split() -> None:
    assert parse_split("2P2D") == (2, 2)
    assert parse_split(" 1p3d ", 4) == (1, 3)
    for bad in ("2P", "P2D", "0P4D", "2P0D", "2x2", "2P2D1"):
        with pytest.raises(ValueError, match="split"):
            parse_split(bad)
    with pytest.raises(ValueError, match="--nodes is 5"):
        parse_split("2P2D", 5)


def test_cluster_spec_bounds_and_router_clock_scaling(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2 nodes"):
        ClusterSpec(nodes=1, prefill=1)
    with pytest.raises(ValueError, match="prefill nodes"):
        ClusterSpec(nodes=3, prefill=3)
    spec = ClusterSpec(nodes=3, prefill=1, speed_up=4.0, window_s=40.0, cooldown_s=20.0, slices=4)
    cluster = LocalCluster(spec, tmp_path)
    cluster.node_addresses = {"n0": "127.0.0.1:1", "n1": "127.0.0.1:2", "n2": "127.0.0.1:3"}
    router = cluster.router_settings()
    assert router["window_s"] == 10.0 and router["planner_settings"]["cooldown_s"] == 5.0 and router["slices"] == 4
    assert [cluster.node_settings(i)["mode"] for i in range(3)] == ["prefill", "decode", "decode"]
    assert all(cluster.node_settings(i)["grpc_port"] == 0 and cluster.node_settings(i)["speed_up"] == 4.0 for i in range(3))
    # the engines' noise: the node agents' default unless given; the debugging switch reaches every node
    from evolving_infra.node_agent.service.settings import NodeAgentSettings

    defaults = NodeAgentSettings(**cluster.node_settings(0))
    assert "noise" not in cluster.node_settings(0) and defaults.noise == 0.05 and not defaults.exact_models
    exact = LocalCluster(ClusterSpec(nodes=3, prefill=1, exact_models=True), tmp_path)
    assert all(NodeAgentSettings(**exact.node_settings(i)).exact_models for i in range(3))
    noisy = LocalCluster(ClusterSpec(nodes=3, prefill=1, noise=0.1), tmp_path)
    assert NodeAgentSettings(**noisy.node_settings(2)).noise == 0.1


def test_local_refuses_exact_models_with_noise(tmp_path: Path) -> None:
    from evolving_infra.cli.main import main

    assert main(["local", "--preset", "tiny", "--exact-models", "--noise", "0.1", "--out", str(tmp_path)]) == 2


_NODE_METRICS = """# TYPE evolving_node_phase_switches_total counter
evolving_node_phase_switches_total{{source="prefill",target="decode"}} {n}
# TYPE evolving_node_phase_switch_duration_seconds histogram
evolving_node_phase_switch_duration_seconds_bucket{{le="+Inf"}} {n}
evolving_node_phase_switch_duration_seconds_count {n}
evolving_node_phase_switch_duration_seconds_sum {total}
# TYPE evolving_node_phase_switch_drain_seconds histogram
evolving_node_phase_switch_drain_seconds_bucket{{le="+Inf"}} {n}
evolving_node_phase_switch_drain_seconds_count {n}
evolving_node_phase_switch_drain_seconds_sum {drain}
"""


def test_monitor_turns_metric_deltas_into_switches_and_splits() -> None:
    monitor = ClusterMonitor("", {"n0": ""}, (2, 2))
    monitor._node("n0", parse_metrics(_NODE_METRICS.format(n=0, total=0, drain=0)), 1.0)
    assert monitor.switches == []
    monitor._node("n0", parse_metrics(_NODE_METRICS.format(n=1, total=0.5, drain=0.4)), 9.0)
    (switch,) = monitor.switches
    assert switch.record.node == "n0" and switch.record.from_phase.value == "prefill"
    assert switch.duration_s == pytest.approx(0.5) and switch.after_drain_s == pytest.approx(0.1)
    assert switch.record.completed == 9.0 and switch.record.decided == pytest.approx(8.5)
    router = '# TYPE evolving_router_split_nodes gauge\nevolving_router_split_nodes{phase="prefill"} 1\n' \
             'evolving_router_split_nodes{phase="decode"} 3\n'
    monitor._router(parse_metrics(router), 9.0)
    monitor._router(parse_metrics(router), 10.0)
    assert [s.label for s in monitor.splits] == ["2P2D", "1P3D"] and monitor.splits[1].at == 9.0


def test_a_child_that_exits_at_once_is_named_with_its_stderr(tmp_path: Path) -> None:
    child = Child("broken", (sys.executable, "-c", "import sys; sys.stderr.write('boom: bad setting\\n'); sys.exit(3)"),
                  tmp_path)
    child.start()
    with pytest.raises(StartError, match=r"(?s)broken: exited with status 3.*boom: bad setting") as info:
        child.wait_ready(time.monotonic() + 30)
    assert info.value.name == "broken"
    stop_all([child], 1.0)


def test_a_silent_child_hits_the_deadline_and_is_stopped(tmp_path: Path) -> None:
    child = Child("silent", (sys.executable, "-c", "import time; time.sleep(60)"), tmp_path)
    child.start()
    with pytest.raises(StartError, match="did not report ready"):
        child.wait_ready(time.monotonic() + 0.5)
    codes = stop_all([child], 5.0)
    assert codes["silent"] is not None and not child.alive()
