"""The evaluation runner's pure parts (matrix, keys, table rendering) and `bench sim`'s argument handling."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.cli.bench_sim import bench_config
from evolving_infra.cli.errors import CliError
from evolving_infra.cli.evaluate import (
    BEST_SPLIT,
    MATRICES,
    RunSpec,
    build_parser,
    matrix,
    trace_agents,
)
from evolving_infra.evaluation.tables import render_calibration, render_evaluation, summarize
from evolving_infra.evaluation.protocol import PROTOCOL_MATRICES


def record(workload: str, agents: int, system: str, x: float, e2e: float, switches: int = 0,
           lost: float | None = 0.01, share: dict[str, float] | None = None, end: float = 1800.0) -> dict[str, Any]:
    spec = RunSpec(workload, agents, system, BEST_SPLIT[workload], 600.0, 1200.0)
    overall = {"throughput_rps": x, "ttft_s": {"mean": 1.5, "p95": 4.25}, "e2e_s": {"mean": e2e, "p95": 3 * e2e},
               "mean_pause_s": 13.0, "lost_kv_reuse": lost, "kv_hit_rate": 0.95, "prefill_queue_s": {"mean": 0.5},
               "uncached_tokens_per_request": 4000.0, "little_n_branch": 100.0}
    metrics = {"overall": overall, "switches": {"count": switches, "mean_time_s": 2.0 if switches else None},
               "split_share": share or {spec.split: 1.0}}
    return {"spec": spec.__dict__ | {"overrides": []}, "metrics": metrics, "wall_s": 42.0, "sim_end_s": end}


def test_calibration_table_shows_measured_and_paper_figures_with_ratios() -> None:
    text = render_calibration([record("cc", 90, "best-static", 4.0, 11.5), record("cc", 90, "evolving", 9.0, 1.0),
                               record("cc", 126, "best-static", 6.0, 9.0)])
    rows = [line for line in text.splitlines() if line.startswith("| cc")]
    assert len(rows) == 1, "only best-static runs at table D.1's concurrency are calibration rows"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:5] == ["cc", "90", "4P5D", "4.00 (4.97)", "0.80"]
    assert cells[5:7] == ["11.5 (9.2)", "1.25"]
    assert cells[10] == "13.0 (12.9-18.6)"
    assert cells[11] == "600+1200" and cells[13] == "defaults"


def test_evaluation_table_groups_by_workload_and_orders_systems() -> None:
    recs = [record("cc", 90, "arrow", 1.0, 40.0, switches=30, lost=0.5, share={"4P5D": 0.2, "8P1D": 0.8}),
            record("cc", 90, "evolving", 5.5, 8.0, switches=1),
            record("putnam", 224, "dynamo", 7.0, 20.0, lost=None)]
    text = render_evaluation(recs)
    assert text.index("### cc, 90 agents") < text.index("### putnam, 224 agents")
    cc = text[: text.index("### putnam")]
    assert cc.index("| evolving |") < cc.index("| arrow |")
    arrow = next(line for line in text.splitlines() if line.startswith("| arrow |"))
    assert "| 30 (2.0); 0 / 0 | 8P1D |" in arrow and "| 50.00 |" in arrow
    assert "1.72 / - / 34 / 55.50" in arrow, "figure 3's Arrow figures sit beside"
    dynamo = next(line for line in text.splitlines() if line.startswith("| dynamo |"))
    assert "| - |" in dynamo, "a missing value renders as '-'"
    assert "7.72 / 19.1 / 2 / 2.47" in dynamo


def test_runs_from_another_initial_split_get_their_own_table_after_the_best_split() -> None:
    paper = record("cc", 90, "evolving", 5.0, 9.0)
    paper["spec"]["split"] = "6P3D"
    text = render_evaluation([paper, record("cc", 90, "dynamo", 4.0, 10.0), record("cc", 90, "evolving", 5.5, 8.0)])
    best, other = text.index("### cc, 90 agents, from 4P5D"), text.index("### cc, 90 agents, from 6P3D")
    assert best < other
    assert text[best:other].count("| evolving |") == 1 and text[other:].count("| evolving |") == 1
    assert "| dynamo |" not in text[other:]
    longer = record("cc", 90, "evolving", 5.2, 8.5)
    longer["spec"]["duration_s"] = 3600.0
    text = render_evaluation([longer, record("cc", 90, "evolving", 5.5, 8.0)])
    assert text.count("### cc, 90 agents, from 4P5D") == 2, "runs of different windows never share a table"


def test_a_run_whose_trace_ran_out_before_the_window_end_is_flagged() -> None:
    short = record("osworld", 128, "best-static", 9.0, 3.0, end=794.0)
    assert "600+1200 (trace ran out)" in render_calibration([short])
    assert "| best-static (trace ran out) |" in render_evaluation([short])
    assert "ran out" not in render_evaluation([record("osworld", 128, "best-static", 3.0, 30.0)])


def test_trace_is_sized_for_the_span() -> None:
    assert trace_agents("putnam", 224, 1200.0) == 224 * 8
    assert trace_agents("cc", 90, 5400.0) == 90 * 4
    assert trace_agents("osworld", 128, 0.0) == 256


def test_planner_decisions_are_counted_in_and_before_the_window() -> None:
    r = record("cc", 90, "dynamo", 2.0, 30.0)
    r["metrics"]["window"] = {"start": 600.0, "end": 1800.0}
    r["metrics"]["planner_switch_decisions"] = [
        {"at": 5.0, "outcome": "switch"}, {"at": 900.0, "outcome": "switch"}, {"at": 950.0, "outcome": "hold"},
        {"at": 1800.0, "outcome": "switch"}]
    s = summarize(r)
    assert (s["decided"], s["decided_total"]) == (1, 3)
    assert "; 1 / 3 |" in render_evaluation([r])


def test_the_fitted_models_held_out_error_is_shown_where_the_run_fitted_them() -> None:
    """The medians over nodes of the frozen fits' held-out errors (prefill / decode), '-' for runs on the
    profile's models or cached before the metrics carried them."""
    fitted = record("cc", 90, "evolving", 5.5, 8.0)
    fitted["metrics"]["simulation"] = {"fitted_models": {"nodes": {}, "prefill_held_out_error_median": 0.041,
                                                         "decode_held_out_error_median": 0.0625}}
    text = render_evaluation([fitted, record("cc", 90, "dynamo", 4.0, 10.0)])
    evolving = next(line for line in text.splitlines() if line.startswith("| evolving |"))
    dynamo = next(line for line in text.splitlines() if line.startswith("| dynamo |"))
    assert "| 4.10 / 6.25 | 42 |" in evolving and "| - / - | 42 |" in dynamo
    assert "held-out model error P / D %" in text


def test_summarize_picks_the_split_held_longest() -> None:
    s = summarize(record("cc", 90, "dynamo", 2.0, 30.0, share={"4P5D": 0.3, "3P6D": 0.7}))
    assert s["final_split"] == "3P6D" and s["x"] == 2.0 and s["ttft_p95"] == 4.25


@given(st.sampled_from(MATRICES),
       st.floats(0, 3600), st.floats(1, 3600), st.integers(0, 5))
def test_matrix_keys_are_unique_and_carry_the_window(name: str, warmup: float, duration: float, seed: int) -> None:
    specs = matrix(name, warmup, duration, seed)
    keys = [s.key() for s in specs]
    assert len(set(keys)) == len(keys) > 0
    assert all(s.warmup_s == warmup and s.duration_s == duration and s.seed == seed for s in specs)
    if name not in PROTOCOL_MATRICES:  # the protocol's matrices search splits and start planners from 6P3D
        assert all(s.split == BEST_SPLIT[s.workload] for s in specs)


def test_a_changed_generator_gives_another_cache_key(tmp_path: Path) -> None:
    """Cached runs are named by `RunSpec.key()`; a generator run's key carries the generators' source hash, so a
    run cached before the generator changed is not taken for a current one."""
    from evolving_infra.cli.evaluate import generator_fingerprint

    spec = RunSpec("cc", 90, "best-static", "4P5D", 600, 600)
    assert spec.key().endswith(f"-g{generator_fingerprint()}")
    (tmp_path / "cc.py").write_text("MAIN_STEPS = 200\n")
    before = generator_fingerprint(tmp_path)
    (tmp_path / "cc.py").write_text("MAIN_STEPS = 30\n")
    generator_fingerprint.cache_clear()
    assert generator_fingerprint(tmp_path) != before and len(before) == 8


def test_overrides_change_the_key_and_unknown_matrix_is_refused() -> None:
    a = RunSpec("cc", 90, "best-static", "4P5D", 600, 600)
    b = RunSpec("cc", 90, "best-static", "4P5D", 600, 600, overrides=(("output_tokens.mean", 1000),))
    assert a.key() != b.key() and "/" not in b.key()
    assert "--profile glm-5.2-4xgb300-tp4" in a.command()
    with pytest.raises(ValueError, match="unknown matrix"):
        matrix("nope", 0, 1)
    assert build_parser().parse_args(["run", "--warmup", "600"]).duration == 3600.0


def bench_args(**kw: Any) -> argparse.Namespace:
    base = {"workload": "cc", "system": "evolving", "agents": 90, "nodes": 9, "split": "4P5D", "warmup": 0.0,
            "duration": 3600.0, "seed": 0}
    return argparse.Namespace(**(base | kw))


def test_bench_sim_config_defaults_to_profile_models_without_warmup() -> None:
    cfg = bench_config(bench_args())
    assert cfg.agents == 90 and cfg.nodes == 9 and cfg.duration_s == 3600.0 and cfg.warmup_s == 0.0
    assert cfg.models.value == "profile"
    assert bench_config(bench_args(warmup=600.0)).models.value == "fitted"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("agents", 0, "--agents must be >= 1"), ("duration", 0.0, "--duration must be > 0"),
    ("warmup", -1.0, "--warmup must be >= 0"), ("nodes", 1, "--nodes must be >= 2"),
    ("split", "9P9D", "invalid settings"),
])
def test_bench_sim_refuses_bad_flags(flag: str, value: object, message: str) -> None:
    with pytest.raises(CliError, match=message):
        bench_config(bench_args(**{flag: value}))
