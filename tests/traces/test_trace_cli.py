"""`evolving-infra trace validate | stats | import mooncake`: exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolving_infra.cli.main import main

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "sample-agents.jsonl"


def test_validate_ok_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "validate", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {SAMPLE}: 57 requests, 8 agents")
    assert out.count("\n") == 1


def test_validate_broken_file_names_file_line_and_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.jsonl"
    lines = SAMPLE.read_text().splitlines()
    lines.insert(10, json.dumps({"kind": "request", "id": "x", "agent": "nobody", "branch": "b",
                                 "input": {"new": 1}, "output_tokens": 1}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    assert main(["trace", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:11: [undefined-agent] ")
    assert "nobody" in err


def test_validate_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "validate", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_stats_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(SAMPLE)]) == 0
    table = capsys.readouterr().out
    for word in ("ideal KV hit rate h*", "cc", "putnam", "osworld", "sub-agent", "compaction"):
        assert word in table
    assert main(["trace", "stats", str(SAMPLE), "--json", "--page-tokens", "16"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["page_tokens"] == 16 and data["requests"] == 57 and captured.err == ""
    assert 0 < data["ideal_hit_rate"] < 1 and set(data["by_workload"]) == {"cc", "putnam", "osworld"}


def test_stats_check_pages_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(SAMPLE), "--check-pages", "--page-tokens", "32"]) == 0
    assert "page check: the content model's page hashes agree" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-64", "abc", "1.5"])
def test_bad_page_tokens_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(SAMPLE), f"--page-tokens={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --page-tokens must be a positive integer") and repr(value) in err


def test_stats_on_broken_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('{"kind": "header", "version": 3}\n')
    assert main(["trace", "stats", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"{path}:1: [unsupported-version]" in captured.err


def test_import_mooncake_writes_a_valid_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "mc.jsonl"
    src.write_text(
        "\n".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": ids})
            for t, n, o, ids in [(0, 1100, 10, [0, 1, 2]), (50, 1600, 20, [0, 1, 3, 4]), (90, 700, 5, [0, 9])]
        )
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    assert main(["trace", "import", "mooncake", str(src), str(out), "--workload", "chat"]) == 0
    assert "OK " in capsys.readouterr().out
    assert main(["trace", "stats", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 3 and list(data["by_workload"]) == ["chat"]
    assert main(["trace", "import", "mooncake", str(src), str(tmp_path / "o2.jsonl.gz"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 3


def test_import_mooncake_bad_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "mc.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}\n')
    assert main(["trace", "import", "mooncake", str(src), str(tmp_path / "o.jsonl")]) == 2
    assert f"error: {src}:1: " in capsys.readouterr().err
    assert main(["trace", "import", "mooncake", str(tmp_path / "none.jsonl"), str(tmp_path / "o.jsonl")]) == 2


def test_import_help_lists_every_assumption(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["trace", "import", "mooncake", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "assumptions:" in out
    for phrase in ("512 tokens", "delay_s", "prefix record", "forks a new branch", "raised to 1"):
        assert phrase in out
