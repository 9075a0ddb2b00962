"""The engine's two page-table kinds under a whole simulation: the id tables (the default) and the hash-keyed
sets (`TierPool`, their oracle) give the same run, byte for byte, where tiny tiers make the engines evict, write
back and re-key pages on branch counts all the time (the reference runs check the same at full size)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evolving_infra.node_agent.engine.idpool import ENV
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.sim.export import request_row
from evolving_infra.sim.run import simulate, workload_trace
from evolving_infra.sim.systems import build_config

PROFILE = Path(load_profile.__code__.co_filename).parent / "data" / "glm-5.2-4xgb300-tp4.yaml"


def _run(profile: Path) -> tuple[str, list[dict[str, Any]], int]:
    trace = workload_trace("cc", 6, 4)
    cfg = build_config("evolving", nodes=3, split="1P2D", agents=6, warmup_s=60.0, duration_s=180.0, seed=4,
                       profile=str(profile))  # fmt: skip
    result = simulate(cfg, trace, keep_state=True)
    assert result.state is not None
    removed = result.state.core.directory.stats.pages_removed
    return json.dumps(result.metrics.to_dict(), sort_keys=True), [request_row(r) for r in result.records], removed


def test_id_tables_and_set_tables_give_the_same_simulation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = PROFILE.read_text()
    assert "l1_tokens: 2060000" in text and "l2_tokens: 8250000" in text
    small = tmp_path / "small.yaml"
    small.write_text(text.replace("l1_tokens: 2060000", "l1_tokens: 150000").replace("l2_tokens: 8250000",
                                                                                     "l2_tokens: 200000"))  # fmt: skip
    monkeypatch.setenv(ENV, "sets")
    sets = _run(small)
    monkeypatch.setenv(ENV, "ids")
    ids = _run(small)
    assert sets[2] > 10_000, "the tiers were meant to be small enough to evict all the time"
    assert len(sets[1]) > 20
    assert ids == sets


@pytest.mark.parametrize("tables", ["sets", "ids"])
def test_a_decode_nodes_room_read_from_its_engine_equals_the_snapshots(
    tables: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode bindings read each decode node's room straight from its engine's GPU tier
    (`SimNode.current_room_tokens`); the router's general path reads it from the pool snapshot
    (`NodeTrack.current_room_tokens`). On every read of a run whose tiers are full, both agree."""
    from evolving_infra.router.core.tracking import NodeTrack
    from evolving_infra.sim.state import SimNode

    text = PROFILE.read_text()
    small = tmp_path / "small.yaml"
    small.write_text(text.replace("l1_tokens: 2060000", "l1_tokens: 150000").replace("l2_tokens: 8250000",
                                                                                     "l2_tokens: 200000"))  # fmt: skip
    direct = SimNode.current_room_tokens
    reads: list[int] = []

    def checked(node: SimNode) -> int:
        got = direct(node)
        assert got == NodeTrack.current_room_tokens(node), node.id
        reads.append(got)
        return got

    monkeypatch.setattr(SimNode, "current_room_tokens", checked)
    monkeypatch.setenv(ENV, tables)
    _run(small)
    assert len(reads) > 50
    assert min(reads) < 150_000 // 2, "the decode nodes' GPU tiers were meant to fill"
