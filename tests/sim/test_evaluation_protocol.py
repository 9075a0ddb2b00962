"""The evaluation protocol (evolving_infra/evaluation): the searched best static split, the per-window oracle,
means over seeds with 95 % intervals, the open-loop sustained rate, the protocol's matrices, and one tiny
open-loop run through the runner."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.cli.evaluate import BEST_SPLIT, RunSpec, completion_series, matrix, run_spec
from evolving_infra.evaluation.protocol import ABLATIONS, mean_prefill_nodes, render_protocol, render_sweep
from evolving_infra.evaluation.search import all_splits, best_split, sustained_rate, sustains, window_oracle
from evolving_infra.evaluation.stats import mean_interval


def record(system: str, split: str, x: float, seed: int = 0, label: str = "", finished: list[int] | None = None,
           workload: str = "cc", agents: int = 90) -> dict[str, Any]:  # fmt: skip
    spec = RunSpec(workload, agents, system, split, 600.0, 1200.0, seed, label=label)
    overall = {"throughput_rps": x, "ttft_s": {"mean": 1.0, "p95": 3.0, "p50": 0.5},
               "e2e_s": {"mean": 9.0, "p50": 6.0}, "lost_kv_reuse": 0.01}  # fmt: skip
    out: dict[str, Any] = {"spec": asdict(spec), "metrics": {"overall": overall}}
    if finished is not None:
        out["series"] = {"bucket_s": 600.0, "finished": finished}
    return out


def test_all_splits_run_from_one_prefill_node_to_one_decode_node() -> None:
    assert all_splits(9) == ["1P8D", "2P7D", "3P6D", "4P5D", "5P4D", "6P3D", "7P2D", "8P1D"]
    with pytest.raises(ValueError):
        all_splits(1)


@given(st.dictionaries(st.sampled_from(all_splits(9)), st.floats(0, 100) | st.none(), min_size=1))
def test_best_static_picks_the_split_with_the_highest_throughput_among_all_it_ran(xs: dict[str, float | None]) -> None:
    ran = {k: v for k, v in xs.items() if v is not None}
    if not ran:
        with pytest.raises(ValueError):
            best_split(xs)
        return
    split, x = best_split(xs)
    assert x == max(ran.values()) and ran[split] == x
    assert split == next(k for k, v in ran.items() if v == x)  # ties: the first listed


def test_the_searched_best_static_row_is_the_best_mean_over_seeds_and_shows_the_paper_split() -> None:
    recs = [record("best-static", s, x, seed) for s, xs in {"2P7D": (5.0, 5.4), "4P5D": (5.2, 5.1),
                                                            "3P6D": (5.3, 5.0)}.items()
            for seed, x in enumerate(xs)]  # fmt: skip
    recs += [record("evolving", "6P3D", 6.0, 0), record("evolving", "6P3D", 6.4, 1)]
    text = render_protocol(recs, BEST_SPLIT)
    row = next(line for line in text.splitlines() if line.startswith("| best-static (searched)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2P7D (searched over 3; D.1: 4P5D)"  # mean 5.2 beats 5.15 and 5.15
    assert cells[2] == "2" and cells[3].startswith("5.20 ± ")
    assert cells[-1] == f"{6.2 / 5.2:.2f}"  # ours over the searched best static
    ours = next(line for line in text.splitlines() if line.startswith("| evolving |"))
    assert "6.20 ± " in ours
    assert "Best static search (mean X req/s per split): 2P7D 5.20, 3P6D 5.15, 4P5D 5.15" in text


def test_the_protocol_table_shows_the_papers_figures_beside_each_row() -> None:
    """Ours and Dynamo get tables C.1/C.3's X and mean E2E at their concurrency; the searched best static row gets
    D.1's (SGLang's split) at the lowest concurrency only; relabelled variants and other concurrencies get none."""
    from evolving_infra.evaluation.tables import PAPER_C, PAPER_D1

    def cells(text: str, prefix: str) -> list[str]:
        row = next(line for line in text.splitlines() if line.startswith(prefix))
        return [c.strip() for c in row.strip("|").split("|")]

    recs = [record("evolving", "6P3D", 6.0), record("dynamo", "6P3D", 4.0), record("best-static", "3P6D", 5.5),
            record("evolving", "4P5D", 5.0, label="evolving -adaptation")]
    text = render_protocol(recs, BEST_SPLIT)
    assert "| paper X / E2E |" in text
    c = PAPER_C[("cc", 90)]
    assert cells(text, "| evolving | 6P3D")[-2] == f"{c['evolving']['x']:.2f} / {c['evolving']['e2e']:.1f}"
    assert cells(text, "| dynamo | 6P3D")[-2] == f"{c['dynamo']['x']:.2f} / {c['dynamo']['e2e']:.1f}"
    assert cells(text, "| best-static (searched)")[-2] == f"{PAPER_D1['cc']['x']:.2f} / {PAPER_D1['cc']['e2e']:.1f}"
    assert cells(text, "| evolving -adaptation")[-2] == "-"
    at_108 = render_protocol([record("best-static", "3P6D", 5.5, agents=108), record("arrow", "6P3D", 1.0, agents=108)],
                             BEST_SPLIT)  # fmt: skip
    assert cells(at_108, "| best-static (searched)")[-2] == "-" and cells(at_108, "| arrow |")[-2] == "-"


def test_the_per_window_oracle_takes_the_best_split_of_every_window() -> None:
    series = {"2P7D": [9, 10, 3, 1], "6P3D": [2, 4, 8, 9]}
    oracle = window_oracle(series, 600.0, 600.0, 2400.0, 600.0)
    assert oracle.splits() == ["2P7D", "6P3D", "6P3D"]
    assert oracle.throughput == pytest.approx((10 + 8 + 9) / 1800.0)
    static = max(sum(s[1:]) for s in series.values()) / 1800.0
    assert oracle.throughput >= static  # never below the best static split over the same span
    with pytest.raises(ValueError):
        window_oracle(series, 600.0, 300.0, 2400.0)
    recs = [record("best-static", s, 1.0, finished=[100 * c for c in f], workload="shift", agents=0)
            for s, f in series.items()]  # fmt: skip
    for r in recs:
        r["spec"]["period_s"] = 600.0
        r["spec"]["duration_s"] = 600.0
    text = render_protocol(recs, BEST_SPLIT)
    assert "1.50 req/s against 1.17 for the best single split" in text  # (1000+800+900)/1800 vs 6P3D's 2100/1800
    assert "windows 2P7D 6P3D 6P3D" in text
    stationary = [record("best-static", s, 1.0, finished=f) for s, f in series.items()]
    assert "Per-window oracle" not in render_protocol(stationary, BEST_SPLIT)  # only the shift has windows


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=20))
def test_the_interval_holds_the_mean_and_shrinks_to_nothing_for_equal_values(values: list[float]) -> None:
    iv = mean_interval(values)
    assert iv.half is not None and iv.half >= 0 and min(values) - 1e-6 <= iv.mean <= max(values) + 1e-6
    assert mean_interval([values[0]] * len(values)).half == pytest.approx(0.0, abs=1e-6)


def test_three_seeds_give_the_t_interval() -> None:
    iv = mean_interval([1.0, 2.0, 3.0])
    assert iv.mean == 2.0 and iv.half == pytest.approx(4.302653 * 1.0 / 3**0.5, rel=1e-6)
    assert mean_interval([4.0]).half is None and mean_interval([4.0]).text() == "4.00"
    with pytest.raises(ValueError):
        mean_interval([])


def test_a_rate_is_sustained_only_below_every_target_and_with_every_lower_rate() -> None:
    assert sustains({"ttft_p50": 1.0, "ttft_p95": 14.9, "e2e_p50": 9.0})
    assert not sustains({"ttft_p50": 1.0, "ttft_p95": 15.1, "e2e_p50": 9.0})
    assert not sustains({"ttft_p50": 1.0, "ttft_p95": None, "e2e_p50": 9.0})
    assert not sustains({"ttft_p50": 1.0, "ttft_p95": 2.0, "e2e_p50": 9.0}, admitted=0.8)
    assert sustained_rate({0.5: True, 0.75: True, 1.0: False, 1.25: True}) == 0.75
    assert sustained_rate({0.5: False}) is None


def test_the_sweep_table_marks_the_sustained_rates_and_counts_admission() -> None:
    def run(rate: float, p95: float, admitted: float | None) -> dict[str, Any]:
        out = record("evolving", "4P5D", 3.0)
        out["spec"]["arrival_rate"] = rate
        out["metrics"]["overall"]["ttft_s"]["p95"] = p95
        if admitted is not None:
            out["metrics"]["simulation"] = {"admission": {"admitted_fraction": admitted}}
        return out

    # 0.5 met (admission not recorded: not checked), 0.75 to 1.5 met, 2 within the latency targets but 60 %
    # admitted, 3 slow
    met = [run(0.5, 3.0, None), *(run(rate, 14.0, 1.0) for rate in (0.75, 1.0, 1.25, 1.5))]
    table = render_sweep([*met, run(2.0, 10.0, 0.6), run(3.0, 40.0, 1.0)])
    header, _, row = table.splitlines()[:3]
    assert "| 1.5/min |" in header and "| 2/min |" in header and "| 3/min |" in header  # D.3's rates and the rest
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[0] == "evolving" and cells[-1] == "1.5/min"
    assert cells[1] == "**0.5 / 3.0 / 6.0**" and cells[3] == "**0.5 / 14.0 / 6.0**"
    assert "(60% in)" in table and "**0.5 / 10.0" not in table and "**0.5 / 40.0" not in table
    # a rate not run (here 0.75) caps the sustained rate: nothing above it is claimed
    gap = render_sweep([met[0], *met[2:]]).splitlines()[2]
    assert gap.split("|")[-2].strip() == "0.5/min"
    assert render_sweep([run(2.0, 10.0, 1.0)]).splitlines()[2].split("|")[-2].strip() == "-"


def test_the_sweep_shows_the_time_weighted_prefill_nodes_of_each_rate() -> None:
    out = record("evolving", "4P5D", 3.0)
    out["spec"]["arrival_rate"] = 2.0
    # a quarter of the window collocated-warming (not counted), then 4P5D for a quarter and 1P8D for half
    out["metrics"]["split_share"] = {"0P1D+8C": 0.25, "4P5D": 0.25, "1P8D": 0.5, "3P6D": 0.0}
    assert mean_prefill_nodes(out) == pytest.approx((4 * 0.25 + 1 * 0.5) / 0.75)
    table = render_sweep([out])
    assert table.splitlines()[-1] == "| evolving | - | - | - | - | - | 2.0 |"
    out["metrics"]["split_share"] = {"9C": 1.0}
    assert mean_prefill_nodes(out) is None


def test_the_sweep_means_are_per_system_and_rate_over_seeds_and_its_plot_is_written(tmp_path: Any) -> None:
    from evolving_infra.evaluation.plots import plot_sweep
    from evolving_infra.evaluation.protocol import sweep_means

    def run(system: str, rate: float, seed: int, p95: float, admitted: float) -> dict[str, Any]:
        out = record(system, "4P5D", 3.0, seed)
        out["spec"]["arrival_rate"] = rate
        out["metrics"]["overall"]["ttft_s"]["p95"] = p95
        out["metrics"]["simulation"] = {"admission": {"admitted_fraction": admitted}}
        out["metrics"]["split_share"] = {"4P5D": 1.0}
        return out

    recs = [run("evolving", 1.0, 0, 4.0, 1.0), run("evolving", 1.0, 1, 8.0, 0.8), run("best-static", 2.0, 0, 20.0, 1.0),
            record("evolving", "6P3D", 5.0)]  # a closed-loop run: not part of the sweep
    means = sweep_means(recs)
    assert set(means) == {"evolving", "best-static"} and set(means["evolving"]) == {1.0}
    assert means["evolving"][1.0]["ttft_p95"] == pytest.approx(6.0) and means["evolving"][1.0]["admitted"] == pytest.approx(0.9)
    assert means["best-static"][2.0]["prefill"] == pytest.approx(4.0) and means["best-static"][2.0]["ttft_p50"] == 0.5
    paths = plot_sweep(recs, tmp_path, "cc-258")
    assert [p.name for p in paths] == ["cc-258-sweep.png"] and paths[0].stat().st_size > 1000
    assert plot_sweep([record("evolving", "6P3D", 5.0)], tmp_path / "none", "cc-90") == []


def test_render_with_plots_writes_each_groups_figures_and_the_sweep(tmp_path: Any) -> None:
    import json

    from evolving_infra.cli.evaluate import main

    cache = tmp_path / "cache"
    cache.mkdir()
    closed = [record("evolving", "6P3D", 5.0, seed, finished=[1, 2]) for seed in (0, 1)]
    opened = []
    for rate in (1.0, 2.0):
        r = record("best-static", "4P5D", 3.0, finished=[1, 2])
        r["spec"]["arrival_rate"] = rate
        opened.append(r)
    for i, r in enumerate([*closed, *opened]):
        (cache / f"r{i}.json").write_text(json.dumps(r))
    assert main(["render", "--cache", str(cache), "--table", "protocol", "--plots", str(tmp_path / "plots")]) == 0
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "cc-90-w600-d1200-figures.png" in names and "cc-90-r1-w600-d1200-split.png" in names
    assert "cc-90-w600-d1200-sweep.png" in names


def test_the_protocol_matrices_hold_what_the_issue_lists() -> None:
    specs = matrix("protocol", 1800.0, 3600.0, 0)
    assert len(set(specs)) == len(specs) and all(s.warmup_s == 1800.0 and s.duration_s == 3600.0 for s in specs)
    stationary = {(s.workload, s.agents) for s in specs if s.arrival_rate is None and s.period_s is None}
    assert {("cc", 90), ("cc", 108), ("cc", 126), ("putnam", 224), ("osworld", 128)} <= stationary
    for workload, agents in (("cc", 90), ("putnam", 224), ("osworld", 128)):
        searched = {s.split for s in specs if (s.workload, s.agents, s.system) == (workload, agents, "best-static")}
        assert searched == set(all_splits(9))
        systems = {s.label or s.system for s in specs if (s.workload, s.agents) == (workload, agents)}
        assert {"evolving", "dynamo", "arrow", "cache-aware", "cache-aware -pool"} <= systems
    rates = {s.arrival_rate for s in specs if s.arrival_rate}
    assert {0.5, 0.75, 1.0, 1.25, 1.5} <= rates and max(rates) >= 2 * 1.5  # D.3's rates, and on to twice the last
    shift = [s for s in specs if s.period_s is not None]
    assert {s.split for s in shift if s.system == "best-static"} == set(all_splits(9)) and shift[0].profile.startswith("kimi")
    labels = {s.label for s in specs if s.workload == "cc" and s.agents == 126}
    assert {k for k in ABLATIONS if k != "evolving"} <= labels and any(s.system == "thunderagent" for s in specs)
    starts = {s.split for s in matrix("ablations", 1800.0, 3600.0, 0) if s.system == "evolving" and not s.label}
    assert starts == {"3P6D", "4P5D", "5P4D", "6P3D"}  # figure 8a: ours from four initial splits
    assert len({s.key() for s in specs}) == len(specs)  # every run has its own cache file


def test_the_fixed_split_ablations_turn_off_adaptation_and_one_more_component_each() -> None:
    """`ablations-fixed`: every run of ours keeps 4P5D (the planner static) and differs from ours without
    adaptation in at most one other component, each component of section 6.4 once; the run without adaptation is
    the `ablations` matrix's own (one cache file for both), and best static 4P5D stands beside them."""
    fixed = matrix("ablations-fixed", 1800.0, 3600.0, 0)
    ours = [s for s in fixed if s.system == "evolving"]
    assert all(s.split == "4P5D" and s.workload == "cc" and s.agents == 126 for s in fixed)
    assert all(("planner", "static") in s.sim for s in ours)
    others = sorted(tuple(o for o in s.sim if o != ("planner", "static")) for s in ours)
    assert others == sorted(sim for label, sim in ABLATIONS.items() if sim != (("planner", "static"),))
    base = next(s for s in ours if s.sim == (("planner", "static"),))
    assert base.key() in {s.key() for s in matrix("ablations", 1800.0, 3600.0, 0)}
    assert any(s.system == "best-static" for s in fixed) and len({s.key() for s in fixed}) == len(fixed) == 6


def test_an_open_loop_run_goes_through_the_runner_with_its_series() -> None:
    spec = RunSpec("putnam", 8, "best-static", "2P7D", 30.0, 60.0, 0, arrival_rate=6.0)
    rec = run_spec(spec)
    assert rec["metrics"]["config"]["agents"] is None and rec["metrics"]["config"]["max_active"] == 8
    assert rec["series"]["bucket_s"] == 60.0 and sum(rec["series"]["finished"]) > 0
    assert "-r6" in rec["key"] and "open loop" in rec["command"]


def test_an_open_loop_runs_command_reruns_exactly_that_run(capsys: pytest.CaptureFixture[str]) -> None:
    """`simulate` cannot generate open-loop workloads, so their command is the runner's, selecting that one run."""
    import shlex

    from evolving_infra.cli.evaluate import main

    specs = [s for name in ("shift", "open-loop") for s in matrix(name, 30.0, 60.0, seed=2)]
    assert specs and all(s.open_loop for s in specs)
    for spec in specs:
        command = spec.command()
        argv = shlex.split(command.split("  #")[0])
        assert argv[:3] == ["python", "scripts/evaluate.py", "run"] and "open loop" in command
        assert main([*argv[2:], "--dry-run", "--cache", "/nonexistent-cache"]) == 0
        listed = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
        assert listed == [f"to run {spec.key()}"]


def test_the_runner_refuses_rates_that_are_not_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    from evolving_infra.cli.evaluate import main

    assert main(["run", "--matrix", "open-loop", "--rates", "fast", "--dry-run"]) == 2
    assert "--rates takes comma-separated numbers" in capsys.readouterr().err


def test_the_completion_series_counts_each_finished_request_once() -> None:
    class R:
        def __init__(self, issued: float, first: float, finish: float) -> None:
            self.issued, self.first_token, self.finish = issued, first, finish

    s = completion_series([R(0, 1, 5), R(50, 51, 70), R(70, 72, 130), R(10, 11, 999)], 180.0)
    assert s["finished"] == [1, 1, 1] and s["ttft_mean"][0] == pytest.approx(1.0) and s["ttft_mean"][2] is None


def test_the_plots_of_a_group_are_written(tmp_path: Any) -> None:
    from evolving_infra.evaluation.plots import plot_group
    from evolving_infra.evaluation.protocol import seed_groups

    recs = [record("best-static", s, 1.0 + seed, seed, finished=[3, 4, 5]) for s in ("2P7D", "6P3D") for seed in (0, 1)]
    for r in recs:
        r["series"]["bucket_s"] = 60.0
        r["metrics"]["split_timeline"] = [{"at": 0.0, "split": "9C"}, {"at": 600.0, "split": r["spec"]["split"]}]
    (variants,) = seed_groups(recs).values()
    paths = plot_group(variants, tmp_path, "cc-90")
    assert [p.name for p in paths] == ["cc-90-throughput.png", "cc-90-split.png", "cc-90-figures.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_the_bar_chart_shows_the_mean_over_seeds_its_interval_and_the_papers_figure() -> None:
    """Each bar is the mean over the variant's seeds with its 95 % half-width; the paper's mark comes from tables
    C.1/C.3 for ours and Dynamo at that concurrency, from D.1 for the best static split only at SGLang's split and
    the lowest concurrency, and never for a relabelled variant."""
    from evolving_infra.evaluation.plots import bars
    from evolving_infra.evaluation.protocol import seed_groups
    from evolving_infra.evaluation.tables import PAPER_C, PAPER_D1

    recs = [record("evolving", "6P3D", x, seed) for seed, x in enumerate((6.0, 6.4, 6.2))]
    recs += [record("dynamo", "6P3D", 4.0, 0), record("best-static", "4P5D", 5.0, 0),
             record("best-static", "3P6D", 5.1, 0), record("evolving", "4P5D", 5.5, 0, label="evolving -adaptation")]
    recs[0]["metrics"]["overall"]["lost_kv_reuse"] = 0.04  # the others 0.01
    (variants,) = seed_groups(recs).values()
    table = bars(variants)
    ours = table["evolving (6P3D)"]
    iv = mean_interval([6.0, 6.4, 6.2])
    assert ours["x"].seeds == 3 and ours["x"].mean == pytest.approx(iv.mean) and ours["x"].half == pytest.approx(iv.half)
    assert ours["lost"].mean == pytest.approx(100 * (0.04 + 0.01 + 0.01) / 3)  # in percent, like the tables
    assert ours["x"].paper == PAPER_C[("cc", 90)]["evolving"]["x"]
    assert ours["lost"].paper == pytest.approx(100 * PAPER_C[("cc", 90)]["evolving"]["lost"])
    assert ours["ttft_p95"].paper is None  # C.1/C.3 give no P95 TTFT
    assert table["dynamo (6P3D)"]["x"].half is None and table["dynamo (6P3D)"]["x"].paper == 2.48
    assert table["best-static (4P5D)"]["e2e"].paper == PAPER_D1["cc"]["e2e"]  # D.1's split at CC 90
    assert table["best-static (3P6D)"]["x"].paper is None
    assert all(b.paper is None for b in table["evolving -adaptation (4P5D)"].values())
    at_126 = [record("best-static", "4P5D", 5.0, 0, agents=126), record("evolving", "6P3D", 6.0, 0, agents=126)]
    (variants,) = seed_groups(at_126).values()
    table = bars(variants)
    assert table["best-static (4P5D)"]["x"].paper is None  # D.1 is the lowest concurrency only
    assert table["evolving (6P3D)"]["x"].paper == PAPER_C[("cc", 126)]["evolving"]["x"]


def test_a_shift_group_shows_each_periods_rate_and_the_planners_switches() -> None:
    """The shift's three scored periods (after the warmup, `duration_s` each) from the completion series, averaged
    over seeds; the switch path of the lowest seed, whatever the planner's reason format."""
    def shift(system: str, split: str, seed: int, finished: list[int], decisions: list[dict[str, Any]]) -> dict[str, Any]:
        r = record(system, split, 1.0, seed, finished=finished, workload="shift", agents=0)
        r["spec"]["period_s"] = r["spec"]["duration_s"] = 1200.0
        r["metrics"]["planner_switch_decisions"] = decisions
        return r

    ours = [{"at": 1500.0, "outcome": "switch", "reason": "switch 6P3D -> 5P4D: mean gain 1 req/s > ..."},
            {"at": 2100.0, "outcome": "hold", "reason": "hold 5P4D: no candidate qualifies"},
            {"at": 2700.0, "outcome": "switch", "reason": "switch 5P4D -> 7P2D: mean gain 2 req/s > ..."}]
    relaunch = [{"at": 555.0, "outcome": "switch", "reason": "relaunch ['n0'] as decode (6P3D -> 5P4D, 734 s down)"}]
    # buckets of 600 s from 0: the warmup is bucket 0 (600 s), the periods are buckets 1-2, 3-4 and 5-6
    recs = [shift("evolving", "6P3D", 0, [999, 600, 600, 300, 300, 1200, 1200], ours),
            shift("evolving", "6P3D", 1, [999, 1200, 1200, 300, 300, 0, 0], []),
            shift("dynamo", "6P3D", 0, [0, 120, 120, 120, 120, 120, 120], relaunch),
            shift("best-static", "5P4D", 0, [0, 600, 600, 600, 600, 600, 600], [])]
    for r in recs:
        r["spec"]["warmup_s"] = 600.0
    lines = render_protocol(recs, BEST_SPLIT).splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if "each scored period" in line):]
    row = next(line for line in lines if line.startswith("| evolving | 6P3D | "))
    assert row == "| evolving | 6P3D | 1.50 | 0.50 | 1.00 | 5P4D at 1500 s, 7P2D at 2700 s |"
    assert "| dynamo | 6P3D | 0.20 | 0.20 | 0.20 | 5P4D at 555 s |" in lines
    assert "| static 5P4D | 5P4D | 1.00 | 1.00 | 1.00 |  |" in lines
    stationary = [record("evolving", "6P3D", 1.0, finished=[1, 2, 3])]
    assert "each scored period" not in render_protocol(stationary, BEST_SPLIT)


def test_the_ratio_column_compares_with_ours_from_one_initial_split() -> None:
    """A group holding ours from several initial splits (figure 8a) compares with ours from the paper's start,
    not with their mean; without that start, with the split that has the most runs."""
    both = [record("evolving", "6P3D", 6.0), record("evolving", "4P5D", 8.0), record("best-static", "4P5D", 5.0)]
    text = render_protocol(both, BEST_SPLIT)
    assert "ours (from 6P3D) / this (X)" in text
    assert "| best-static (searched) | 4P5D (searched over 1; D.1: 4P5D) | 1 | 5.00 |" in text
    assert text.split("best-static (searched)")[1].splitlines()[0].rstrip().endswith("| 1.20 |")  # 6.0 / 5.0
    alone = render_protocol([both[1], both[2]], BEST_SPLIT)
    assert "ours (from 4P5D) / this (X)" in alone and "| 1.60 |" in alone
