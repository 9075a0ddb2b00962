"""The fleet workload's plan (`workloads.fleet.fleet_plan`): each region's schedule, and the tasks met part-way through."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.workloads.fleet import FleetParams, Region, fleet_plan


@settings(max_examples=30, deadline=None)
@given(start=st.floats(0, 1), end=st.floats(0, 1), agents=st.integers(1, 3000))
def test_fleet_plan_follows_each_regions_schedule(start: float, end: float, agents: int) -> None:
    params = FleetParams(regions=(Region("a", 1, start, end), Region("b", 1, 0.5, 0.5)), span_s=3600.0, slices=4,
                         task_estimate_s={"cc": 900.0, "codex": 900.0}, tail=0.25)
    slots = fleet_plan(params, agents, seed=1)
    assert [s.index for s in slots] == list(range(agents))
    assert fleet_plan(params, agents, seed=1) == slots
    width = params.span_s / params.slices
    for i in range(params.slices):  # each slice's block follows the region's share (whole counts)
        block = [s for s in slots if s.region == "a" and i * width <= s.start_s < (i + 1) * width]
        share = params.cc_share(params.regions[0], (i + 0.5) / params.slices)
        assert abs(sum(s.label == "cc" for s in block) - share * len(block)) <= 3.0


@settings(max_examples=20, deadline=None)
@given(agents=st.integers(20, 2000), concurrency=st.integers(2, 400))
def test_the_tasks_running_at_the_start_are_met_part_way_through(agents: int, concurrency: int) -> None:
    params = FleetParams(regions=(Region("a", 1, 0.3, 0.7), Region("b", 3, 0.5, 0.5)), span_s=3600.0, slices=4,
                         concurrency=concurrency)
    slots = fleet_plan(params, agents, seed=2)
    per_region = dict(zip(("a", "b"), params.region_concurrency(concurrency), strict=True))
    for region, running in per_region.items():
        mine = [s for s in slots if s.region == region]
        assert all(0.0 < s.age < 1.0 for s in mine[:running] if s.age) and all(s.age == 0.0 for s in mine[running:])
        assert sum(s.age > 0 for s in mine[:running]) >= min(len(mine), running) - 1  # (a draw may round to 0)
    cold = fleet_plan(dataclasses.replace(params, staggered_start=False), agents, seed=2)
    assert all(s.age == 0.0 for s in cold)
    assert [dataclasses.replace(s, age=0.0) for s in slots] == cold  # ages change nothing else of the plan
