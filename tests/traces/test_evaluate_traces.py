"""The evaluation runner replays trace files (imported, scaled, merged, recorded) wherever it runs a generator."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evolving_infra.cli.evaluate import main, run_spec, trace_runs
from evolving_infra.evaluation.tables import render_evaluation

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "sample-agents.jsonl"
PROFILE = "glm-5.2-4xgb300-tp4"


def test_trace_runs_are_keyed_by_content_and_replay_the_file(tmp_path: Path) -> None:
    copy = tmp_path / "mine.jsonl"
    shutil.copy(SAMPLE, copy)
    specs = trace_runs([str(copy)], profile=PROFILE, split="4P5D", agents=4, warmup_s=60, duration_s=120,
                       systems=["best-static"])
    assert [s.workload for s in specs] == ["mine"] and specs[0].profile == PROFILE
    assert f"simulate {copy} --agents 4 --system best-static" in specs[0].command()
    copy.write_text(SAMPLE.read_text().replace('"output_tokens": 1', '"output_tokens": 2', 1))
    changed = trace_runs([str(copy)], profile=PROFILE, split="4P5D", agents=4, warmup_s=60, duration_s=120,
                         systems=["best-static"])
    assert changed[0].key() != specs[0].key(), "another trace content is another run"
    record = run_spec(specs[0])
    assert record["trace_agents"] == 8 and record["metrics"]["overall"]["requests"] > 0
    assert "### mine, 4 agents, from 4P5D" in render_evaluation([record])


def test_trace_runs_need_profile_split_and_agents(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--trace", str(SAMPLE), "--split", "4P5D", "--agents", "4"]) == 2
    assert "--trace needs --profile" in capsys.readouterr().err
    assert main(["run", "--trace", "/nonexistent.jsonl", "--profile", PROFILE, "--split", "4P5D", "--agents", "4"]) == 2
    assert "cannot read /nonexistent.jsonl" in capsys.readouterr().err
