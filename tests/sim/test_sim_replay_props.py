"""Replay invariants on random valid traces (built as records and loaded by the real trace loader):
every request is issued exactly once, exactly when its dependencies allow; every branch and agent ends once;
the mode's limits on active agents hold; a schedule-following closed loop skips exactly the agents it must."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.sim.replay import AgentReplayer, ReplayMode
from evolving_infra.sim.replay_loop import run_replay
from evolving_infra.traces.loader import trace_from_records

DELAYS = [0.0, 0.0, 0.5, 1.0, 3.0]
SERVICE = [0.0, 0.25, 1.0, 2.0, 7.5]


@st.composite
def trace_records(draw: st.DrawFn) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []
    for ai in range(draw(st.integers(1, 4))):
        name = f"a{ai}"
        start = draw(st.sampled_from([0.0, 1.0, 2.5, 10.0]))
        records.append({"kind": "agent", "agent": name, "workload": f"w{ai % 2}", "start_s": start})
        ids: list[str] = []
        branches: list[str] = []
        last: dict[str, str] = {}
        for k in range(draw(st.integers(0, 6))):
            if branches and draw(st.booleans()):
                branch = draw(st.sampled_from(branches))
            else:
                branch = f"{name}.b{len(branches)}"
                branches.append(branch)
            after = draw(st.lists(st.sampled_from(ids), max_size=3, unique=True)) if ids else []
            rid = f"{name}.r{k}"
            records.append(
                {
                    "kind": "request",
                    "id": rid,
                    "agent": name,
                    "branch": branch,
                    "after": after,
                    "delay_s": draw(st.sampled_from(DELAYS)),
                    "input": {"new": 16},
                    "output_tokens": 3,
                }
            )
            ids.append(rid)
            last[branch] = rid
        for branch in branches:
            if draw(st.booleans()):
                ends.append({"kind": "branch_end", "branch": branch, "after": last[branch]})
    return records + ends


modes = st.one_of(
    st.integers(1, 3).map(ReplayMode.closed_loop),
    st.tuples(st.integers(1, 3), st.sampled_from([0.0, 1.0, 5.0])).map(lambda t: ReplayMode.closed_loop(*t)),
    st.one_of(st.none(), st.integers(1, 2)).map(lambda cap: ReplayMode.open_loop(max_active=cap)),
)


@given(records=trace_records(), mode=modes, service=st.lists(st.sampled_from(SERVICE), min_size=30, max_size=30))
def test_replay_invariants(
    records: list[dict[str, Any]], mode: ReplayMode, service: list[float], check_replay: Callable[..., None]
) -> None:
    trace = trace_from_records(records)
    replayer = AgentReplayer(trace, mode)
    log = run_replay(replayer, lambda r: service[r.index % len(service)])
    check_replay(trace, mode, replayer, log)


@given(trace_records(), st.integers(1, 3))
def test_replay_is_deterministic(records: list[dict[str, Any]], concurrency: int) -> None:
    trace = trace_from_records(records)
    runs = [
        run_replay(AgentReplayer(trace, ReplayMode.closed_loop(concurrency)), lambda r: 1.0 + r.index % 3).effects
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
