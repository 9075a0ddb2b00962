"""`evolving-infra trace import mini-swe-agent | claude-code | openai-log` and `trace scale | merge | slice`:
exit codes, reports and errors naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolving_infra.cli.main import main
from evolving_infra.traces.loader import load_trace

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "sample-agents.jsonl"


def test_import_claude_code_report_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cc.jsonl.gz"
    assert main(["trace", "import", "claude-code", str(FIXTURES / "claude-code" / "project"), str(out), "--report"]) == 0
    text = capsys.readouterr().out
    for row in ("sub agents", "compactions", "model switches", "missing sidechains", "clamped delays"):
        assert row in text
    assert f"OK {out}: 6 requests, 1 agents, 2 branches" in text.replace("\n", " ")
    assert main(["trace", "import", "openai-log", str(FIXTURES / "openai-log" / "proxy.jsonl"), str(out), "--json",
                 "--workload", "proxy"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "openai-log" and report["skipped_calls"] == 1
    assert {a.workload for a in load_trace(out).agents.values()} == {"proxy"}


def test_import_errors_name_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"request": {"messages": [{"role": "user"}]}, "response": {"usage": {"prompt_tokens": 3}}}\n{oops\n')
    assert main(["trace", "import", "openai-log", str(log), str(tmp_path / "o.jsonl")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {log}:2: not valid JSON")
    assert main(["trace", "import", "mini-swe-agent", str(tmp_path / "none"), str(tmp_path / "o.jsonl")]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot convert {tmp_path / 'none'}")


def test_scale_merge_slice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scaled, merged, sliced = tmp_path / "s.jsonl", tmp_path / "m.jsonl", tmp_path / "x.jsonl"
    assert main(["trace", "scale", str(SAMPLE), str(scaled), "--copies", "3", "--stagger", "10"]) == 0
    assert "171 requests, 24 agents (3 copies)" in capsys.readouterr().out
    assert main(["trace", "merge", str(merged), f"{scaled}=coding", str(SAMPLE)]) == 0
    assert "workloads cc, coding, osworld, putnam" in capsys.readouterr().out
    assert main(["trace", "slice", str(merged), str(sliced), "--agents", "0:5"]) == 0
    assert len(load_trace(sliced).agents) == 5
    capsys.readouterr()
    assert main(["trace", "slice", str(merged), str(sliced), "--agents", "five"]) == 2
    assert "--agents must be LO:HI" in capsys.readouterr().err
    assert main(["trace", "scale", str(SAMPLE), str(scaled), "--copies", "0"]) == 2
    assert "--copies must be >= 1" in capsys.readouterr().err
