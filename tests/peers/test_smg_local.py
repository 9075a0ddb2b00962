"""`evolving-infra local --gateway smg`: the local cluster with SGLang's gateway (`smg`, scripts/peers/setup-smg.sh)
in front of node agents that speak SGLang's worker API. The gateway's command line, the settings checks, the
reuse hand-over and the refusal without `smg` are tested without it; one short live run (loopback only, bounded
in time) needs it and skips with the reason otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.cli.main import main
from evolving_infra.local.cluster import ClusterSpec, Gateway
from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.local.smg import GatewaySpec, ReuseBook, SmgUnavailable, find_smg, gateway_command

try:
    find_smg()
    REASON = None
except SmgUnavailable as exc:
    REASON = f"optional peer smg unavailable: {exc}"

LOCAL = [sys.executable, "-P", "-m", "evolving_infra", "local", "--quiet"]


def test_the_gateway_runs_pd_cache_aware_on_loopback_with_the_documented_rule() -> None:
    spec = GatewaySpec("/x/smg", (("http://127.0.0.1:9001", 50051), ("http://127.0.0.1:9002", 50052)),
                       ("http://127.0.0.1:9003",), cache_threshold=0.5)  # fmt: skip
    cmd = gateway_command(spec, 8000, 8001)
    assert cmd[:2] == ["/x/smg", "launch"] and "--pd-disaggregation" in cmd
    assert cmd[cmd.index("--host") + 1] == cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.1"
    flat = " ".join(cmd)
    assert "--prefill http://127.0.0.1:9001 50051 --prefill http://127.0.0.1:9002 50052" in flat
    assert "--decode http://127.0.0.1:9003" in flat and "--prefill-policy cache_aware" in flat
    assert "--cache-threshold 0.5" in flat and "--worker-warmup-secs 0" in flat and "--disable-load-monitoring" in cmd
    assert GatewaySpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(ValueError, match="at least one prefill and one decode"):
        GatewaySpec("/x/smg", (), ("http://127.0.0.1:9003",))


def test_the_gateway_mode_refuses_what_only_our_router_does(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no warmup and no recording"):
        ClusterSpec(nodes=3, prefill=1, gateway=Gateway.SMG, warmup_s=10.0)
    with pytest.raises(ValueError, match="no warmup and no recording"):
        ClusterSpec(nodes=3, prefill=1, gateway=Gateway.SMG, record_dir=tmp_path)
    assert json.dumps({"gateway": Gateway.SMG}) == '{"gateway": "smg"}'


@given(rooms=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10_000)), max_size=200), limit=st.integers(1, 20))
def test_the_reuse_book_answers_the_latest_reuse_of_the_most_recent_rooms(rooms: list[tuple[int, int]], limit: int) -> None:
    book = ReuseBook(limit)
    latest: dict[int, int] = {}
    for room, cached in rooms:
        book.put(room, cached)
        latest.pop(room, None)
        latest[room] = cached
    kept = list(latest.items())[-limit:]
    for room, cached in kept:
        assert book.get(room) == cached
    for room in set(latest) - {r for r, _ in kept}:
        assert book.get(room) is None


def test_without_smg_the_gateway_mode_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("EVOLVING_INFRA_SMG", str(tmp_path / "no-smg"))
    assert main(["local", "--quiet", "--preset", "tiny", "--gateway", "smg", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "--gateway smg" in err and "setup-smg.sh" in err
    assert not (tmp_path / "out").exists()
    assert main(["local", "--quiet", "--preset", "tiny", "--gateway", "smg", "--record", str(tmp_path / "rec")]) != 0
    assert "no recording" in capsys.readouterr().err


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_the_local_cluster_runs_behind_the_real_gateway(tmp_path: Path) -> None:
    """The tiny preset through smg 1.13 in PD mode: every request is served, and the reuse the prefill nodes
    measured reaches the client through the decode leg."""
    out = tmp_path / "out"
    done = subprocess.run(LOCAL + ["--preset", "tiny", "--gateway", "smg", "--speed-up", "4", "--out", str(out),
                                   "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    trace = PRESETS[PresetName.TINY].trace(0)
    assert report["outcome"] == "completed"
    assert report["run"]["finished"] == len(trace.requests) and report["run"]["failed"] == 0
    cluster = report["config"]["cluster"]
    assert (cluster["gateway"], cluster["planner"], cluster["routing"]) == ("smg", "static", "cache-aware")
    assert set(report["run"]["exit_codes"]) == {"smg", "node-agent n0", "node-agent n1", "node-agent n2"}
    assert 0 < report["kv"]["hit_rate"] <= report["kv"]["ideal_hit_rate"]
    assert "SGLang's gateway smg in front" in (out / "report.md").read_text()
