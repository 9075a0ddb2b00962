"""`bench sim --workload-only`: the streamed workload generates and hashes only what the first event needs, the
eager one the whole trace; the run itself reports what it generated and hashed (figures other than counts are
never asserted)."""

from __future__ import annotations

import json

import pytest

from evolving_infra.cli.main import main


def test_workload_only_streamed_against_eager(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--workload-only", "--workload", "putnam", "--agents", "3", "--json"]) == 0
    lazy = json.loads(capsys.readouterr().out)
    assert main(["bench", "sim", "--workload-only", "--eager", "--workload", "putnam", "--agents", "3", "--json"]) == 0
    eager = json.loads(capsys.readouterr().out)
    assert lazy["trace_agents"] == eager["trace_agents"] == 6
    assert lazy["agents_generated"] == 3 and eager["agents_generated"] == 6
    assert lazy["requests_issued_at_0"] == eager["requests_issued_at_0"] == 3
    assert lazy["requests_hashed"] == 3 and eager["requests_hashed"] == eager["requests_loaded"]
    assert lazy["requests_loaded"] < eager["requests_loaded"]


def test_eager_goes_with_workload_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--eager"]) != 0
    assert "--eager goes with --workload-only" in capsys.readouterr().err


def test_a_short_run_reports_what_it_generated(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "sim", "--workload", "putnam", "--agents", "2", "--nodes", "2", "--duration", "20", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["agents_generated"] <= 4 and out["requests_hashed"] >= out["requests"]
    assert out["cpu_s"] > 0
