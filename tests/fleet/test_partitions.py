"""Fleet files: AgentServingCluster YAML read into partitions; malformed fleets refused naming file and field."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.fleet.partitions import (
    FleetFileError,
    load_partitions,
    partitions_from_objects,
    selectors_overlap,
)
from evolving_infra.operator.meta import selector_matches
from evolving_infra.operator.spec import NodeSelector

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "manifests" / "examples" / "fleet-3072-gpus"


def cluster(name: str, partition: str, *, profile: str = "glm-5.2-4xgb300-tp4", **labels: str) -> dict[str, object]:
    return {
        "apiVersion": "serving.evolving-infra.io/v1alpha1",
        "kind": "AgentServingCluster",
        "metadata": {"name": name, "labels": {"evolving-infra.io/partition": partition, **labels}},
        "spec": {
            "nodeSelector": {"matchLabels": {"evolving-infra.io/partition": partition}},
            "nodeCount": 4,
            "gpusPerNode": 4,
            "engine": {"backend": "emulated", "profile": profile},
            "initialSplit": {"prefill": 2, "decode": 2},
        },
    }


def write(path: Path, *docs: object) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_the_example_fleet_loads_as_eight_partitions() -> None:
    parts = load_partitions([FLEET])
    assert [p.key for p in parts] == [f"agents/fleet-p{i}" for i in range(8)]
    assert {p.gpus for p in parts} == {384} and sum(p.gpus for p in parts) == 3072
    assert parts[0].router_url == "http://fleet-p0-router.agents.svc:8000"
    binding = parts[3].to_binding()
    assert binding.name == "agents/fleet-p3" and binding.weight == 384.0
    assert binding.labels["evolving-infra.io/partition"] == "p3"
    assert binding.labels["evolving-infra.io/profile"] == "glm-5.2-4xgb300-tp4"


def test_one_path_is_read_as_one_file_not_as_characters() -> None:
    assert [p.key for p in load_partitions(FLEET)] == [p.key for p in load_partitions([FLEET])]
    assert [p.key for p in load_partitions(str(FLEET))] == [f"agents/fleet-p{i}" for i in range(8)]


def test_router_url_annotation_and_namespace(tmp_path: Path) -> None:
    obj = cluster("a", "pa", region="eu")
    obj["metadata"]["namespace"] = "ns1"  # type: ignore[index]
    obj["metadata"]["annotations"] = {"evolving-infra.io/router-url": "http://127.0.0.1:9000/"}  # type: ignore[index]
    (part,) = load_partitions([write(tmp_path / "a.yaml", obj)])
    assert part.key == "ns1/a" and part.router_url == "http://127.0.0.1:9000"
    assert part.labels["region"] == "eu"


def test_overlapping_selectors_are_refused_naming_file_and_field(tmp_path: Path) -> None:
    write(tmp_path / "p0.yaml", cluster("p0", "x"))
    write(tmp_path / "p1.yaml", cluster("p1", "x"))
    with pytest.raises(FleetFileError) as info:
        load_partitions([tmp_path])
    (problem,) = info.value.problems
    assert problem.source.endswith("p1.yaml") and problem.obj == "p1" and problem.field == "spec.nodeSelector"
    assert "default/p0" in problem.message and "p1.yaml: p1: spec.nodeSelector: overlaps" in str(info.value)


def test_unknown_profile_is_refused_naming_file_and_field(tmp_path: Path) -> None:
    path = write(tmp_path / "fleet.yaml", cluster("p0", "a"), cluster("p1", "b", profile="no-such-gpu"))
    with pytest.raises(FleetFileError) as info:
        load_partitions([path])
    (problem,) = info.value.problems
    assert (Path(problem.source).name, problem.obj, problem.field) == ("fleet.yaml", "p1", "spec.engine.profile")
    assert "no-such-gpu" in problem.message


def test_schema_errors_duplicates_and_bad_files_are_each_named(tmp_path: Path) -> None:
    bad = cluster("p0", "a")
    bad["spec"]["nodeCount"] = "four"  # type: ignore[index]
    write(tmp_path / "a.yaml", bad)
    write(tmp_path / "b.yaml", cluster("p1", "b"), cluster("p1", "c"))
    (tmp_path / "c.yaml").write_text("kind: [unclosed\n")
    with pytest.raises(FleetFileError) as info:
        load_partitions([tmp_path, tmp_path / "missing.yaml"])
    text = str(info.value)
    assert "a.yaml: p0: spec.nodeCount:" in text
    assert "b.yaml: p1: metadata.name: default/p1 is also defined in" in text
    assert "c.yaml: not valid YAML" in text
    assert "missing.yaml: no such file or directory" in text


def test_no_cluster_in_the_files_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "ns.yaml", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})
    with pytest.raises(FleetFileError, match="no AgentServingCluster object found"):
        load_partitions([path])


def test_objects_from_the_api_get_the_same_checks() -> None:
    a, b = cluster("p0", "a"), cluster("p1", "a")
    with pytest.raises(FleetFileError, match="ns/p1: p1: spec.nodeSelector"):
        partitions_from_objects([("ns/p0", a), ("ns/p1", b)])
    assert [p.name for p in partitions_from_objects([("ns/p0", a)])] == ["p0"]


KEYS = ("a", "b")
VALUES = ("x", "y", "z")
requirement = st.one_of(
    st.builds(
        lambda k, op, vs: {"key": k, "operator": op, "values": sorted(vs)},
        st.sampled_from(KEYS),
        st.sampled_from(["In", "NotIn"]),
        st.sets(st.sampled_from(VALUES), min_size=1),
    ),
    st.builds(lambda k, op: {"key": k, "operator": op}, st.sampled_from(KEYS), st.sampled_from(["Exists", "DoesNotExist"])),
)
selector = st.builds(
    lambda labels, exprs: NodeSelector.from_kube(
        {**({"matchLabels": labels} if labels else {}), "matchExpressions": exprs}
    ),
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    st.lists(requirement, min_size=1, max_size=3),
)
# Every labelling over KEYS with values in VALUES plus one value no selector names ("w"), or the key absent.
LABELLINGS = [
    {k: v for k, v in zip(KEYS, combo) if v is not None}
    for combo in itertools.product([None, *VALUES, "w"], repeat=len(KEYS))
]


@given(selector, selector)
def test_selectors_overlap_exactly_when_some_node_matches_both(a: NodeSelector, b: NodeSelector) -> None:
    witness = any(selector_matches(a, n) and selector_matches(b, n) for n in LABELLINGS)
    assert selectors_overlap(a, b) == witness
