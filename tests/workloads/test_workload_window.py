"""The closed-loop timeline (`workloads.window`): causal, at most N agents at once in file order, and a window
over everything gives the trace-wide shape."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.workloads import generate, shapes
from evolving_infra.workloads.window import Latency, closed_loop, window_shape


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["cc", "osworld", "putnam"]),
    seed=st.integers(0, 2**31),
    loop=st.integers(1, 4),
    ttft=st.floats(0.0, 10.0),
    tpot=st.floats(0.0, 0.02),
)
def test_requests_follow_what_they_wait_for_and_agents_share_n_slots(
    kind: str, seed: int, loop: int, ttft: float, tpot: float
) -> None:
    records: list[dict[str, Any]] = generate(kind, 6, seed)
    lat = Latency(ttft, tpot)
    tl = closed_loop(records, loop, math.inf, lat)
    assert tl.agents_started == 6 and tl.ran_out is (loop > 0)
    spans: list[tuple[float, float]] = []
    agent_reqs: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["kind"] == "request":
            agent_reqs.setdefault(r["agent"], []).append(r)
            ready = max((tl.finish[a] for a in r["after"]), default=None)
            if ready is not None:
                assert tl.issue[r["id"]] == pytest.approx(ready + r["delay_s"])
            assert tl.finish[r["id"]] == pytest.approx(tl.issue[r["id"]] + lat.of(r["output_tokens"]))
    for reqs in agent_reqs.values():
        spans.append((min(tl.issue[r["id"]] for r in reqs), max(tl.finish[r["id"]] for r in reqs)))
    starts = [s for s, _ in spans]
    assert starts == sorted(starts), "agents start in file order"
    assert starts[: min(loop, 6)] == [0.0] * min(loop, 6)
    for t, _ in spans:
        assert sum(1 for a, b in spans if a <= t < b) <= loop, "at most N agents at once"


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(["cc", "osworld", "putnam"]), seed=st.integers(0, 2**31))
def test_a_window_over_everything_is_the_trace_shape(kind: str, seed: int) -> None:
    records: list[dict[str, Any]] = generate(kind, 5, seed)
    w = window_shape(records, 5, 0.0, 1e12)
    assert w.shapes == shapes(records)


def test_a_late_window_sees_older_agents_and_flags_a_short_trace() -> None:
    records: list[dict[str, Any]] = generate("cc", 40, 1)
    early, late = window_shape(records, 10, 0, 600), window_shape(records, 10, 1800, 2400)
    assert late.shapes["cc"].mean_prompt > early.shapes["cc"].mean_prompt
    assert late.alive_branches >= 10 and late.requests_per_s > 0
    assert 0 < late.little_branches <= late.alive_branches + 1e-9
    assert not late.timeline.ran_out
    assert window_shape(generate("cc", 3, 1), 10, 1800, 2400).timeline.ran_out


def test_bad_windows_are_errors() -> None:
    records: list[dict[str, Any]] = generate("putnam", 2, 0)
    with pytest.raises(ValueError, match="window"):
        window_shape(records, 2, 10, 5)
    with pytest.raises(ValueError, match="agents"):
        closed_loop(records, 0, 100)
    with pytest.raises(ValueError, match="latency"):
        Latency(-1.0)
