"""Partitions learned from the cluster (AgentServingClusters selected by label, through the Kubernetes API
emulator), the gateway following a changed partition set, and `fleet status` (table, JSON, router metrics)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from evolving_infra.cli.main import main
from evolving_infra.fleet.binding import Partition
from evolving_infra.fleet.source import FileSource, KubeSource
from evolving_infra.fleet.status import fleet_view, parse_router_metrics, partition_row
from evolving_infra.gateway.server import refresh, start_gateway
from evolving_infra.gateway.settings import GatewaySettings
from evolving_infra.operator.kube import KubeApi, client_for

REPO = Path(__file__).resolve().parents[2]


def _emulator_module() -> Any:
    key = "_evolving_operator_tests_kube_emulator"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "tests" / "operator" / "kube_emulator.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def cluster(name: str, namespace: str, labels: dict[str, str], status: dict[str, Any] | None = None, **annotations: str) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "serving.evolving-infra.io/v1alpha1",
        "kind": "AgentServingCluster",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": name}},
            "nodeCount": 6,
            "gpusPerNode": 4,
            "engine": {"backend": "emulated", "profile": "glm-5.2-4xgb300-tp4"},
            "initialSplit": {"prefill": 2, "decode": 4},
        },
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_partitions_are_learned_from_clusters_selected_by_label() -> None:
    async def main_() -> None:
        emulator_mod = _emulator_module()
        async with emulator_mod.Emulator() as emulator, kmock.Server(emulator) as server:
            emulator.load_crd(REPO / "crds" / "agentservingclusters.yaml")
            url = str(server.url).rstrip("/")
            writer = KubeApi(client_for(url), field_manager="test")
            fleet = {"evolving-infra.io/fleet": "f1"}
            await writer.create(cluster("a", "ns1", {**fleet, "region": "eu"}))
            await writer.create(cluster("b", "ns2", {**fleet, "region": "us"}))
            await writer.create(cluster("c", "ns1", {"evolving-infra.io/fleet": "other"}))
            reader = KubeApi(client_for(url), field_manager="evolving-infra-gateway")
            try:
                every = await KubeSource(reader, fleet).load()
                assert [p.key for p in every] == ["ns1/a", "ns2/b"]
                assert every[0].binding_labels()["region"] == "eu" and every[0].gpus == 24
                assert every[0].router_url == "http://a-router.ns1.svc:8000"
                assert [p.key for p in await KubeSource(reader, fleet, "ns2").load()] == ["ns2/b"]
            finally:
                writer.close()
                reader.close()

    asyncio.run(main_())


def test_the_gateway_follows_a_changed_partition_set(tmp_path: Path) -> None:
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(yaml.safe_dump(cluster("a", "ns", {"p": "a"}, **{"evolving-infra.io/router-url": "http://127.0.0.1:9"})))

    async def main_() -> None:
        settings = GatewaySettings(port=0, partition_files=(tmp_path,), health_interval_s=60.0)
        gateway = await start_gateway(settings, FileSource((tmp_path,)))
        try:
            state = gateway.state
            for i in range(40):
                state.table.binder.bind(f"user-{i}", branch_id=f"branch-{i}")
            assert set(state.partitions) == {"ns/a"}
            two.write_text(yaml.safe_dump(cluster("b", "ns", {"p": "b"})))
            await refresh(state)
            assert set(state.partitions) == {"ns/a", "ns/b"}
            moved = [u for u in (f"user-{i}" for i in range(40)) if state.table.binder.partition_of(u) == "ns/b"]
            assert moved and len(moved) < 40  # consistent hashing: some users move, not all
            assert all(state.table.binder.branch_partition(f"branch-{i}") == "ns/a" for i in range(40))  # pins hold
            # A broken file keeps the last good set, and says why.
            bad = cluster("c", "ns", {"p": "c"})
            bad["spec"]["engine"]["profile"] = "nope"
            (tmp_path / "three.yaml").write_text(yaml.safe_dump(bad))
            await refresh(state)
            assert set(state.partitions) == {"ns/a", "ns/b"}
            assert state.refresh_error is not None and "three.yaml: c: spec.engine.profile" in state.refresh_error
        finally:
            await gateway.stop()

    asyncio.run(main_())


ROUTER_METRICS = """# HELP evolving_router_queued_requests Requests queued at a node.
# TYPE evolving_router_queued_requests gauge
evolving_router_queued_requests{node="n0",phase="prefill"} 12.0
evolving_router_queued_requests{node="n1",phase="decode"} 3.0
# HELP evolving_router_inflight_requests In flight.
# TYPE evolving_router_inflight_requests gauge
evolving_router_inflight_requests{node="n0",phase="prefill"} 20.0
"""


def test_router_metrics_and_queue_imbalance() -> None:
    load = parse_router_metrics(ROUTER_METRICS)
    assert (load.queued, load.inflight) == (15.0, 20.0)
    from evolving_infra.fleet.partitions import partitions_from_objects
    from evolving_infra.fleet.status import RouterLoad

    parts = partitions_from_objects([(str(i), cluster(f"p{i}", "ns", {})) for i in range(4)])
    rows = [partition_row(p, router=RouterLoad(0, q)) for p, q in zip(parts, (1.0, 1.0, 1.0, 13.0))]
    view = fleet_view(rows)
    assert [r.queue_imbalance for r in view.rows] == [0.25, 0.25, 0.25, 3.25]  # per node over the fleet's per node
    assert view.max_queue_imbalance == 3.25 and view.queued == 16.0
    idle = fleet_view([partition_row(p, router=RouterLoad(0, 0)) for p in parts])
    assert {r.queue_imbalance for r in idle.rows} == {1.0}


def test_fleet_status_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=ROUTER_METRICS)

    async def main_() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with TestServer(app, host="127.0.0.1") as server:
            status = {
                "split": "3P3D", "prefill": 3, "decode": 3, "adapting": True, "readyNodes": 6,
                "targetSplit": {"prefill": 4, "decode": 2, "split": "4P2D", "switchGeneration": 2},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Serving"}],
            }  # fmt: skip
            a = cluster("a", "ns", {}, status, **{"evolving-infra.io/router-metrics-url": str(server.make_url("/metrics"))})
            b = cluster("b", "ns", {}, **{"evolving-infra.io/router-metrics-url": "http://127.0.0.1:9/metrics"})
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump_all([a, b]))
            code = await asyncio.to_thread(
                main, ["fleet", "status", "--partitions", str(tmp_path), "--metrics", "--timeout-s", "2", "--json"]
            )
            assert code == 0

    asyncio.run(main_())
    view = json.loads(capsys.readouterr().out)
    rows = {r["partition"]: r for r in view["partitions"]}
    assert rows["ns/a"]["split"] == "3P3D" and rows["ns/a"]["adapting"] is True and rows["ns/a"]["target_split"] == "4P2D"
    assert rows["ns/a"]["queued"] == 15.0 and rows["ns/a"]["queue_imbalance"] == 1.0  # the only partition with figures
    assert rows["ns/b"]["split"] == "2P4D (initial)" and rows["ns/b"]["queued"] is None
    assert view["totals"]["prefill"] == 5 and view["totals"]["decode"] == 7
    assert main(["fleet", "status", "--partitions", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "ns/a" in table and "4P2D" in table and "True (Serving)" in table


def test_bad_fleet_files_exit_2_naming_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(cluster("a", "ns", {})))
    clash = cluster("b", "ns", {})
    clash["spec"]["nodeSelector"] = {"matchLabels": {"pool": "a"}}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(clash))
    assert main(["fleet", "status", "--partitions", str(tmp_path)]) == 2
    assert "b.yaml: b: spec.nodeSelector: overlaps the node selector of ns/a" in capsys.readouterr().err
    assert main(["gateway", "serve", "--partitions", str(tmp_path), "--port", "0"]) == 2
    assert "spec.nodeSelector" in capsys.readouterr().err


def test_partition_weight_is_its_gpus() -> None:
    from evolving_infra.fleet.partitions import partitions_from_objects

    (p,) = partitions_from_objects([("x", cluster("a", "ns", {"region": "eu"}))])
    assert p.to_binding() == Partition("ns/a", {"region": "eu", "evolving-infra.io/profile": "glm-5.2-4xgb300-tp4"}, 24.0)


def test_fleet_status_reads_the_selected_clusters_through_a_kubeconfig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def main_() -> None:
        emulator_mod = _emulator_module()
        async with emulator_mod.Emulator() as emulator, kmock.Server(emulator) as server:
            emulator.load_crd(REPO / "crds" / "agentservingclusters.yaml")
            url = str(server.url).rstrip("/")
            writer = KubeApi(client_for(url), field_manager="test")
            try:
                for name in ("p0", "p1"):
                    await writer.create(cluster(name, "agents", {"evolving-infra.io/fleet": "f"}))
                await writer.create(cluster("other", "agents", {}))
                status = {"split": "3P3D", "prefill": 3, "decode": 3, "adapting": True}
                head = {k: v for k, v in cluster("p1", "agents", {}).items() if k in ("apiVersion", "kind")}
                await writer.apply({**head, "metadata": {"name": "p1", "namespace": "agents"}, "status": status}, "status")
            finally:
                writer.close()
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "v1", "kind": "Config", "current-context": "emu",
                        "clusters": [{"name": "emu", "cluster": {"server": url}}],
                        "users": [{"name": "u", "user": {"token": "t"}}],
                        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "u"}}],
                    }
                )
            )  # fmt: skip
            argv = ["fleet", "status", "--cluster-labels", "evolving-infra.io/fleet=f", "--kubeconfig", str(kubeconfig), "--json"]
            assert await asyncio.to_thread(main, argv) == 0

    asyncio.run(main_())
    view = json.loads(capsys.readouterr().out)
    rows = {r["partition"]: r for r in view["partitions"]}
    assert set(rows) == {"agents/p0", "agents/p1"}
    assert rows["agents/p1"]["split"] == "3P3D" and rows["agents/p1"]["adapting"] is True
    assert rows["agents/p0"]["split"] == "2P4D (initial)" and view["totals"]["adapting"] == 1
