"""The simulator on the run-based KV directory against the page-exact one (`directory_pages.PageKvDirectory`, the
oracle): a seeded run with evictions gives the same metrics and the same per-request records, bit for bit,
whichever directory the router reads. Together with the hypothesis state machines of the structures themselves
this is the reference-run check of issue #11 that needs no recorded outputs (which other modules' behaviour
changes would invalidate)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from evolving_infra.node_agent import profiles
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.directory_pages import PageKvDirectory
from evolving_infra.sim import cluster
from evolving_infra.sim.export import request_row
from evolving_infra.sim.run import SimResult, simulate, workload_trace
from evolving_infra.sim.systems import build_config


def small_memory_profile(tmp_path: Path) -> str:
    """The GLM profile with GPU and host memory cut to 0.25 M and 0.5 M tokens, so that KV is evicted."""
    source = (resources.files(profiles.DATA_PACKAGE) / "glm-5.2-4xgb300-tp4.yaml").read_text()
    lines = [line for line in source.splitlines() if not line.startswith(("l1_tokens:", "l2_tokens:", "name:"))]
    path = tmp_path / "small-memory.yaml"
    path.write_text("\n".join(["name: small-memory", "l1_tokens: 250000", "l2_tokens: 500000", *lines]) + "\n")
    return str(path)


def outputs(result: SimResult) -> tuple[str, list[dict[str, Any]]]:
    return json.dumps(result.metrics.to_dict(), sort_keys=True), [request_row(r) for r in result.records]


@pytest.mark.parametrize(("workload", "system", "split"), [("cc", "evolving", "2P2D"), ("osworld", "dynamo", "2P2D")])
def test_runs_equal_the_page_exact_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workload: str,
                                             system: str, split: str) -> None:  # fmt: skip
    trace = workload_trace(workload, 12, 5)
    cfg = build_config(system, nodes=4, split=split, agents=6, warmup_s=0.0, duration_s=60.0, models="profile",
                       seed=5, profile=small_memory_profile(tmp_path))  # fmt: skip
    made: list[Any] = []

    def recording(kind: type) -> Any:
        def make() -> Any:
            made.append(kind())
            return made[-1]
        return make

    monkeypatch.setattr(cluster, "KvDirectory", recording(KvDirectory))
    runs = outputs(simulate(cfg, trace))
    removed = sum(d.stats.pages_removed for d in made)
    monkeypatch.setattr(cluster, "KvDirectory", recording(PageKvDirectory))
    pages = outputs(simulate(cfg, trace))
    assert isinstance(made[-1], PageKvDirectory) and len(pages[1]) > 10
    assert runs == pages
    assert removed > 0  # evictions split runs in this run
