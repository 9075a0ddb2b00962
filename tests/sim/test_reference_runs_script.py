"""`scripts/sim_reference_runs.py`: a run of a copy of the tree imports every component from that copy (not from
the checkout the editable install points at), and `compare` tells identical outputs from different ones;
`scripts/mooncake_ours.py` replays what it is asked to, deterministically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolving_infra.cli.bench_sim import MOONCAKE

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sim_reference_runs.py"
MAIN = """import evolving_infra, evolving_infra.router, evolving_infra.node_agent.engine, evolving_infra.sim
for m in (evolving_infra, evolving_infra.router, evolving_infra.node_agent.engine, evolving_infra.sim):
    print(m.__file__)
"""


def _fake_tree(root: Path) -> Path:
    """A tree with the repository's package layout whose `python -m evolving_infra` prints where each came from."""
    for folder in ("evolving_infra", "router", "node_agent", "node_agent/engine", "sim", "operator", "proto"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "evolving_infra" / "__main__.py").write_text(MAIN)
    return root


def test_as_tree_imports_every_component_from_the_copy(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path / "copy")
    done = subprocess.run([sys.executable, str(SCRIPT), "as-tree", str(tree)], capture_output=True, text=True,
                          cwd=tmp_path, check=True)  # fmt: skip
    files = done.stdout.split()
    assert len(files) == 4
    assert all(Path(f).resolve().is_relative_to(tree.resolve()) for f in files), files


def test_compare_reports_identical_and_different_runs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for out, text in ((a, "x"), (b, "x")):
        (out / "putnam").mkdir(parents=True)
        (out / "putnam" / "metrics.json").write_text("{}")
        (out / "putnam" / "requests.jsonl").write_text(text)
    same = subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(b)], capture_output=True, text=True)
    assert same.returncode == 0 and "putnam/requests.jsonl: identical" in same.stdout
    (b / "putnam" / "requests.jsonl").write_text("y")
    differ = subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(b)], capture_output=True, text=True)
    assert differ.returncode == 1 and "putnam/requests.jsonl: DIFFERENT" in differ.stdout


def test_compare_says_which_metrics_and_how_many_records_moved(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for out, ttft, records in ((a, 0.5, "r1\nr2\nr3\n"), (b, 0.4, "r1\nR2\nr3\n")):
        (out / "cc90").mkdir(parents=True)
        (out / "cc90" / "metrics.json").write_text(
            f'{{"overall": {{"requests": 3, "ttft_s": {{"mean": {ttft}, "p95": 1.0}}}}}}'
        )
        (out / "cc90" / "requests.jsonl").write_text(records)
    done = subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(b)], capture_output=True, text=True)
    assert done.returncode == 1
    assert "1 of 3 overall metrics differ" in done.stdout
    assert "ttft_s.mean: 0.5 -> 0.4 (-20.0000%)" in done.stdout
    assert "1 of 3 records differ" in done.stdout


MOONCAKE_OURS = SCRIPT.parent / "mooncake_ours.py"


def test_mooncake_ours_replays_the_rows_asked_for_and_its_digest_is_stable(tmp_path: Path) -> None:
    """`scripts/mooncake_ours.py` (our side of `bench sim --against-dynamo` alone) finishes the rows it was given,
    and two runs of the same tree give the same digest of the request records (what an A/B of trees compares)."""
    if not MOONCAKE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{MOONCAKE} is missing (CI always has shared/ beside the clone)")
        pytest.skip(f"{MOONCAKE} is not available")
    outs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(MOONCAKE_OURS), "--rows", "25"], capture_output=True, text=True,
                              cwd=tmp_path, check=True, timeout=300)  # fmt: skip
        outs.append(json.loads(done.stdout))
    assert outs[0]["rows"] == outs[0]["requests"] == 25
    assert outs[0]["events"] > 25 and outs[0]["records_sha256"] == outs[1]["records_sha256"]
    bad = subprocess.run([sys.executable, str(MOONCAKE_OURS), "--rows", "0"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--rows must be >= 1" in bad.stderr
