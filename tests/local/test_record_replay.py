"""`evolving-infra local --record DIR`: the router's recording of a real local run validates, holds what was
served (the lengths and pauses of the replayed trace), and its simulator replay is compared with the live run
(`fidelity.json`): with the live path's overheads calibrated from the recording (the router's view) and charged,
mean TTFT, mean E2E and the KV hit rate are within the 10 % bound of the live report (the clients' view).

The run is `tiny` at `--speed-up 0.25`: the emulated engine runs at a quarter of the wall clock's rate, so the
local harness's own CPU costs (five Python processes on a shared machine, a few tens of milliseconds a request)
weigh a quarter as much against the engine's times as at speed-up 1, where mean TTFT lands 6-25 % off under
load (docs/traces.md, "Fidelity"). The calibration and the start-up hold are tested on synthetic recordings."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.sim.recorded import (
    LivePathOverheads, ModelsFileError, calibrate_overheads, charge_records, count_from_due, decode_iterations,
    hold_start, load_models, middle_mean, profile_with_models,
)  # fmt: skip
from evolving_infra.sim.records import RequestRecord
from evolving_infra.sim.run import simulate
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.loader import load_trace

LOCAL = [sys.executable, "-P", "-m", "evolving_infra", "local", "--quiet"]


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    base = tmp_path_factory.mktemp("record")
    record, out = base / "rec", base / "out"
    done = subprocess.run(LOCAL + ["--preset", "tiny", "--speed-up", "0.25", "--record", str(record), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    fidelity = json.loads((record / "fidelity.json").read_text())
    return record, report, fidelity


def test_the_recording_validates_and_holds_what_was_served(recorded_run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    record, report, _ = recorded_run
    trace = load_trace(record / "trace.jsonl")
    original = PRESETS[PresetName.TINY].trace(0)
    assert len(trace.requests) == report["run"]["finished"] == len(original.requests)
    assert Counter(r.prompt_tokens for r in trace.requests) == Counter(r.prompt_tokens for r in original.requests)
    assert Counter(r.output_tokens for r in trace.requests) == Counter(r.output_tokens for r in original.requests)
    assert len(trace.agents) == len(original.agents)
    # Pauses: each recorded pause is one of the trace's (the client waits delay_s / speed-up after the answer).
    wanted = sorted(r.delay_s for r in original.requests if r.after)
    got = sorted(r.delay_s for r in trace.requests if r.after)
    assert got == pytest.approx(wanted, abs=0.15)
    assert "recorded_ttft_s" in (record / "trace.jsonl").read_text() and "recorded_queue_s" in (record / "trace.jsonl").read_text()
    models = json.loads((record / "models.json").read_text())
    assert models["kind"] == "evolving-infra-node-models" and models["nodes"] == {}  # no warmup: profile models
    live_path = models["live_path"]  # calibrated from the recording after the run
    assert live_path["requests"] == len(trace.requests) and live_path["request_s"] > 0 and live_path["iteration_s"] > 0


def test_the_replay_reproduces_the_kv_hit_rate(recorded_run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    _, report, fidelity = recorded_run
    hit = next(f for f in fidelity["figures"] if f["name"] == "KV hit rate")
    assert hit["live"] == report["kv"]["hit_rate"] and hit["relative_error"] <= fidelity["bound"] == 0.10
    assert fidelity["replay_command"].startswith("evolving-infra simulate ")


def _figure(fidelity: dict[str, Any], name: str, key: str = "figures") -> dict[str, Any]:
    return next(f for f in fidelity[key] if f["name"] == name)


def test_charging_the_live_path_brings_the_replay_closer_to_the_live_run(
    recorded_run: tuple[Path, dict[str, Any], dict[str, Any]],
) -> None:  # fmt: skip
    """The overheads calibrated from the recording move both latency figures toward the live ones (the charged
    replay is compared with the run's report, not with the recording the overheads came from)."""
    _, report, fidelity = recorded_run
    for name, live in (("mean TTFT (s)", report["latency_s"]["ttft"]["mean"]), ("mean E2E (s)", report["latency_s"]["e2e"]["mean"])):
        charged, bare = _figure(fidelity, name), _figure(fidelity, name, "uncharged")
        assert charged["live"] == bare["live"] == live
        assert charged["replay"] > bare["replay"]  # charges lengthen the replay, never shorten it
        assert charged["relative_error"] < bare["relative_error"], (name, charged, bare)
    assert fidelity["replay_command"].count("--models-from") == 1


def test_the_replay_reproduces_the_live_run_within_the_bound(
    recorded_run: tuple[Path, dict[str, Any], dict[str, Any]],
) -> None:  # fmt: skip
    _, _, fidelity = recorded_run
    for figure in fidelity["figures"]:
        assert figure["relative_error"] <= fidelity["bound"], figure


# -- the calibration, without a live run ------------------------------------------------------------------
def _record(rid: str, issued: float, ttft: float, decode: float, output: int = 100) -> RequestRecord:
    return RequestRecord(request_id=rid, agent="a", workload="w", branch="b", issued=issued, prefill_node="n0",
                         decode_node="n1", queued=issued, prefill_start=issued, first_token=issued + ttft,
                         finish=issued + ttft + decode, prompt_tokens=500, cached_tokens=0, fetched_tokens=0,
                         output_tokens=output)  # fmt: skip


@given(values=st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=40), slow=st.floats(1.0, 1e6))
def test_the_middle_mean_ignores_a_slow_request_and_stays_within_the_middle(values: list[float], slow: float) -> None:
    """Like a median, the middle mean lies between the middle half's ends and does not move when one value
    (the largest) becomes arbitrarily slow; equal values give back that value."""
    ordered = sorted(values)
    cut = max(1, len(ordered) // 4)
    got = middle_mean(values)
    assert ordered[cut] - 1e-12 <= got <= ordered[len(ordered) - cut - 1] + 1e-12
    assert middle_mean(ordered[:-1] + [max(ordered[-1], slow)]) == pytest.approx(got, abs=1e-12)
    assert middle_mean([values[0]] * len(values)) == pytest.approx(values[0], abs=1e-12)


def test_the_middle_mean_does_not_jump_between_two_clusters() -> None:
    """Thirteen residuals in two clusters 15 ms apart (a `tiny` run's): one request moving across moves the
    median by most of the gap, the middle mean by at most a seventh of it."""
    fast, slow = [0.010 + 0.0005 * i for i in range(7)], [0.025 + 0.0005 * i for i in range(6)]
    moved = fast[:-1] + [fast[-1] + 0.015] + slow
    median_jump = statistics.median(moved) - statistics.median(fast + slow)
    middle_jump = middle_mean(moved) - middle_mean(fast + slow)
    assert median_jump >= 0.8 * 0.015 - 1e-12 and 0 < middle_jump <= 0.015 / 7 + 1e-12
    with pytest.raises(ValueError, match="no values"):
        middle_mean([])


@given(
    request_s=st.floats(0.0, 0.5), iteration_s=st.floats(0.0, 0.01),
    engine=st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.01, 5.0), st.integers(1, 400)), min_size=1, max_size=12),
)  # fmt: skip
def test_calibration_recovers_the_overheads_a_recording_carries(
    request_s: float, iteration_s: float, engine: list[tuple[float, float, int]],
) -> None:  # fmt: skip
    """A recording whose every request is its replay plus `request_s` on the first token and `iteration_s` per
    decode iteration gives back exactly those two costs."""
    t_acc = 2.0
    uncharged = [_record(f"r{i}", float(i), ttft, decode, out) for i, (ttft, decode, out) in enumerate(engine)]
    rows = [{"id": r.request_id, "recorded_ttft_s": r.first_token - r.issued + request_s,
             "recorded_e2e_s": r.finish - r.issued + request_s + iteration_s * decode_iterations(r.output_tokens, t_acc)}
            for r in uncharged]  # fmt: skip
    charged_iterations = [
        dataclasses.replace(r, finish=r.finish + iteration_s * decode_iterations(r.output_tokens, t_acc)) for r in uncharged
    ]
    got = calibrate_overheads(rows + [{"id": "never-replayed", "recorded_ttft_s": 9.0, "recorded_e2e_s": 9.0}],
                              uncharged, charged_iterations, t_acc)  # fmt: skip
    assert got.request_s == pytest.approx(request_s, abs=1e-9)
    assert got.iteration_s == pytest.approx(iteration_s, abs=1e-9)
    assert got.requests == len(engine)
    charged = charge_records(charged_iterations, got)
    for row, r in zip(rows, charged, strict=True):
        assert r.first_token - r.issued == pytest.approx(row["recorded_ttft_s"], abs=1e-9)
        assert r.finish - r.issued == pytest.approx(row["recorded_e2e_s"], abs=1e-9)


@given(
    request_s=st.floats(0.0, 0.5), cold_s=st.floats(0.0, 1.0), iteration_s=st.floats(0.0, 0.01),
    engine=st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.01, 5.0), st.integers(1, 400)), min_size=3, max_size=12),
    first=st.integers(0, 11), queued=st.one_of(st.none(), st.floats(0.0, 1.5)),
)  # fmt: skip
def test_calibration_takes_the_start_up_transient_from_the_first_request_alone(
    request_s: float, cold_s: float, iteration_s: float, engine: list[tuple[float, float, int]], first: int,
    queued: float | None,
) -> None:  # fmt: skip
    """The request that arrived first carries `cold_s` more on its first token and end, `queued` of it (at most)
    waiting for its prefill to start: the medians do not move, the start-up hold is the part before the
    prefill (all of it when the recording has no queue waits) and the first request's own charge the rest,
    whichever request in the list arrived first; charged, the replay gives back each recorded time."""
    t_acc = 2.0
    first %= len(engine)
    uncharged = [_record(f"r{i}", float(i), ttft, decode, out) for i, (ttft, decode, out) in enumerate(engine)]
    charged_iterations = [
        dataclasses.replace(r, finish=r.finish + iteration_s * decode_iterations(r.output_tokens, t_acc)) for r in uncharged
    ]
    rows = []
    for i, r in enumerate(uncharged):
        extra = request_s + (cold_s if i == first else 0.0)
        rows.append({"id": r.request_id, "recorded_arrival_s": -1.0 if i == first else float(i),
                     "recorded_ttft_s": r.first_token - r.issued + extra,
                     "recorded_e2e_s": r.finish - r.issued + extra + iteration_s * decode_iterations(r.output_tokens, t_acc)})  # fmt: skip
        if queued is not None:
            rows[-1]["recorded_queue_s"] = queued if i == first else 0.0
    got = calibrate_overheads(rows, uncharged, charged_iterations, t_acc)
    assert got.request_s == pytest.approx(request_s, abs=1e-9)
    assert got.iteration_s == pytest.approx(iteration_s, abs=1e-9)
    hold = cold_s if queued is None else min(cold_s, queued)
    assert got.cold_start_s == pytest.approx(hold, abs=1e-9)
    assert got.first_request_s == pytest.approx(cold_s - hold, abs=1e-9)
    # Charged: the hold delays the first request (nothing else waits on it here), the rest is its own charge.
    held = [dataclasses.replace(r, first_token=r.first_token + got.cold_start_s, finish=r.finish + got.cold_start_s)
            if i == first else r for i, r in enumerate(charged_iterations)]  # fmt: skip
    for row, r in zip(rows, charge_records(held, got, first=f"r{first}"), strict=True):
        assert r.first_token - r.issued == pytest.approx(row["recorded_ttft_s"], abs=1e-9)
        assert r.finish - r.issued == pytest.approx(row["recorded_e2e_s"], abs=1e-9)


def _two_agents(tmp_path: Path) -> Path:
    rows = [
        {"kind": "header", "version": 1, "name": "held"},
        {"kind": "agent", "agent": "a0", "workload": "w", "start_s": 0.0},
        {"kind": "agent", "agent": "a1", "workload": "w", "start_s": 5.0},
        {"kind": "request", "id": "r1", "agent": "a0", "branch": "b0", "after": [], "delay_s": 0.0, "input": {"new": 300},
         "output_tokens": 20},
        {"kind": "request", "id": "r2", "agent": "a0", "branch": "b0", "after": ["r1"], "delay_s": 0.5,
         "input": {"base": "r1", "keep": 320, "new": 50}, "output_tokens": 20},
        {"kind": "request", "id": "r3", "agent": "a1", "branch": "b1", "after": [], "delay_s": 0.0, "input": {"new": 100},
         "output_tokens": 10},
    ]  # fmt: skip
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_start_up_hold_delays_what_was_due_during_it_and_what_waits_on_it(tmp_path: Path) -> None:
    """On an idle cluster, a hold of 0.25 s adds exactly 0.25 s to the latency of the request due during it
    (counted from when it was due), moves its successor 0.25 s later with the same latency, and leaves the agent
    that starts after the hold alone."""
    trace = load_trace(_two_agents(tmp_path))
    cfg = build_config("evolving", profile="deepseek-v4-flash-4xh200-tp4", nodes=3, split="1P2D", planner="ours",
                       prefill_routing="ttft", warmup_s=0.0, models="profile", seed=0)  # fmt: skip
    plain = {r.request_id: r for r in simulate(cfg, trace).records}
    held_trace, due = hold_start(trace, 0.25)
    assert due == {"r1": 0.0} and {a: x.start_s for a, x in held_trace.agents.items()} == {"a0": 0.25, "a1": 5.0}
    held = {r.request_id: r for r in count_from_due(simulate(cfg, held_trace).records, due)}
    assert held["r1"].ttft_s == pytest.approx(plain["r1"].ttft_s + 0.25)
    assert held["r1"].e2e_s == pytest.approx(plain["r1"].e2e_s + 0.25)
    assert held["r2"].issued == pytest.approx(plain["r2"].issued + 0.25)
    assert (held["r2"].ttft_s, held["r2"].e2e_s) == pytest.approx((plain["r2"].ttft_s, plain["r2"].e2e_s))
    assert held["r3"] == plain["r3"]
    assert hold_start(trace, 0.0) == (trace, {})


def test_a_models_file_with_a_live_path_charges_each_decode_iteration(tmp_path: Path) -> None:
    base = load_profile("deepseek-v4-flash-4xh200-tp4")
    live = LivePathOverheads(request_s=0.02, iteration_s=0.0005, requests=7)
    doc = {"kind": "evolving-infra-node-models", "version": 1, "profile": base.name, "nodes": {}, "live_path": live.to_dict()}
    path = tmp_path / "models.json"
    path.write_text(json.dumps(doc))
    profile = profile_with_models(base, load_models(path))
    assert profile.decode.d0 == pytest.approx(base.decode.d0 + 0.0005) and profile.prefill == base.prefill
    assert "per-iteration cost" in profile.sources["decode.d0"]
    without = {**doc, "live_path": None}
    with pytest.raises(ModelsFileError, match="no node has a fitted prefill"):
        profile_with_models(base, without)
    path.write_text(json.dumps({**doc, "live_path": {"request_s": "soon"}}))
    with pytest.raises(ModelsFileError, match="bad live_path"):
        load_models(path)
    for name in ("cold_start_s", "first_request_s"):
        path.write_text(json.dumps({**doc, "live_path": {**live.to_dict(), name: -1.0}}))
        with pytest.raises(ModelsFileError, match=f"{name} must be >= 0"):
            load_models(path)
    older = LivePathOverheads.from_dict({"request_s": 0.1, "iteration_s": 0.0, "requests": 2})
    assert older.cold_start_s == older.first_request_s == 0.0
    with pytest.raises(ValueError, match="nothing to calibrate"):
        calibrate_overheads([], [], [], 1.0)


def test_the_replay_plans_with_the_live_runs_window_and_prints_a_command_that_does_too(tmp_path: Path) -> None:
    """The live router planned over the run's window, slices and cooldown (emulated seconds); the replay's planner
    gets the same, and the printed what-if command builds the same settings through `simulate`'s parser."""
    import shlex

    from evolving_infra.cli.main import build_parser
    from evolving_infra.cli.simulate import _config
    from evolving_infra.local.fidelity import replay_config

    cluster = {"nodes": 4, "planner": "ours", "routing": "ttft", "warmup_s": 0.0, "profile": "glm-5.2-4xgb300-tp4",
               "seed": 3, "window_s": 40.0, "slices": 8, "cooldown_s": 30.0}  # fmt: skip
    report = {"config": {"cluster": cluster, "split": "2P2D"}}
    cfg, command = replay_config(report, tmp_path)
    assert cfg.planner_settings == {"window_s": 40.0, "slices": 8, "cooldown_s": 30.0}
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert _config(args).planner_settings == cfg.planner_settings
    static, _ = replay_config({"config": {"cluster": {**cluster, "planner": "static"}, "split": "2P2D"}}, tmp_path)
    assert static.planner_settings == {}  # only ours takes a window as settings
    from evolving_infra.cli.errors import CliError

    for bad, message in ((["--planner-set", "window_s"], "KEY=VALUE"), (["--planner-set", "windows=40"], "invalid settings")):
        with pytest.raises(CliError, match=message):
            _config(build_parser().parse_args(["simulate", "--workload", "putnam", "--agents", "2", *bad]))
