"""`evolving-infra bench sim`: the default split at any size, peak memory, and `--against-dynamo`'s refusals and
its skip without Dynamo's side environment (the figures themselves are never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolving_infra.cli.bench_sim import bench_config, default_split, peak_rss_mib
from evolving_infra.cli.main import main
from evolving_infra.peers.judge import parse_split

from .test_evaluate_runner import bench_args


@pytest.mark.parametrize(("nodes", "split"), [(2, "1P1D"), (9, "4P5D"), (18, "8P10D"), (96, "43P53D")])
def test_default_split_keeps_four_to_five(nodes: int, split: str) -> None:
    assert default_split(nodes) == split
    prefill, decode = parse_split(split)
    assert prefill + decode == nodes


def test_partition_config_builds_with_the_scaled_split() -> None:
    cfg = bench_config(bench_args(nodes=96, agents=3840, split=None))
    assert cfg.nodes == 96 and cfg.agents == 3840 and cfg.split == "43P53D"


def test_peak_rss_is_this_process() -> None:
    assert 10 < peak_rss_mib() < 1024 * 1024


def test_against_dynamo_refuses_a_system_dynamo_cannot_stand_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--against-dynamo", "--system", "best-static"]) != 0
    assert "--against-dynamo compares one of" in capsys.readouterr().err


def test_against_dynamo_skips_with_the_reason_without_dynamo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EVOLVING_INFRA_DYNAMO_PYTHON", str(tmp_path / "no-python"))
    assert main(["bench", "sim", "--against-dynamo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "comparison skipped" in out["against_dynamo"]["skipped"]
    assert "no ai-dynamo side environment" in out["against_dynamo"]["skipped"]


def test_machine_reference_is_printed_with_its_shape(capsys: pytest.CaptureFixture[str]) -> None:
    from evolving_infra.cli.bench_machine import machine_reference

    ref = machine_reference(repeats=2, loop=1_000)
    assert ref["reference_mops_per_cpu_s"] > 0 and ref["reference_loop"] == 1_000 and ref["repeats"] == 2
    with pytest.raises(ValueError, match="must be >= 1"):
        machine_reference(repeats=0)
    assert main(["bench", "machine", "--repeats", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["machine"]
    assert printed["reference_mops_per_cpu_s"] > 0 and printed["repeats"] == 1 and printed["python"]
    assert main(["bench", "machine", "--repeats", "0"]) != 0
    assert "--repeats must be >= 1" in capsys.readouterr().err
