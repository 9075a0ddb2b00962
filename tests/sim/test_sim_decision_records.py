"""The simulator's record of each switch of our planner names every candidate it weighed (split, mean gain, standard
error, slices, verdict, the one chosen), as the live router's CR status does, so a run's output says why it moved."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evolving_infra.router.planner import OursPlanner, PlannerObservation
from evolving_infra.sim.run import SimResult, simulate, workload_stream
from evolving_infra.sim.systems import build_config


def test_each_switch_of_ours_lists_its_candidates_with_the_chosen_one_first_in_gain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, made = _run_seeing_decisions(monkeypatch, duration_s=200)
    seen = [(now, decision.reason) for now, decision in made.items()]
    decisions = result.metrics.extra["planner_switch_decisions"]
    assert decisions, "the run should switch at least once"
    json.dumps(decisions)  # plain data, as metrics.json writes it
    for record in decisions:
        assert (record["at"], record["reason"]) in seen
        candidates = record["candidates"]
        chosen = [c for c in candidates if c["chosen"]]
        assert len(chosen) == 1 and chosen[0]["verdict"] == "qualified"
        assert f"-> {chosen[0]['split']}:" in record["reason"]
        assert f"mean gain {chosen[0]['mean_gain']:.4g} req/s" in record["reason"]
        qualified = [c for c in candidates if c["verdict"] == "qualified"]
        assert max(c["mean_gain"] for c in qualified) == chosen[0]["mean_gain"]
        active = record["active_kv_pages"]  # the simulator knows its nodes' sizes: the KV rule's inputs are there
        assert isinstance(active, int) and active > 0
        for c in candidates:
            assert c["prefill_kv_pages"] > 0 and c["prefill_kv_pages"] % int(c["split"].split("P")[0]) == 0
            if c["verdict"] == "prefill_kv_short":
                assert c["prefill_kv_pages"] < active
            assert c["slices"] >= 1 and c["history"] <= c["slices"]
            if c["verdict"] == "qualified":
                assert c["mean_gain"] > 2 * c["std_error"]


def test_each_hold_of_ours_that_weighed_candidates_is_recorded_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = _run_seeing_decisions(monkeypatch, duration_s=400)
    holds = result.metrics.extra["planner_hold_decisions"]
    switches = result.metrics.extra["planner_switch_decisions"]
    json.dumps(holds)
    weighed = {t: d for t, d in seen.items() if d.outcome.value == "hold"}
    assert weighed, "the run should hold at least once after weighing candidates"
    assert [h["at"] for h in holds] == sorted(weighed)  # every hold, in order; skips are not holds
    assert {s["at"] for s in switches}.isdisjoint(h["at"] for h in holds)
    for h in holds:
        decision = weighed[h["at"]]
        assert h["outcome"] == "hold" and h["reason"] == decision.reason and h["reason"].startswith("hold ")
        assert h["candidates"] and not any(c["chosen"] for c in h["candidates"])
        assert all(c["verdict"] != "qualified" for c in h["candidates"])  # a qualified candidate is a switch
        assert len(h["candidates"]) == len(decision.diagnostics.candidates)
    assert result.stats["planner_switches"] == len(switches)
    assert result.stats["planner_ticks"] >= len(switches) + len(holds)


def test_simulate_prints_one_line_on_the_planners_switches_holds_and_kv_refusals() -> None:
    from evolving_infra.cli.simulate import planner_summary

    def cand(split: str, gain: float | None, verdict: str, chosen: bool = False) -> dict[str, Any]:
        return {"split": split, "mean_gain": gain, "verdict": verdict, "chosen": chosen}

    extra = {
        "planner_switch_decisions": [{"at": 1800.0, "outcome": "switch", "candidates": [
            cand("4P8D", 0.86, "qualified", True), cand("3P9D", 1.67, "prefill_kv_short")]}],
        "planner_hold_decisions": [
            {"at": 1200.0, "outcome": "hold", "candidates": [cand("4P8D", 0.24, "below_threshold"),
                                                             cand("2P10D", 0.70, "prefill_kv_short")]},
            {"at": 2400.0, "outcome": "hold", "candidates": [cand("5P7D", None, "too_few_slices")]},
        ],
    }  # fmt: skip
    line = planner_summary(extra)
    assert line is not None
    assert line.startswith("planner: 1 switch, 2 holds; 2 candidate moves refused by the KV check: ")
    assert line.index("1,200 s hold (best 2P10D +0.70 req/s, prefill kv short)") < line.index("1,800 s -> 4P8D (+0.86")
    assert line.endswith("2,400 s hold (too few slices)")
    assert planner_summary(extra, most=1).endswith("(last 1 of 3): 2,400 s hold (too few slices)")
    assert planner_summary({"planner_switch_decisions": [], "planner_hold_decisions": []}) is None
    assert planner_summary({}) is None


def _run_seeing_decisions(monkeypatch: pytest.MonkeyPatch, duration_s: float) -> tuple[SimResult, dict[float, Any]]:
    """A short run from a split with one decode node (the planner moves within it, 60 s windows), and every decision
    our planner returned in it, by time."""
    seen: dict[float, Any] = {}
    inner = OursPlanner.decide

    def decide(self: OursPlanner, observation: PlannerObservation, now: float) -> Any:
        seen[now] = decision = inner(self, observation, now)
        return decision

    monkeypatch.setattr(OursPlanner, "decide", decide)
    cfg = build_config("evolving", agents=30, nodes=6, split="5P1D", seed=1, warmup_s=0, duration_s=duration_s,
                       models="profile", planner_settings={"window_s": 60, "slices": 4, "cooldown_s": 0})  # fmt: skip
    return simulate(cfg, workload_stream("cc", 60, 1)), seen
