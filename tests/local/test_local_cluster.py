"""`evolving-infra local` as a real process tree: the tiny preset runs to completion and its report matches the
trace; Ctrl-C (SIGINT to the driver) leaves no child process behind; a node agent that cannot start gives an
error naming it. Every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolving_infra.local.agents import ClientSettings
from evolving_infra.local.cluster import ClusterSpec
from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.local.run import LocalRunConfig, LocalRunError, run_local
from evolving_infra.sim.replay import ReplayMode

LOCAL = [sys.executable, "-P", "-m", "evolving_infra", "local", "--quiet"]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(x) for x in out.split()]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_tiny_preset_runs_to_completion_and_the_report_matches_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run(LOCAL + ["--preset", "tiny", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    trace = PRESETS[PresetName.TINY].trace(0)
    assert report["outcome"] == "completed"
    assert report["run"]["issued"] == report["run"]["finished"] == report["run"]["trace_requests"] == len(trace.requests)
    assert report["run"]["failed"] == 0
    assert report["tokens"]["prompt"] == sum(r.prompt_tokens for r in trace.requests)
    assert report["tokens"]["output"] == sum(r.output_tokens for r in trace.requests)
    assert 0 <= report["tokens"]["cached"] <= report["tokens"]["prompt"]
    assert report["kv"]["hit_rate"] <= report["kv"]["ideal_hit_rate"] + 1e-9
    assert report["run"]["branches_finished"] == len(trace.branches)
    assert all(code == 0 for code in report["run"]["exit_codes"].values()), report["run"]["exit_codes"]
    for name in ("report.md", "requests.jsonl", "split_over_time.png", "latency_cdf.png", "kv_lost.png"):
        assert (out / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == len(trace.requests)
    assert all(r["prefill_node"] and r["decode_node"] for r in records)  # named by the router's usage extension


def test_sigint_shuts_the_cluster_down_with_no_child_left(tmp_path: Path) -> None:
    work = tmp_path / "work"
    argv = LOCAL + ["--preset", "shift", "--duration", "60", "--out", str(tmp_path / "out"), "--work-dir", str(work)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not ((work / "router.stdout").exists() and (work / "router.stdout").read_text().endswith("\n")):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the router never reported ready"
            children.update(_children(proc.pid))
            time.sleep(0.1)
        time.sleep(2.0)  # requests are in flight
        children.update(_children(proc.pid))
        assert len(children) == 5, children  # four node agents and the router
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == 130
    assert all(_gone(pid) for pid in children), [pid for pid in children if not _gone(pid)]
    assert (tmp_path / "out" / "report.json").exists()


def test_a_node_agent_that_fails_to_start_is_named_with_its_error(tmp_path: Path) -> None:
    spec = ClusterSpec(nodes=2, prefill=1, node_settings={"n1": {"page_bytes": 1}}, start_timeout_s=60)
    config = LocalRunConfig(cluster=spec, mode=ReplayMode.closed_loop(1), client=ClientSettings(), workdir=tmp_path)
    with pytest.raises(LocalRunError, match=r"(?s)node-agent n1: exited with status 2.*page_bytes") as info:
        run_local(config, PRESETS[PresetName.TINY].trace(0))
    assert "last lines of" in str(info.value)
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    leftovers = [p for p in pids if not _gone(p) and str(tmp_path) in _cmdline(p)]
    assert leftovers == []
