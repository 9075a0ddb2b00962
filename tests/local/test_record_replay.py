"""`evolving-infra local --record DIR`: the router's recording of a real local run validates, holds what was
served (the lengths and pauses of the replayed trace), and its simulator replay is compared with the live run
(`fidelity.json`): the KV hit rate within the 10 % bound; mean TTFT and E2E are reported, and miss it (see
docs/traces.md), which the strict xfail below records."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.traces.loader import load_trace

LOCAL = [sys.executable, "-P", "-m", "evolving_infra", "local", "--quiet"]


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    base = tmp_path_factory.mktemp("record")
    record, out = base / "rec", base / "out"
    done = subprocess.run(LOCAL + ["--preset", "tiny", "--speed-up", "1", "--record", str(record), "--out", str(out)],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    fidelity = json.loads((record / "fidelity.json").read_text())
    return record, report, fidelity


def test_the_recording_validates_and_holds_what_was_served(recorded_run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    record, report, _ = recorded_run
    trace = load_trace(record / "trace.jsonl")
    original = PRESETS[PresetName.TINY].trace(0)
    assert len(trace.requests) == report["run"]["finished"] == len(original.requests)
    assert Counter(r.prompt_tokens for r in trace.requests) == Counter(r.prompt_tokens for r in original.requests)
    assert Counter(r.output_tokens for r in trace.requests) == Counter(r.output_tokens for r in original.requests)
    assert len(trace.agents) == len(original.agents)
    # Pauses: each recorded pause is one of the trace's (the client waits delay_s / speed-up after the answer).
    wanted = sorted(r.delay_s for r in original.requests if r.after)
    got = sorted(r.delay_s for r in trace.requests if r.after)
    assert got == pytest.approx(wanted, abs=0.15)
    assert "recorded_ttft_s" in (record / "trace.jsonl").read_text()
    models = json.loads((record / "models.json").read_text())
    assert models["kind"] == "evolving-infra-node-models" and models["nodes"] == {}  # no warmup: profile models


def test_the_replay_reproduces_the_kv_hit_rate(recorded_run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    _, report, fidelity = recorded_run
    hit = next(f for f in fidelity["figures"] if f["name"] == "KV hit rate")
    assert hit["live"] == report["kv"]["hit_rate"] and hit["relative_error"] <= fidelity["bound"] == 0.10
    assert fidelity["replay_command"].startswith("evolving-infra simulate ")


@pytest.mark.xfail(strict=True, reason="the simulator leaves out the live path's per-request overheads (HTTP, "
                   "gRPC, the router's event loop): on the tiny preset at speed-up 1 the replay's mean TTFT is about "
                   "half the live one and its mean E2E about a quarter lower (docs/traces.md)")  # fmt: skip
def test_the_replay_reproduces_mean_ttft_and_e2e(recorded_run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    _, _, fidelity = recorded_run
    for figure in fidelity["figures"]:
        assert figure["relative_error"] <= fidelity["bound"], figure
