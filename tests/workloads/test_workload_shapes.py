"""Each kind's documented shape holds on a few hundred agents (the figures are reported in docs/workloads.md)."""

from __future__ import annotations

import pytest

from evolving_infra.traces.stats import Counts, TraceStats
from evolving_infra.workloads import Shape, Wait, shapes


def shape(generated: dict[str, list[dict[str, object]]], kind: str, label: str | None = None) -> Shape:
    return shapes(generated[kind])[label or kind]


def test_putnam_is_decode_heavy_with_ten_second_pauses(generated: dict[str, list[dict[str, object]]]) -> None:
    s = shape(generated, "putnam")
    assert s.mean_output > 5 * s.mean_new
    assert s.mean_output > 1_200, "calibrated against table D.1 (docs/workloads.md)"
    assert 9.0 <= s.mean_pause_s <= 11.0
    assert s.branches == s.agents and s.rewrites == 0 and s.subagents == s.forks == 0
    assert s.requests_per_agent < 30


def test_osworld_is_prefill_heavy_with_one_second_pauses(generated: dict[str, list[dict[str, object]]]) -> None:
    s = shape(generated, "osworld")
    assert s.mean_new > 5 * s.mean_output
    assert s.mean_new > 2_000
    assert 1.0 <= s.mean_pause_s <= 1.4
    assert s.subagents > 0, "OSWorld is multi-agent"
    # calibrated (docs/workloads.md): ~48K-token prompts sit between C.1's h* and D.1's 91 % decode reservation
    assert 40_000 <= s.mean_prompt <= 56_000
    assert 2_500 <= s.mean_new <= 4_000, "one ~2.7K-token screenshot per step"


def test_cc_manages_context(generated: dict[str, list[dict[str, object]]]) -> None:
    s = shape(generated, "cc")
    assert s.subagents > 0 and s.forks > 0 and s.rewrites > 0
    assert 12.5 <= s.mean_pause_s <= 19.0, "table C.3: a mean pause of 12.9-18.6 s between CC requests"
    assert 650 <= s.mean_output <= 950, "calibrated against table D.1 (docs/workloads.md)"
    assert s.mean_prompt > 100_000, "table D.4: long prompts (~150K tokens in the scored window)"
    n, wait, reuse = s.wait(Wait.REWRITE)
    assert n > 0 and 0.10 <= reuse <= 0.20, "figure 2c: ~14 % reuse after a compaction"
    assert 8.0 <= wait <= 16.0
    n, _, reuse = s.wait(Wait.JOIN)
    assert n > 0 and reuse >= 0.95, "figure 2c: ~98 % reuse after a sub-agent call"
    assert s.max_context <= 200_000


def test_steps_per_task_order(generated: dict[str, list[dict[str, object]]]) -> None:
    putnam, cc, osworld = (shape(generated, k) for k in ("putnam", "cc", "osworld"))
    assert putnam.requests_per_agent < osworld.requests_per_agent < cc.requests_per_agent


@pytest.mark.parametrize(
    ("kind", "low", "high"),
    [("putnam", 0.975, 0.995), ("cc", 0.96, 0.985), ("osworld", 0.92, 0.96)],
)
def test_ideal_hit_rates_in_documented_bands(
    kind: str, low: float, high: float, generated: dict[str, list[dict[str, object]]], stats: dict[str, TraceStats]
) -> None:
    token_level = shape(generated, kind).ideal_hit_rate
    paged = stats[kind].ideal_hit_rate
    assert low <= token_level <= high
    assert low - 0.01 <= paged <= high
    assert paged <= token_level + 1e-9, "only full pages are shared"


def test_trace_stats_reproduce_each_documented_shape(stats: dict[str, TraceStats]) -> None:
    def uncached(c: Counts) -> float:
        return c.mean_prompt_tokens * (1 - c.ideal_hit_rate)

    putnam, cc, osworld = stats["putnam"], stats["cc"], stats["osworld"]
    assert putnam.mean_output_tokens > 5 * uncached(putnam), "putnam is decode-heavy"
    assert putnam.forks == putnam.sub_agents == putnam.compactions == 0 and putnam.branches == putnam.agents
    assert 8.5 <= putnam.mean_delay_s <= 11.0
    assert uncached(osworld) > 5 * osworld.mean_output_tokens, "osworld is prefill-heavy"
    assert osworld.sub_agents > 0 and 0.9 <= osworld.mean_delay_s <= 1.4
    assert cc.forks > 0 and cc.sub_agents > 0 and cc.compactions > 0
    assert 12.0 <= cc.mean_delay_s <= 19.0
    for kind in ("mixed", "shift"):
        by = stats[kind].by_workload
        assert set(by) == {"putnam", "osworld"}
        assert by["putnam"].mean_output_tokens > 5 * uncached(by["putnam"])
        assert uncached(by["osworld"]) > 5 * by["osworld"].mean_output_tokens


def test_mixed_holds_the_ratio_in_file_order(generated: dict[str, list[dict[str, object]]]) -> None:
    labels = [str(r["workload"]) for r in generated["mixed"] if r["kind"] == "agent"]
    assert labels.count("putnam") == 200 and labels.count("osworld") == 100
    for i in range(1, len(labels) + 1):
        assert abs(labels[:i].count("putnam") - 2 * i / 3) <= 1
    mixed = shapes(generated["mixed"])
    assert mixed["putnam"].mean_output > mixed["osworld"].mean_output
    assert mixed["osworld"].mean_new > mixed["putnam"].mean_new


def test_shift_periods_are_in_order(generated: dict[str, list[dict[str, object]]]) -> None:
    records = generated["shift"]
    header = records[0]
    periods = header["periods"]
    assert isinstance(periods, list) and [p["name"] for p in periods] == ["putnam", "mixed", "osworld"]
    agents = [r for r in records if r["kind"] == "agent"]
    assert sum(sum(p["agents"].values()) for p in periods) == len(agents) == 600
    at = 0
    for p in periods:
        block = agents[at : at + sum(p["agents"].values())]
        at += len(block)
        assert block[0]["agent"] == p["first_agent"] and block[-1]["agent"] == p["last_agent"]
        assert all(p["start_s"] <= a["start_s"] < p["end_s"] for a in block)
        counts = {label: sum(1 for a in block if a["workload"] == label) for label in ("putnam", "osworld")}
        assert {k: v for k, v in counts.items() if v} == p["agents"]
        assert set(p["agents"]) == set(p["concurrency"])
    starts = [a["start_s"] for a in agents]
    assert starts == sorted(starts)
    assert periods[0]["end_s"] == 5_400 and periods[-1]["end_s"] == 12_600
    mid = periods[1]["agents"]
    assert mid["putnam"] > mid["osworld"]
    assert "closed-loop" in str(header["notes"]).lower()


def test_fleet_cc_keeps_table_d4s_prefill_load_per_request(generated: dict[str, list[dict[str, object]]]) -> None:
    """The fleet's short CC tasks resume long sessions: per request they carry the cc kind's prefill load (table
    D.4: ~150K-token prompts, 7,660 uncached tokens at a 94.9 % hit rate), not the ~2.3K of 30-step tasks that start
    from a fresh 30K-token prompt and never compact; codex stays the decode-heavier workload."""
    fleet, cc_kind = shapes(generated["fleet"]), shape(generated, "cc")
    cc, codex = fleet["cc"], fleet["codex"]
    assert cc.requests_per_agent < cc_kind.requests_per_agent / 2, "short tasks, so agents turn over in the span"
    assert 120_000 <= cc.mean_prompt <= 170_000, "table D.4: ~150K-token prompts"
    assert 0.9 * cc_kind.mean_new <= cc.mean_new <= 7_660, "at least the cc kind's load; at most D.4's uncached"
    assert 0.95 <= cc.ideal_hit_rate <= 0.98
    assert cc.mean_new > 2.5 * codex.mean_new and codex.mean_output > 2.5 * cc.mean_output
