"""D.3's admission figures of open-loop runs (sim/admission.py): counted over the scored window only, never more
admitted than arrived, waits never negative; recorded by the simulator in open loop and absent in closed loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.cli.evaluate import RunSpec, run_spec
from evolving_infra.sim.admission import admission_summary

times = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False)
pairs = st.lists(st.tuples(times, st.floats(min_value=0.0, max_value=200.0, allow_nan=False))
                 .map(lambda p: (p[0], p[0] + p[1])), max_size=40)  # fmt: skip


@given(pairs, st.lists(times, max_size=20), times, st.floats(min_value=0.0, max_value=500.0))
def test_admitted_agents_are_those_arriving_in_the_window_and_started_before_its_end(
    admitted: list[tuple[float, float]], waiting: list[float], start: float, length: float
) -> None:
    end = start + length
    out = admission_summary(admitted, waiting, start, end)
    in_window = [(a, s) for a, s in admitted if start <= a < end]
    assert out["arrived"] == len(in_window) + sum(1 for a in waiting if start <= a < end)
    assert out["admitted"] == sum(1 for _, s in in_window if s < end) <= out["arrived"]
    if out["arrived"]:
        assert 0.0 <= out["admitted_fraction"] <= 1.0
        assert out["admitted_fraction"] == out["admitted"] / out["arrived"]
    else:
        assert out["admitted_fraction"] is None
    if out["admitted"]:
        longest = max(s - a for a, s in in_window if s < end)
        assert 0.0 <= out["wait_mean_s"] <= longest + 1e-9 and 0.0 <= out["wait_p95_s"] <= longest + 1e-9


def test_a_waiting_agent_and_a_late_start_count_as_not_admitted() -> None:
    out = admission_summary([(10.0, 10.0), (20.0, 50.0), (30.0, 130.0), (5.0, 60.0)], [90.0, 150.0], 10.0, 100.0)
    # in the window: arrivals 10, 20, 30 (started 130: after the end) and 90 (still waiting); 5 and 150 are outside
    assert (out["arrived"], out["admitted"]) == (4, 2)
    assert out["admitted_fraction"] == 0.5 and out["wait_mean_s"] == 15.0


def test_bad_admission_input_is_refused() -> None:
    with pytest.raises(ValueError, match="before it arrived"):
        admission_summary([(10.0, 5.0)], [], 0.0, 100.0)
    with pytest.raises(ValueError, match="ends before it starts"):
        admission_summary([], [], 10.0, 5.0)


def test_an_open_loop_run_reports_its_admission_and_a_closed_loop_run_none() -> None:
    # one agent at most, twelve arriving per minute: most wait for the first one's long task
    capped = run_spec(RunSpec("putnam", 1, "best-static", "2P7D", 30.0, 60.0, 0, arrival_rate=12.0))
    admission = capped["metrics"]["simulation"]["admission"]
    assert admission["arrived"] >= 5 and admission["admitted"] < 0.9 * admission["arrived"]
    roomy = run_spec(RunSpec("putnam", 64, "best-static", "2P7D", 30.0, 60.0, 0, arrival_rate=6.0))
    assert roomy["metrics"]["simulation"]["admission"]["admitted_fraction"] == 1.0
    assert roomy["metrics"]["simulation"]["admission"]["wait_p95_s"] == 0.0
    closed = run_spec(RunSpec("putnam", 4, "best-static", "2P7D", 30.0, 60.0, 0))
    assert "admission" not in closed["metrics"]["simulation"]
