"""`evolving-infra operator crd | validate | render`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evolving_infra.cli.main import main
from evolving_infra.operator import crdgen

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests/examples/cluster-9-nodes.yaml"


def test_crd_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "crd"]) == 0
    assert capsys.readouterr().out == crdgen.render_crd()


def test_crd_check_reports_a_stale_checkout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/operator.md").write_text(f"# x\n{crdgen.DOCS_BEGIN}\nSTALE-REFERENCE-TEXT\n{crdgen.DOCS_END}\n")
    assert main(["operator", "crd", "--check", str(tmp_path)]) == 1
    assert "stale:" in capsys.readouterr().err
    assert main(["operator", "crd", "--write", str(tmp_path)]) == 0
    assert main(["operator", "crd", "--check", str(tmp_path)]) == 0
    assert "STALE-REFERENCE-TEXT" not in (tmp_path / "docs/operator.md").read_text()


def test_validate_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(EXAMPLE), *(str(p) for p in sorted((REPO / "manifests/examples/fleet-3072-gpus").glob("partition-*.yaml")))]
    assert main(["operator", "validate", *files]) == 0
    assert capsys.readouterr().out.count(": ok") == 9


def test_validate_names_each_problem_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["initialSplit"] = {"prefill": 6, "decode": 2}
    obj["spec"]["engine"]["profile"] = "no-such-profile"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(obj))
    assert main(["operator", "validate", str(bad)]) == 2
    out = capsys.readouterr()
    assert "initialSplit.prefill + initialSplit.decode must equal nodeCount (got 6 + 2, nodeCount 9)" in out.out
    obj["spec"]["initialSplit"] = {"prefill": 6, "decode": 3}
    bad.write_text(yaml.safe_dump(obj))
    assert main(["operator", "validate", str(bad)]) == 2
    assert "engine.profile 'no-such-profile' is not a known hardware profile" in capsys.readouterr().out


def test_validate_refuses_a_file_without_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "x.yaml"
    empty.write_text("kind: ConfigMap\n")
    assert main(["operator", "validate", str(empty)]) == 2
    assert "no AgentServingCluster object found" in capsys.readouterr().err


def test_render_prints_the_children(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "render", str(EXAMPLE), "--image", "img:1", "--namespace", "agents"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {d["kind"] for d in docs} >= {"DaemonSet", "Deployment", "ConfigMap", "Role"}
    assert all(d["metadata"]["namespace"] == "agents" for d in docs)
