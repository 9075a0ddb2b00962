"""`evolving-infra workload generate|kinds`: a summary line, loadable output, exit 2 on bad arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolving_infra.cli.main import main
from evolving_infra.traces.loader import load_trace
from evolving_infra.workloads import KINDS, default_params, describe


def test_generate_writes_a_trace_and_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cc.jsonl.gz"
    assert main(["workload", "generate", "--kind", "cc", "--agents", "4", "--seed", "2", "--shape", str(out)]) == 0
    text = capsys.readouterr().out
    trace = load_trace(out)
    assert f"wrote {out}: kind cc, seed 2, 4 agents (cc 4), {len(trace.branches)} branches, " in text
    assert f"{len(trace.requests)} requests" in text
    assert "ideal token reuse" in text


def test_generate_prints_the_closed_loop_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cc.jsonl"
    args = ["workload", "generate", "--kind", "cc", "--agents", "6", "--closed-loop", "3", "--window", "60:600", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "closed loop, requests issued in [60, 600) s at fixed latencies: " in text
    assert "3 agents started" in text and "busy branches" in text and "uncached tokens per request" in text


def test_generate_applies_overrides(tmp_path: Path) -> None:
    out = tmp_path / "p.jsonl"
    args = ["workload", "generate", "--kind", "putnam", "--agents", "3", "--set", "steps.mean=2", "--set",
            "steps.sigma=0", str(out)]  # fmt: skip
    assert main(args) == 0
    trace = load_trace(out)
    assert len(trace.requests) == 6


def test_kinds_lists_every_parameter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "kinds", "--sources"]) == 0
    text = capsys.readouterr().out
    for name in KINDS:
        assert f"\n{name}: " in f"\n{text}"
        for path, _, source in describe(default_params(name)):
            assert f"  {path} = " in text
            assert source in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "cc", "--agents", "0"], "--agents must be >= 1"),
        (["--kind", "cc", "--agents", "2", "--set", "nope=1"], "no parameter 'nope'"),
        (["--kind", "cc", "--agents", "2", "--set", "fork_prob"], "expected PATH=VALUE"),
        (["--kind", "shift", "--agents", "2"], "at least 4 agents"),
        (["--kind", "cc", "--agents", "2", "--closed-loop", "0"], "need N >= 1"),
        (["--kind", "cc", "--agents", "2", "--closed-loop", "2", "--window", "60:30"], "0 <= START < END"),
        (["--kind", "cc", "--agents", "2", "--closed-loop", "2", "--window", "1:x"], "expected START:END"),
    ],
)
def test_bad_arguments_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.jsonl"
    assert main(["workload", "generate", *args, str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_bad_output_paths_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "generate", "--kind", "cc", "--agents", "1", str(tmp_path / "x.json")]) == 2
    assert "must end in .jsonl or .jsonl.gz" in capsys.readouterr().err
    missing = tmp_path / "no" / "x.jsonl"
    assert main(["workload", "generate", "--kind", "cc", "--agents", "1", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unknown_kind_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["workload", "generate", "--kind", "chat", "--agents", "1", str(tmp_path / "x.jsonl")])
    assert info.value.code == 2
