"""`evolving-infra local --against smg`: the extra runs' configurations, the comparison of the three reports and
its table are tested without the peer; the argument checks run before any process starts. One short live run
(loopback only, bounded in time) needs `smg` and skips with the reason otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.cli.main import main
from evolving_infra.local.against import FIGURES, Peer, SideKey, compare, comparison_markdown, peer_sides
from evolving_infra.local.agents import ClientSettings
from evolving_infra.local.cluster import ClusterSpec, Gateway
from evolving_infra.local.run import LocalRunConfig
from evolving_infra.local.smg import SmgUnavailable, find_smg
from evolving_infra.sim.replay import ReplayMode

try:
    find_smg()
    REASON = None
except SmgUnavailable as exc:
    REASON = f"optional peer smg unavailable: {exc}"


def _config(**cluster: Any) -> LocalRunConfig:
    spec = ClusterSpec(**{"nodes": 4, "prefill": 1, "warmup_s": 20.0, "seed": 3, "noise": 0.02, **cluster})
    return LocalRunConfig(cluster=spec, mode=ReplayMode.closed_loop(4), client=ClientSettings(speed_up=spec.speed_up),
                          duration_s=30.0, workdir=Path("/tmp/w"))  # fmt: skip


def test_the_peer_and_the_baseline_run_at_one_static_split_with_everything_else_shared() -> None:
    config = _config(routing_settings={"slack": 1})
    baseline, smg = peer_sides(config, Peer.SMG, prefill=2)
    assert (baseline.key, smg.key) == (SideKey.BASELINE, SideKey.SMG)
    for side in (baseline, smg):
        c = side.config.cluster
        assert (c.prefill, c.planner, c.routing, c.warmup_s, c.record_dir) == (2, "static", "cache-aware", 0.0, None)
        assert (c.nodes, c.seed, c.noise, c.speed_up) == (4, 3, 0.02, config.cluster.speed_up)
        assert c.routing_settings == {}  # the run's own policy settings are not the baseline's
        assert side.config.mode == config.mode and side.config.duration_s == config.duration_s
        assert side.config.workdir is not None and side.config.workdir.parent == Path("/tmp/w")
    assert baseline.config.cluster.gateway is Gateway.OURS and smg.config.cluster.gateway is Gateway.SMG
    assert smg.config.client.text_prompts and not smg.config.client.finish_branches and smg.config.client.model
    assert not baseline.config.client.text_prompts and baseline.config.client.finish_branches
    assert baseline.config.workdir != smg.config.workdir
    # default: the run's initial split; a run that already is the baseline gets only the peer
    assert [s.config.cluster.prefill for s in peer_sides(config, Peer.SMG)] == [1, 1]
    already = _config(planner="static", routing="cache-aware", warmup_s=0.0)
    assert [s.key for s in peer_sides(already, Peer.SMG)] == [SideKey.SMG]
    with pytest.raises(ValueError, match="1..3 prefill nodes of 4"):
        peer_sides(config, Peer.SMG, prefill=4)


def _report(ttft: float, finished: int = 10, hit: float | None = 0.5) -> dict[str, Any]:
    return {"run": {"finished": finished, "failed": 0}, "throughput": {"requests_per_s": 1.0},
            "latency_s": {"ttft": {"mean": ttft, "p50": ttft, "p95": 2 * ttft}, "e2e": {"mean": 1.0, "p95": 2.0}},
            "kv": {"hit_rate": hit}}  # fmt: skip


@given(ours=st.floats(0.01, 10), smg=st.floats(0.01, 10), tolerance=st.floats(0.01, 0.5))
def test_differences_are_relative_to_the_real_peer_and_flagged_above_the_tolerance(
    ours: float, smg: float, tolerance: float,
) -> None:  # fmt: skip
    reports = {SideKey.OURS: _report(ours), SideKey.SMG: _report(smg)}
    c = compare(reports, {SideKey.OURS: "o", SideKey.SMG: "s"}, tolerance=tolerance)
    assert c["sides"] == ["ours", "smg (real)"] and [r["figure"] for r in c["rows"]] == [n for n, _ in FIGURES]
    row = next(r for r in c["rows"] if r["figure"] == "TTFT mean (s)")
    assert row["values"] == {"ours": ours, "smg (real)": smg}
    assert row["differences"]["ours"] == pytest.approx((ours - smg) / smg)
    assert "smg (real)" not in row["differences"]
    assert (["TTFT mean (s)", "ours"] in c["flagged"]) == (abs(ours - smg) / smg > tolerance)
    assert ["E2E mean (s)", "ours"] not in c["flagged"]  # equal figures


def test_missing_figures_and_a_zero_reference_give_no_difference() -> None:
    reports = {SideKey.OURS: _report(1.0, hit=None), SideKey.BASELINE: _report(1.0), SideKey.SMG: _report(1.0, finished=0)}
    c = compare(reports, {k: k.value for k in reports})
    rows = {r["figure"]: r for r in c["rows"]}
    assert rows["KV hit rate"]["values"]["ours"] is None and rows["KV hit rate"]["differences"]["ours"] is None
    assert rows["requests failed"]["differences"] == {"ours": None, "cache-aware (ours)": None}  # 0 failed at the peer
    assert rows["requests finished"]["differences"]["ours"] is None
    with pytest.raises(ValueError, match="no smg"):
        compare({SideKey.OURS: _report(1.0)}, {SideKey.OURS: "o"})


def test_the_report_shows_the_comparison_beside_the_run() -> None:
    reports = {SideKey.OURS: _report(0.5), SideKey.BASELINE: _report(0.8), SideKey.SMG: _report(0.4)}
    c = compare(reports, {SideKey.OURS: "our run", SideKey.BASELINE: "our baseline", SideKey.SMG: "the gateway"})
    lines = comparison_markdown(c)
    table = "\n".join(lines)
    assert "| figure | ours | cache-aware (ours) | smg (real) |" in table
    assert "| TTFT mean (s) | 0.500 (**+25%**) | 0.800 (**+100%**) | 0.400 |" in table
    assert "| requests finished | 10 (+0%) | 10 (+0%) | 10 |" in table
    assert "- **smg (real)**: the gateway" in table
    assert comparison_markdown(json.loads(json.dumps(c))) == lines  # survives report.json


def test_against_arguments_are_checked_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    out = tmp_path / "out"
    assert main(["local", "--quiet", "--preset", "tiny", "--against-split", "1P2D", "--out", str(out)]) == 2
    assert "--against-split needs --against" in capsys.readouterr().err
    assert main(["local", "--quiet", "--preset", "tiny", "--against", "smg", "--against-split", "3P1D", "--out", str(out)]) == 2
    assert "--against-split" in capsys.readouterr().err
    assert main(["local", "--quiet", "--preset", "tiny", "--against", "smg", "--gateway", "smg", "--out", str(out)]) == 2
    assert "drop --gateway" in capsys.readouterr().err
    monkeypatch.setenv("EVOLVING_INFRA_SMG", str(tmp_path / "no-smg"))
    assert main(["local", "--quiet", "--preset", "tiny", "--against", "smg", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "--against smg" in err and "setup-smg.sh" in err
    assert not out.exists()  # refused before the first run, nothing half-written


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_tiny_run_against_the_real_gateway_reports_all_three(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-P", "-m", "evolving_infra", "local", "--quiet", "--preset", "tiny",
                           "--against", "smg", "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    against = report["against"]
    assert against["sides"] == ["ours", "cache-aware (ours)", "smg (real)"] and against["reference"] == "smg (real)"
    finished = next(r for r in against["rows"] if r["figure"] == "requests finished")["values"]
    assert finished == {"ours": 13, "cache-aware (ours)": 13, "smg (real)": 13}  # the tiny preset's 13 requests, each side
    for side in ("baseline", "smg"):
        side_report = json.loads((out / "against-smg" / side / "report.json").read_text())
        assert side_report["config"]["split"] == "1P2D" and side_report["config"]["cluster"]["planner"] == "static"
    assert json.loads((out / "against-smg" / "smg" / "report.json").read_text())["config"]["cluster"]["gateway"] == "smg"
    assert "## Ours vs the real peer, live" in (out / "report.md").read_text()
    assert "ours vs the real peer" in done.stdout
