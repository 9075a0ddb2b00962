"""Requests that wait for a decode reservation (SGLang-style, reserved at routing) while the prefill node they
were routed to stops taking prefills: they are routed again, nothing is lost, nothing runs on the stopped node."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from evolving_infra.core.types import Phase
from evolving_infra.node_agent.profiles import load_profile, profile_to_data
from evolving_infra.router.planner import Outcome, PlannerDecision, SwitchMode
from evolving_infra.sim import phases
from evolving_infra.sim.cluster import build_cluster, initial_commands
from evolving_infra.sim.kernel import Kernel
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Trace


def _trace(agents: int, prompt: int, output: int) -> Trace:
    records: list[dict[str, Any]] = [{"kind": "header", "version": 1, "name": "waiting"},
                                     {"kind": "prefix", "name": "sys", "tokens": 1024}]
    for a in range(agents):
        records.append({"kind": "agent", "agent": f"a{a}", "workload": "tiny", "start_s": 0.0})
        for s in range(2):
            records.append({"kind": "request", "id": f"a{a}.r{s}", "agent": f"a{a}", "branch": f"a{a}.b{s}",
                            "after": [] if s == 0 else [f"a{a}.r0"], "delay_s": 0.0 if s == 0 else 0.5,
                            "input": {"shared": "sys", "keep": 1024, "new": prompt}, "output_tokens": output})
    return trace_from_records(records)


def _small_kv_profile(tmp_path: Path) -> Path:
    """The GLM-5.2 profile with room for only a few long requests per node (so reservations must wait)."""
    data = profile_to_data(load_profile("glm-5.2-4xgb300-tp4"))
    data["name"] = "glm-small-kv"
    data["l1_tokens"] = 160_000
    data["l2_tokens"] = 640_000
    out = tmp_path / "small.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def _decision(target: dict[str, Phase], mode: SwitchMode, relaunch_s: float = 0.0) -> PlannerDecision:
    return PlannerDecision(target, mode, Outcome.SWITCH, "test", None, relaunch_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [SwitchMode.RELAUNCH, SwitchMode.IN_PLACE_STRAND_KV])
def test_a_request_waiting_for_a_reservation_is_rerouted_when_its_prefill_node_stops(
    tmp_path: Path, mode: SwitchMode
) -> None:
    trace = _trace(agents=8, prompt=60_000, output=2_000)
    cfg = build_config("dynamo", planner="static", nodes=3, split="2P1D", warmup_s=0.0, agents=8,
                       profile=str(_small_kv_profile(tmp_path)))
    state = build_cluster(cfg, trace)
    kernel = Kernel()
    kernel.apply(initial_commands(state))
    decode = state.nodes["n2"]
    waiting: list[Any] = []
    while not waiting and kernel.peek() is not None and kernel.now < 60.0:
        kernel.step()
        waiting = [r for r in decode.prealloc if r.prefill_node is not None]
    assert waiting, "a routed request should wait for a decode reservation"
    stopped = waiting[0].prefill_node
    other = "n0" if stopped == "n1" else "n1"
    target = {other: Phase.PREFILL, stopped: Phase.DECODE, "n2": Phase.DECODE}
    moved = {r.id for r in waiting if r.prefill_node == stopped}
    relaunch_s = 30.0 if mode is SwitchMode.RELAUNCH else 0.0
    kernel.apply(phases.apply_decision(state, _decision(target, mode, relaunch_s), kernel.now))
    while kernel.peek() is not None:
        kernel.run()
    assert Counter(r.request_id for r in state.records) == Counter(r.id for r in trace.requests)
    late = [r.request_id for r in state.records if r.request_id in moved and r.prefill_node == stopped]
    assert not late, f"requests waiting for a reservation were still prefilled on {stopped}: {late}"
    assert state.stats.rerouted >= len(moved)
