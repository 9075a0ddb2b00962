"""`plan_agents` gives `generate`'s trace agent by agent: the same records, whichever agents are generated, in
whichever order, and (for per-agent kinds) an agent's records do not depend on how many agents the trace has."""

from __future__ import annotations

import pytest

from evolving_infra.workloads import default_params, generate
from evolving_infra.workloads.generate import plan_agents, streamable

KINDS = ["cc", "putnam", "osworld", "mixed", "shift"]


@pytest.mark.parametrize("kind", KINDS)
def test_head_and_agents_are_generates_records(kind: str) -> None:
    plan = plan_agents(kind, 6, 4, default_params(kind))
    assert plan.agents == 6 and streamable(kind)
    backwards = {i: plan.agent(i) for i in reversed(range(6))}
    assert [*plan.head, *(r for i in range(6) for r in backwards[i])] == generate(kind, 6, 4)


@pytest.mark.parametrize("kind", ["cc", "putnam", "osworld"])
def test_an_agent_does_not_depend_on_the_trace_size(kind: str) -> None:
    small, large = plan_agents(kind, 3, 7, default_params(kind)), plan_agents(kind, 40, 7, default_params(kind))
    assert [small.agent(i) for i in range(3)] == [large.agent(i) for i in range(3)]
    assert small.head[1:] == large.head[1:]  # the prefixes; the header names the size


def test_fleet_is_not_streamed_and_bad_agents_are_refused() -> None:
    assert not streamable("fleet")
    with pytest.raises(ValueError, match="generated whole"):
        plan_agents("fleet", 4, 0, default_params("fleet"))
    plan = plan_agents("putnam", 2, 0, default_params("putnam"))
    with pytest.raises(IndexError, match="outside the plan's 2 agents"):
        plan.agent(2)
    with pytest.raises(ValueError, match="agents must be an integer >= 1"):
        plan_agents("putnam", 0, 0, default_params("putnam"))
