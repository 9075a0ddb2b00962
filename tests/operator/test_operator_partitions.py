"""Partition claims: a node matched by two clusters belongs to the earlier one and is reported on the later."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.operator.partitions import ClusterSelection, NodeLabels, claim_nodes
from evolving_infra.operator.spec import NodeSelector

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _cluster(name: str, minutes: int, count: int, **selector: object) -> ClusterSelection:
    return ClusterSelection("agents", name, T0 + timedelta(minutes=minutes), NodeSelector.from_kube(selector), count)


def _pool(pool: str, *names: str, **extra: str) -> list[NodeLabels]:
    return [NodeLabels(n, {"pool": pool, **extra}) for n in names]


def test_disjoint_pools_claim_their_own_nodes() -> None:
    nodes = _pool("a", "a1", "a2") + _pool("b", "b1", "b2")
    claims = claim_nodes([_cluster("x", 0, 2, matchLabels={"pool": "a"}), _cluster("y", 1, 2, matchLabels={"pool": "b"})], nodes)
    assert claims[("agents", "x")].nodes == ("a1", "a2") and claims[("agents", "x")].ok
    assert claims[("agents", "y")].nodes == ("b1", "b2") and claims[("agents", "y")].ok


def test_shared_node_is_reported_on_the_later_cluster_whatever_the_input_order() -> None:
    nodes = _pool("a", "a1", "a2", "a3", gpu="gb300")
    early = _cluster("early", 0, 2, matchLabels={"pool": "a"}, matchExpressions=[{"key": "x", "operator": "DoesNotExist"}])
    late = _cluster("late", 5, 3, matchExpressions=[{"key": "gpu", "operator": "In", "values": ["gb300"]}])
    for order in ([early, late], [late, early]):
        claims = claim_nodes(order, nodes)
        first, second = claims[("agents", "early")], claims[("agents", "late")]
        assert first.nodes == ("a1", "a2") and first.surplus == ("a3",) and not first.conflicts
        assert second.nodes == () and second.shortfall == 3
        assert [(c.node, c.holder) for c in second.conflicts] == [(n, ("agents", "early")) for n in ("a1", "a2", "a3")]
        assert "3 selected node(s) already belong to agents/early, created earlier: a1, a2, a3" in second.problems()[0]


def test_same_creation_time_is_decided_by_namespace_and_name() -> None:
    nodes = _pool("a", "a1")
    claims = claim_nodes([_cluster("b", 0, 1, matchLabels={"pool": "a"}), _cluster("a", 0, 1, matchLabels={"pool": "a"})], nodes)
    assert claims[("agents", "a")].nodes == ("a1",)
    assert claims[("agents", "b")].conflicts[0].holder == ("agents", "a")


def test_fleet_example_partitions_are_disjoint() -> None:
    import yaml
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "manifests/examples/fleet-3072-gpus"
    objs = [yaml.safe_load((folder / f"partition-{i}.yaml").read_text()) for i in range(8)]
    clusters = [
        ClusterSelection("agents", o["metadata"]["name"], T0, NodeSelector.from_kube(o["spec"]["nodeSelector"]), o["spec"]["nodeCount"])
        for o in objs
    ]
    nodes = [NodeLabels(f"n{i:04d}", {"evolving-infra.io/fleet": "fleet-3072", "evolving-infra.io/partition": f"p{i // 96}"}) for i in range(768)]
    claims = claim_nodes(clusters, nodes)
    assert all(c.ok and len(c.nodes) == 96 for c in claims.values())
    assert sum(o["spec"]["nodeCount"] * o["spec"]["gpusPerNode"] for o in objs) == 3072


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=5),
    st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=12),
)
def test_claims_never_share_a_node_and_account_for_every_match(specs: list[tuple[str, int, int]], pools: list[str]) -> None:
    clusters = [_cluster(f"c{i}", minute, count, matchLabels={"pool": pool}) for i, (pool, minute, count) in enumerate(specs)]
    nodes = [NodeLabels(f"n{i:02d}", {"pool": pool}) for i, pool in enumerate(pools)]
    claims = claim_nodes(clusters, nodes)
    owned = [n for c in claims.values() for n in (*c.nodes, *c.surplus)]
    assert len(owned) == len(set(owned))
    order = sorted(clusters, key=lambda c: (c.created, c.namespace, c.name))
    for cluster in clusters:
        claim = claims[cluster.key]
        matched = {n.name for n in nodes if n.labels["pool"] == cluster.selector.match_labels["pool"]}
        assert set(claim.nodes) | set(claim.surplus) | {c.node for c in claim.conflicts} == matched
        assert len(claim.nodes) == min(cluster.node_count, len(matched) - len(claim.conflicts))
        for conflict in claim.conflicts:
            assert order.index(next(c for c in clusters if c.key == conflict.holder)) < order.index(cluster)
