"""Recorded node models: the router writes its fitted models, `simulate --models-from` runs the nodes on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolving_infra.cli.main import main
from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.router.fitting import FittedNodeModel, UsageCounts
from evolving_infra.router.recording import models_document
from evolving_infra.sim.recorded import ModelsFileError, load_models, profile_with_models

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "sample-agents.jsonl"
PROFILE = "glm-5.2-4xgb300-tp4"


def _fitted(node: str, c1: float, decode: bool = True) -> FittedNodeModel:
    usage = UsageCounts(prefill_iterations=10, new_tokens=40_000, cached_tokens=100, restored_tokens=10)
    return FittedNodeModel(
        node, PrefillCoefficients(0.01, c1, 1e-10, 1e-6),  # type: ignore[arg-type]
        DecodeCoefficients(0.01, 0.02, 1e-4, 8, 256, 1.0) if decode else None, usage,
    )  # fmt: skip


def test_models_document_round_trips_into_a_profile(tmp_path: Path) -> None:
    doc = models_document({"n1": _fitted("n1", 3e-5, decode=False), "n0": _fitted("n0", 1e-5)}, profile=PROFILE)
    assert list(doc["nodes"]) == ["n0", "n1"] and doc["nodes"]["n1"]["decode"] is None
    assert doc["nodes"]["n0"]["t_bar"] == 4000.0
    path = tmp_path / "models.json"
    path.write_text(json.dumps(doc))
    base = load_profile(PROFILE)
    profile = profile_with_models(base, load_models(path))
    assert profile.prefill.c1 == pytest.approx(2e-5)  # the median of the two nodes
    assert (profile.decode.d1, profile.decode.k, profile.decode.experts) == (0.02, 8, 256)
    assert profile.kv_bytes_per_token == base.kv_bytes_per_token and profile.decode.t_acc <= profile.decode.t_fwd


def test_models_files_without_fits_or_of_another_kind_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(models_document({}, profile=PROFILE)))
    with pytest.raises(ModelsFileError, match="no node has a fitted prefill model"):
        profile_with_models(load_profile(PROFILE), load_models(path))
    path.write_text('{"kind": "something else"}')
    with pytest.raises(ModelsFileError, match="not a node-models file"):
        load_models(path)


def test_simulate_models_from_changes_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = models_document({"n0": _fitted("n0", 2e-4)}, profile=PROFILE)  # ten times slower prefill than GLM's
    path = tmp_path / "models.json"
    path.write_text(json.dumps(doc))
    common = [str(SAMPLE), "--profile", PROFILE, "--nodes", "4", "--warmup", "0", "--quiet", "--json"]
    assert main(["simulate", *common]) == 0
    plain = json.loads(capsys.readouterr().out)["overall"]
    assert main(["simulate", *common, "--models-from", str(path)]) == 0
    recorded = json.loads(capsys.readouterr().out)["overall"]
    assert recorded["requests"] == plain["requests"]
    assert recorded["ttft_s"]["mean"] > plain["ttft_s"]["mean"]
    assert main(["simulate", *common, "--models-from", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_what_if_replay_charges_the_recorded_live_path_per_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A models file with a live path (as `local --record` writes it): `simulate --models-from` adds its
    per-request cost to every request's first token and end, as the fidelity check does, so a what-if replay
    reports what the clients would have seen; without `request_s` nothing moves."""
    doc = models_document({"n0": _fitted("n0", 2e-5)}, profile=PROFILE)
    common = [str(SAMPLE), "--profile", PROFILE, "--nodes", "4", "--warmup", "0", "--quiet", "--json"]
    runs = {}
    for request_s in (0.0, 0.25):
        path = tmp_path / f"models-{request_s}.json"
        path.write_text(json.dumps({**doc, "live_path": {"request_s": request_s, "iteration_s": 0.0, "requests": 9}}))
        assert main(["simulate", *common, "--models-from", str(path), "--out", str(tmp_path / f"out-{request_s}")]) == 0
        runs[request_s] = json.loads(capsys.readouterr().out)
        assert "live_path_request_s" in runs[request_s] or request_s == 0.0
    plain, charged = runs[0.0]["overall"], runs[0.25]["overall"]
    assert charged["requests"] == plain["requests"] > 0
    assert charged["ttft_s"]["mean"] == pytest.approx(plain["ttft_s"]["mean"] + 0.25)
    assert charged["e2e_s"]["mean"] == pytest.approx(plain["e2e_s"]["mean"] + 0.25)
    assert charged["kv_hit_rate"] == plain["kv_hit_rate"]
    rows = [json.loads(line) for line in (tmp_path / "out-0.25" / "requests.jsonl").read_text().splitlines()]
    base = {r["request_id"]: r for r in map(json.loads, (tmp_path / "out-0.0" / "requests.jsonl").read_text().splitlines())}
    assert all(r["first_token"] == pytest.approx(base[r["request_id"]]["first_token"] + 0.25) for r in rows)
