"""A streamed plan replays as the whole plan does, loading each agent when it starts and dropping it when it
finishes; a simulation over a workload generated agent by agent equals the one over the whole trace."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.sim.replay import AgentFinished, AgentReplayer, AgentStarted, ReplayError, ReplayMode, StreamedPlan
from evolving_infra.sim.replay_loop import run_replay
from evolving_infra.sim.replay_plan import ReplayPlan
from evolving_infra.sim.run import simulate, workload_stream, workload_trace
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.growing import GrowingTrace
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.testing import TraceShape, trace_records
from tests.traces.agent_blocks import agent_blocks, flatten, growing

SERVICE = [0.0, 0.5, 1.0, 2.5]


@settings(max_examples=60)
@given(records=trace_records(TraceShape(max_agents=5, max_steps=8)), concurrency=st.integers(1, 3),
       service=st.lists(st.sampled_from(SERVICE), min_size=8, max_size=8), stop=st.sampled_from([None, 2.0, 6.0]),
       late=st.sampled_from([None, None, 0.0, 1.5]))
def test_streamed_replay_emits_the_whole_plans_effects(records: list[dict[str, Any]], concurrency: int,
                                                       service: list[float], stop: float | None,
                                                       late: float | None) -> None:  # fmt: skip
    head, blocks = agent_blocks(records)
    whole = trace_from_records(flatten(head, blocks))
    mode = ReplayMode.closed_loop(concurrency, skip_late_s=late)

    def cost(spec: Any) -> float:
        return service[spec.index % len(service)]

    reference = AgentReplayer(whole, mode)
    expected = run_replay(reference, cost, until=stop)
    trace = growing(head, blocks)
    released: list[int] = []
    trace.on_release(lambda a: released.append(a.index))
    replayer = AgentReplayer(StreamedPlan(trace), mode)
    got = run_replay(replayer, cost, until=stop)
    assert got.effects == expected.effects and got.completed == expected.completed
    started = sum(isinstance(e, AgentStarted) for e in got.effects)
    assert replayer.skipped_agents == reference.skipped_agents
    assert late is not None or replayer.skipped_agents == 0
    assert trace.loaded_agents == started + replayer.skipped_agents, "an agent is generated when it starts or is skipped"
    index = {b[0]["agent"]: i for i, b in enumerate(blocks)}
    finished = {index[e.agent] for e in got.effects if isinstance(e, AgentFinished)}
    assert [i for i in released if i in finished] == [index[e.agent] for e in got.effects if isinstance(e, AgentFinished)]
    assert len(released) == len(finished) + replayer.skipped_agents, "a skipped agent is released at once"
    if stop is None:
        assert replayer.done and sorted(released) == list(range(len(blocks)))
        assert not replayer._specs and not replayer._runs, "finished agents are dropped"


def test_a_streamed_plan_refuses_open_loop_and_names_unknown_requests() -> None:
    head, blocks = agent_blocks(workload_records())
    with pytest.raises(ValueError, match="closed loop only"):
        AgentReplayer(StreamedPlan(growing(head, blocks)), ReplayMode.open_loop())
    replayer = AgentReplayer(StreamedPlan(growing(head, blocks)), ReplayMode.closed_loop(1))
    replayer.start(0.0)
    with pytest.raises(ReplayError, match="no such request"):
        replayer.completed("a1.r1", 1.0)  # agent a1 has not started


def test_streamed_agent_specs_equal_the_whole_plans() -> None:
    head, blocks = agent_blocks(workload_records())
    whole = ReplayPlan.from_trace(trace_from_records(flatten(head, blocks)))
    streamed = StreamedPlan(growing(head, blocks))
    assert streamed.agent_count == whole.agent_count
    assert [streamed.agent(i) for i in range(whole.agent_count)] == list(whole.agents)


def workload_records() -> list[dict[str, Any]]:
    from evolving_infra.workloads import generate

    return generate("putnam", 3, seed=2)


@pytest.mark.parametrize(("kind", "system"), [("cc", "evolving"), ("putnam", "arrow")])
def test_a_simulation_over_a_streamed_workload_equals_the_whole_traces(kind: str, system: str) -> None:
    cfg = build_config(system, agents=4, nodes=4, split="2P2D", seed=1, warmup_s=0, duration_s=60, models="profile")
    stream = workload_stream(kind, 8, 1)
    assert isinstance(stream, GrowingTrace)
    whole = simulate(cfg, workload_trace(kind, 8, 1))
    lazy = simulate(cfg, stream, keep_state=True)
    assert lazy.records == whole.records and lazy.metrics.to_dict() == whole.metrics.to_dict()
    assert lazy.stats == whole.stats
    assert stream.loaded_agents < stream.agent_count, "agents never started were never generated"
    assert lazy.state is not None
    assert lazy.state.content.hashed_requests <= len(stream.requests)


def test_an_open_loop_simulation_loads_a_streamed_workload_whole() -> None:
    cfg = build_config("evolving", agents=None, max_active=3, nodes=4, split="2P2D", seed=2, warmup_s=0,
                       duration_s=40, models="profile")  # fmt: skip
    stream = workload_stream("putnam", 5, 2)
    assert isinstance(stream, GrowingTrace)
    lazy = simulate(cfg, stream)
    assert stream.loaded_agents == 5, "open loop needs every agent's start time"
    whole = simulate(cfg, workload_trace("putnam", 5, 2))
    assert lazy.records == whole.records and lazy.metrics.to_dict() == whole.metrics.to_dict()


def test_a_growing_trace_serves_one_simulation() -> None:
    cfg = build_config("arrow", agents=2, nodes=2, split="1P1D", seed=0, warmup_s=0, duration_s=5, models="profile")
    stream = workload_stream("putnam", 4, 0)
    simulate(cfg, stream)
    with pytest.raises(ValueError, match="already serves a simulation"):
        simulate(cfg, stream)
