"""The settings ConfigMap is what the services load: each rendered file goes through the service's own
`load_settings(file)` (router and node agent), for the 9-node example and every planner, prefill policy,
decode policy and eviction value the CRD allows, and its values land in the fields intended. The workloads'
command lines parse with the real CLI, their ports match the settings, and a real node agent process
started from the rendered file (with the DaemonSet's per-pod environment) serves with those settings."""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from evolving_infra.cli.main import build_parser
from evolving_infra.core.types import Phase
from evolving_infra.node_agent.service import settings as agent_settings
from evolving_infra.operator.builders import (
    BuildContext, build_children, build_node_agent_daemonset, build_node_agent_service, build_router_deployment,
)  # fmt: skip
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.rendered import NODE_AGENT_ENV, NODE_AGENT_SETTINGS_FILE, ROUTER_SETTINGS_FILE, SETTINGS_DIR
from evolving_infra.operator.semantics import builtin_profile_table, resolve_profile
from evolving_infra.operator.spec import AgentServingClusterSpec
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.router.planner.registry import make_planner
from evolving_infra.router.routing.registry import make_prefill_router
from evolving_infra.router.service import settings as router_settings

CLUSTER = ClusterRef("glm-9", "agents", "0b6c2f1e-1111-2222-3333-444455556666")


def _harness_processes() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key].load_helper("node_agent_processes")


@pytest.fixture(autouse=True)
def _no_service_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The services read EVOLVING_NODE_* / EVOLVING_ROUTER_* variables; none may leak into these tests."""
    for name in list(os.environ):
        if name.startswith(("EVOLVING_NODE_", "EVOLVING_ROUTER_")):
            monkeypatch.delenv(name)


def _ctx(obj: dict[str, Any]) -> BuildContext:
    spec = AgentServingClusterSpec.from_kube(obj["spec"])
    return BuildContext(CLUSTER, spec, resolve_profile(spec, builtin_profile_table()), "evolving-infra:test")


def _write_configmap(ctx: BuildContext, where: Path) -> tuple[Path, Path]:
    """The ConfigMap's files as the pods see them under SETTINGS_DIR: (router.yaml, node-agent.yaml)."""
    [configmap] = [c for c in build_children(ctx) if c["kind"] == "ConfigMap"]
    for name, text in configmap["data"].items():
        (where / name).write_text(text, encoding="utf-8")
    return where / ROUTER_SETTINGS_FILE, where / NODE_AGENT_SETTINGS_FILE


def _enum(schema: dict[str, Any], *path: str) -> list[str]:
    node = schema["properties"]["spec"]
    for part in path:
        node = node["properties"][part]
    values = node["enum"]
    assert values, path
    return list(values)


def _variants(apiserver: Any, nine: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The example and one edit per value the CRD allows for planner, prefill, decode and eviction."""
    out: list[tuple[str, dict[str, Any]]] = [("example", nine)]

    def edit(label: str, section: str, values: dict[str, Any]) -> None:
        obj = copy.deepcopy(nine)
        obj["spec"].setdefault(section, {}).update(values)
        out.append((label, obj))

    schema = apiserver.schema
    for policy in _enum(schema, "planner", "policy"):
        if policy == "static":
            edit("planner=static", "planner", {"mode": "static", "policy": "static"})
        else:
            edit(f"planner={policy}", "planner", {"mode": "adaptive", "policy": policy, "windowSeconds": 120, "slices": 4, "warmupSeconds": 0})
    for policy in _enum(schema, "routing", "prefillPolicy"):
        edit(f"prefill={policy}", "routing", {"prefillPolicy": policy})
    for policy in _enum(schema, "routing", "decodePolicy"):
        edit(f"decode={policy}", "routing", {"decodePolicy": policy})
    for policy in _enum(schema, "eviction", "policy"):
        edit(f"eviction={policy}", "eviction", {"policy": policy})
    edit("small-l2", "kvCache", {"l2Tokens": 200000, "l1Tokens": 6400})
    for label, obj in out:
        assert apiserver.errors(obj) == [], label  # every variant is an object the API server accepts
    return out


def _port(container: dict[str, Any], name: str) -> int:
    [port] = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def test_every_rendered_variant_loads_in_both_services(apiserver: Any, nine_nodes: dict[str, Any], tmp_path: Path) -> None:
    for label, obj in _variants(apiserver, nine_nodes):
        ctx = _ctx(obj)
        spec = ctx.spec
        where = tmp_path / label
        where.mkdir()
        router_file, agent_file = _write_configmap(ctx, where)
        router = router_settings.load_settings(router_file)
        agent = agent_settings.load_settings(agent_file)

        # Router: policies, windows, discovery, applier.
        assert router.planner == spec.planner.effective_policy.value, label
        assert router.prefill_routing == spec.routing.prefill_policy.value, label
        assert router.decode_routing == spec.routing.decode_policy.value, label
        assert router.eviction == spec.eviction.policy.value, label
        assert (router.window_s, router.slices, router.warmup_s) == (
            spec.planner.window_seconds, spec.planner.slices, spec.planner.warmup_seconds,
        ), label  # fmt: skip
        assert router.profile == spec.engine.profile == "glm-5.2-4xgb300-tp4", label
        assert make_planner(router.planner, **router.planner_settings) is not None, label
        assert make_prefill_router(router.prefill_routing, **router.routing_settings) is not None, label
        expected_applier = "none" if spec.planner.mode.value == "static" else "kubernetes"
        assert (router.applier.value, router.cluster_name, router.namespace) == (expected_applier, "glm-9", "agents"), label
        assert router.nodes == {}, label

        # Node agent: profile, eviction, emulated memory from kvCache.
        assert agent.profile == spec.engine.profile, label
        assert agent.eviction == spec.eviction.policy.value, label
        page = ctx.profile.page_tokens if ctx.profile else 64
        want_l2 = spec.kv_cache.l2_tokens // page if spec.kv_cache.l2_tokens else None
        want_l1 = spec.kv_cache.l1_tokens // page if spec.kv_cache.l1_tokens else None
        assert (agent.l2_pages, agent.l1_pages) == (want_l2, want_l1), label
        assert agent.mode.value == "collocated", label  # the operator switches nodes into their phases


def test_ports_and_node_discovery_agree_with_the_workloads(nine_nodes: dict[str, Any], tmp_path: Path) -> None:
    ctx = _ctx(nine_nodes)
    router_file, agent_file = _write_configmap(ctx, tmp_path)
    router = router_settings.load_settings(router_file)
    agent = agent_settings.load_settings(agent_file)
    daemonset = build_node_agent_daemonset(ctx)["spec"]["template"]["spec"]
    deployment = build_router_deployment(ctx)["spec"]["template"]["spec"]
    agent_container, router_container = daemonset["containers"][0], deployment["containers"][0]
    assert agent.grpc_port == _port(agent_container, "grpc") == agent_container["readinessProbe"]["grpc"]["port"]
    assert agent.metrics_port == _port(agent_container, "metrics")
    assert router.port == _port(router_container, "http")
    assert router.metrics_port == _port(router_container, "metrics")
    assert router.host == "0.0.0.0"  # reachable through the Service and the kubelet's probes
    # The router resolves the node agents' headless Service, on the port the agents serve gRPC on.
    service = build_node_agent_service(ctx)
    host, _, port = (router.nodes_dns or "").rpartition(":")
    assert host == f"{service['metadata']['name']}.{CLUSTER.namespace}.svc"
    assert service["spec"]["clusterIP"] == "None"
    [grpc_port] = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert int(port) == grpc_port["port"] == agent.grpc_port

    # Per-pod settings come from the downward API and win over the shared file.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in agent_container["env"] if "valueFrom" in e}
    assert {name: env[name] for name, _ in NODE_AGENT_ENV} == {"EVOLVING_NODE_NODE": "spec.nodeName", "EVOLVING_NODE_HOST": "status.podIP"}


def test_per_pod_environment_sets_node_and_host(nine_nodes: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, agent_file = _write_configmap(_ctx(nine_nodes), tmp_path)
    monkeypatch.setenv("EVOLVING_NODE_NODE", "gpu-node-7")
    monkeypatch.setenv("EVOLVING_NODE_HOST", "10.4.2.17")
    agent = agent_settings.load_settings(agent_file)
    assert (agent.node, agent.host, agent.profile) == ("gpu-node-7", "10.4.2.17", "glm-5.2-4xgb300-tp4")


def test_workload_command_lines_parse_with_the_cli(nine_nodes: dict[str, Any]) -> None:
    ctx = _ctx(nine_nodes)
    parser = build_parser()
    for workload, file in ((build_node_agent_daemonset(ctx), NODE_AGENT_SETTINGS_FILE), (build_router_deployment(ctx), ROUTER_SETTINGS_FILE)):
        pod = workload["spec"]["template"]["spec"]
        container = pod["containers"][0]
        args = parser.parse_args(container["args"])
        assert args.settings == Path(SETTINGS_DIR) / file
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "settings"]
        [volume] = [v for v in pod["volumes"] if v["name"] == "settings"]
        assert mount["mountPath"] == SETTINGS_DIR and volume["configMap"]["items"] == [{"key": file, "path": file}]


def test_a_real_node_agent_serves_from_the_rendered_file(nine_nodes: dict[str, Any], tmp_path: Path) -> None:
    """The DaemonSet's command with the rendered file and per-pod environment; only the ports (0: any free
    one), the metrics endpoint and the mounted token's path (the Secret's file is not at /etc here) are
    overridden so the test runs anywhere. The rendered agent requires the cluster token."""
    nine_nodes["spec"]["kvCache"] = {"l2Tokens": 16384, "l1Tokens": 4096}
    nine_nodes["spec"]["eviction"] = {"policy": "lru"}
    _, agent_file = _write_configmap(_ctx(nine_nodes), tmp_path)
    token = "rendered-cluster-token-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    processes = _harness_processes()
    [agent] = processes.start_agents(
        {"ignored": Phase.PREFILL},
        settings_file=agent_file,
        env={"EVOLVING_NODE_NODE": "gpu-node-3", "EVOLVING_NODE_HOST": "127.0.0.1",
             "EVOLVING_NODE_CLUSTER_TOKEN_FILE": str(tmp_path / "token")},  # fmt: skip
        memory_args=(),
        identity_args=False,
    )
    try:
        info = agent.info
        assert (info["node"], info["profile"]) == ("gpu-node-3", "glm-5.2-4xgb300-tp4")
        assert (info["l2_pages"], info["l1_pages"]) == (16384 // 64, 4096 // 64)
        with grpc.insecure_channel(agent.address) as channel:
            stub = rpc.NodeAgentStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetState(pb.GetStateRequest(), timeout=5)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
            state = stub.GetState(pb.GetStateRequest(), timeout=5, metadata=(("authorization", "Bearer " + token),))
        assert state.node == "gpu-node-3"
        # The DaemonSet's probes ask gRPC health for these service names; the agent answers SERVING.
        probes = build_node_agent_daemonset(_ctx(nine_nodes))["spec"]["template"]["spec"]["containers"][0]
        for probe in (probes["livenessProbe"], probes["readinessProbe"]):
            with grpc.insecure_channel(agent.address) as channel:
                answer = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")), timeout=5
                )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, probe
    finally:
        assert agent.stop() == 0


def test_the_crd_names_exactly_the_declared_built_in_policies() -> None:
    """The CR's policy enums and the policy registries agree (the CRD schema is generated from these enums)."""
    from evolving_infra.router.planner.base import PlannerName
    from evolving_infra.router.planner.registry import PLANNERS
    from evolving_infra.router.routing.base import DecodePolicyName, PrefillPolicyName
    from evolving_infra.router.routing.registry import DECODE_BINDING, PREFILL_ROUTING

    builtin = lambda registry: [s.name for s in registry.specs if not s.module.startswith("evolving_plugin")]  # noqa: E731
    assert [n.value for n in PlannerName] == builtin(PLANNERS)
    assert [n.value for n in PrefillPolicyName] == builtin(PREFILL_ROUTING)
    assert [n.value for n in DecodePolicyName] == builtin(DECODE_BINDING)


def test_the_crds_policy_fields_are_generated_from_the_declarations() -> None:
    """Each policy field of the CRD lists the built-in declarations' names, and its description their summaries;
    a built-in declared without a value in the CR's enum fails the generation, naming the field."""
    from evolving_infra.core.plugins import PolicyKind, PolicySpec
    from evolving_infra.operator import crdgen

    registries = crdgen._registries()
    schema = crdgen.spec_schema()
    for path, kind, _ in crdgen.POLICY_FIELDS:
        node = schema
        for key in path:
            node = node["properties"][key]
        declared = crdgen.built_in(registries[kind])
        assert node["enum"] == [s.name for s in declared], path
        assert all(f"{s.name}: {s.summary}" in node["description"] for s in declared), path
    eviction = registries[PolicyKind.EVICTION]
    extra = PolicySpec(PolicyKind.EVICTION, "fifo", "first in, first out", dict, lambda s, r: None, frozenset(),
                       "evolving_infra.core.extra")  # fmt: skip
    eviction.specs.append(extra)
    try:
        with pytest.raises(ValueError, match=r"spec.eviction.policy: the model allows .* declarations are .*fifo"):
            crdgen.spec_schema()
    finally:
        eviction.specs.remove(extra)


def test_an_unknown_planner_or_routing_policy_in_a_cr_is_refused_naming_it(nine_nodes: dict[str, Any]) -> None:
    from pydantic import ValidationError

    from evolving_infra.operator.spec import AgentServingClusterSpec

    for path, bad in ((("planner", "policy"), "magic"), (("routing", "prefillPolicy"), "fastest")):
        spec = copy.deepcopy(nine_nodes["spec"])
        spec[path[0]][path[1]] = bad
        with pytest.raises(ValidationError) as info:
            AgentServingClusterSpec.model_validate(spec)
        assert any(tuple(e["loc"][:2]) == path for e in info.value.errors()), info.value
        assert bad in str(info.value)


def test_a_crs_policy_settings_reach_the_router_and_bad_ones_make_the_cluster_invalid(nine_nodes: dict[str, Any]) -> None:
    """planner.settings, routing.prefillSettings and routing.decodeSettings carry a policy's declared fields to
    the router's settings file; a key the declaration lacks, or a bad value, is an `Invalid` problem naming it."""
    from evolving_infra.operator.rendered import render_router_settings
    from evolving_infra.operator.semantics import validate_spec_semantics
    from evolving_infra.router.service.settings import RouterSettings

    raw = copy.deepcopy(nine_nodes["spec"])
    raw["routing"] = {"prefillPolicy": "cache-aware", "prefillSettings": {"balance_abs_threshold": 8, "gate": "global"},
                      "decodePolicy": "power-of-two"}  # fmt: skip
    raw["planner"] = {**raw.get("planner", {}), "policy": "dynamo", "settings": {"interval_s": 2.5}}
    spec = AgentServingClusterSpec.model_validate(raw)
    assert validate_spec_semantics(spec) == []
    rendered = render_router_settings(ClusterRef("default", "c", "uid-1"), spec)
    assert rendered["routing_settings"] == {"balance_abs_threshold": 8, "gate": "global"}
    assert rendered["planner_settings"]["interval_s"] == 2.5
    router = RouterSettings(**rendered)
    assert router.routing_settings["balance_abs_threshold"] == 8 and router.planner == "dynamo"

    for where, settings, message in (
        ("prefillSettings", {"nonsense": 1}, r"routing.prefillSettings: unknown setting\(s\) nonsense"),
        ("prefillSettings", {"balance_abs_threshold": -1}, r"routing.prefillSettings.*balance_abs_threshold must be >= 0"),
        ("decodeSettings", {"x": 1}, r"routing.decodeSettings: unknown setting\(s\) x"),
    ):
        bad = copy.deepcopy(raw)
        bad["routing"][where] = settings
        problems = validate_spec_semantics(AgentServingClusterSpec.model_validate(bad))
        assert len(problems) == 1 and __import__("re").search(message, problems[0]), problems


def test_node_agents_accept_fetches_only_from_members_of_their_cluster(nine_nodes: dict[str, Any]) -> None:
    """The rendered node agents check a fetch's peer address against their cluster's node-agent Service."""
    from evolving_infra.operator.rendered import NODE_AGENT_GRPC_PORT, node_agent_service_host, render_node_agent_settings

    cluster = ClusterRef("ns1", "c9", "uid-9")
    spec = AgentServingClusterSpec.model_validate(copy.deepcopy(nine_nodes["spec"]))
    rendered = render_node_agent_settings(cluster, spec, None)
    assert rendered["peer_service"] == f"{node_agent_service_host(cluster)}:{NODE_AGENT_GRPC_PORT}"
    assert agent_settings.NodeAgentSettings(node="n0", **rendered).peer_service == rendered["peer_service"]
