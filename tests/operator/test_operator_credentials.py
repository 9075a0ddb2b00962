"""Credentials in Kubernetes (issue 17): the operator renders the cluster token (and mutual TLS, and the
router's API keys) from Secrets into the router and the node agents, `insecure` only when the CR asks, and
presents the token itself on its own calls to the node agents.

- Rendering: the settings files name exactly the files the workloads mount from the Secrets (default names
  `<cluster>-cluster-token`, `<cluster>-api-keys`; cert-manager's keys for TLS), both services load them,
  and `security.peerNetworks` is checked;
- the operator's Secret reader: a missing Secret, key or a malformed token is an error naming it;
- live (KMock's Kubernetes emulator, real node agent processes that require the token on 127.0.0.1): the
  operator reads the cluster's token Secret and places the initial split; without the Secret or with a
  wrong token it calls nothing / is refused, and says why in the cluster's nodes.
"""

from __future__ import annotations

import base64
import importlib.util
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.node_agent.api.auth import AuthMode, load_credentials
from evolving_infra.node_agent.service import settings as agent_settings
from evolving_infra.operator import kube
from evolving_infra.operator.builders import BuildContext, build_node_agent_daemonset, build_router_deployment
from evolving_infra.operator.credentials import CredentialsUnavailable, cluster_credentials
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.reconcile import reconcile
from evolving_infra.operator.rendered import ANY_ADDRESS, render_node_agent_settings, render_router_settings
from evolving_infra.operator.semantics import builtin_profile_table
from evolving_infra.operator.spec import AgentServingClusterSpec
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.router.service import settings as router_settings


def _harness() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


H = _harness()
processes = H.load_helper("node_agent_processes")
NS = H.NAMESPACE
PROFILE = "glm-5.2-4xgb300-tp4"
CLUSTER = ClusterRef("glm-9", "agents", "00000000-0000-0000-0000-000000000009")
TOKEN = "operator-test-cluster-token-0123456789"


def _ctx(security: dict[str, Any] | None = None) -> BuildContext:
    raw: dict[str, Any] = {
        "nodeSelector": {"matchLabels": {"pool": "a"}}, "nodeCount": 3, "engine": {"profile": PROFILE},
        "initialSplit": {"prefill": 1, "decode": 2},
    }  # fmt: skip
    if security is not None:
        raw["security"] = security
    profile = builtin_profile_table()[PROFILE]
    return BuildContext(CLUSTER, AgentServingClusterSpec.from_kube(raw), profile, "evolving-infra:test")


def _mounted(pod: dict[str, Any]) -> dict[str, str]:
    """Every file the pod's container sees from a Secret: path -> 'secret/key'."""
    [container] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert mount["readOnly"] is True and secret["defaultMode"] == 0o440
        for item in secret["items"]:
            out[f"{mount['mountPath']}/{item['path']}"] = f"{secret['secretName']}/{item['key']}"
    return out


def _load(tmp: Path, name: str, data: dict[str, Any], module: Any) -> Any:
    path = tmp / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return module.load_settings(path)


def test_a_secure_cluster_renders_the_token_and_api_keys_from_their_secrets(tmp_path: Path) -> None:
    ctx = _ctx()
    router = _load(tmp_path, "router.yaml", render_router_settings(ctx.cluster, ctx.spec), router_settings)
    agent = _load(tmp_path, "agent.yaml", render_node_agent_settings(ctx.cluster, ctx.spec, ctx.profile), agent_settings)
    assert router.insecure is False and agent.insecure is False
    router_files = _mounted(build_router_deployment(ctx)["spec"]["template"]["spec"])
    agent_files = _mounted(build_node_agent_daemonset(ctx)["spec"]["template"]["spec"])
    # every credential file a service is told to read is a Secret's key mounted at that path
    assert router_files == {str(router.cluster_token_file): "glm-9-cluster-token/token", str(router.api_key_file): "glm-9-api-keys/api-keys"}
    assert agent_files == {str(agent.cluster_token_file): "glm-9-cluster-token/token"}
    assert router.tls_cert_file is None and agent.tls_cert_file is None
    assert agent.peer_networks == list(ANY_ADDRESS)


def test_tls_from_a_cert_manager_secret_and_named_secrets(tmp_path: Path) -> None:
    ctx = _ctx({"clusterTokenSecret": "shared-token", "tlsSecret": "glm-9-tls", "apiKeysSecret": "keys", "peerNetworks": ["10.244.0.0/16"]})
    router = _load(tmp_path, "router.yaml", render_router_settings(ctx.cluster, ctx.spec), router_settings)
    agent = _load(tmp_path, "agent.yaml", render_node_agent_settings(ctx.cluster, ctx.spec, ctx.profile), agent_settings)
    for service, workload in ((router, build_router_deployment(ctx)), (agent, build_node_agent_daemonset(ctx))):
        files = _mounted(workload["spec"]["template"]["spec"])
        assert files[str(service.cluster_token_file)] == "shared-token/token"
        assert files[str(service.tls_cert_file)] == "glm-9-tls/tls.crt"
        assert files[str(service.tls_key_file)] == "glm-9-tls/tls.key"
        assert files[str(service.tls_ca_file)] == "glm-9-tls/ca.crt"
    assert _mounted(build_router_deployment(ctx)["spec"]["template"]["spec"])[str(router.api_key_file)] == "keys/api-keys"
    assert agent.peer_networks == ["10.244.0.0/16"]
    # members dial pod IPs and check the name the certificate carries: the node agents' Service
    assert router.tls_server_name == agent.tls_server_name == "glm-9-node-agent.agents.svc"
    with pytest.raises(ValueError, match=r"security.peerNetworks\[0\]"):
        bad = _ctx({"peerNetworks": ["10.0.0.0/33"]})
        render_node_agent_settings(bad.cluster, bad.spec, bad.profile)


def test_insecure_only_when_the_cr_asks(tmp_path: Path) -> None:
    ctx = _ctx({"insecure": True, "clusterTokenSecret": "ignored"})
    router = _load(tmp_path, "router.yaml", render_router_settings(ctx.cluster, ctx.spec), router_settings)
    agent = _load(tmp_path, "agent.yaml", render_node_agent_settings(ctx.cluster, ctx.spec, ctx.profile), agent_settings)
    assert router.insecure is True and agent.insecure is True
    assert router.cluster_token_file is None and router.api_key_file is None and agent.cluster_token_file is None
    for workload in (build_router_deployment(ctx), build_node_agent_daemonset(ctx)):
        assert _mounted(workload["spec"]["template"]["spec"]) == {}


class _Secrets:
    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets

    async def get(self, kind: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert kind.kind == "Secret" and namespace == CLUSTER.namespace
        data = self.secrets.get(name)
        return None if data is None else {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


@pytest.mark.asyncio
async def test_the_operator_reads_the_token_and_names_what_is_wrong() -> None:
    spec = _ctx().spec
    creds = await cluster_credentials(_Secrets({"glm-9-cluster-token": {"token": TOKEN + "\n"}}), CLUSTER, spec)
    assert creds is not None and creds.token == TOKEN and creds.tls is None
    assert await cluster_credentials(_Secrets({}), CLUSTER, _ctx({"insecure": True}).spec) is None
    for secrets, fault in (
        ({}, "Secret agents/glm-9-cluster-token does not exist"),
        ({"glm-9-cluster-token": {"other": TOKEN}}, "has no key 'token'"),
        ({"glm-9-cluster-token": {"token": "short"}}, "16-4096 characters"),
    ):
        with pytest.raises(CredentialsUnavailable, match=fault):
            await cluster_credentials(_Secrets(secrets), CLUSTER, spec)
    tls_spec = _ctx({"tlsSecret": "t"}).spec
    with pytest.raises(CredentialsUnavailable, match="Secret agents/t has no key 'ca.crt'"):
        await cluster_credentials(_Secrets({"glm-9-cluster-token": {"token": TOKEN}, "t": {"tls.crt": "c", "tls.key": "k"}}), CLUSTER, tls_spec)
    both = await cluster_credentials(
        _Secrets({"glm-9-cluster-token": {"token": TOKEN}, "t": {"tls.crt": "c", "tls.key": "k", "ca.crt": "a"}}), CLUSTER, tls_spec
    )
    assert both is not None and both.mode is AuthMode.TLS_AND_TOKEN and both.server_name == "glm-9-node-agent.agents.svc"


# --- live: the operator's own calls carry the cluster token ------------------------------------------------
def _secret(name: str, token: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "type": "Opaque",
            "data": {"token": base64.b64encode(token.encode()).decode()}}  # fmt: skip


def _serving(address: str) -> tuple[NodeMode, int]:
    with grpc.insecure_channel(address) as channel:
        state = rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=5, metadata=(("authorization", "Bearer " + TOKEN),))
    return NodeMode(pb.NodeMode.Name(state.mode).removeprefix("NODE_MODE_").lower()), int(state.generation)


async def _secure_cluster(h: Any, name: str, handles: dict[str, Any]) -> None:
    for node in handles:
        await h.add_node(node, name)
    await h.create(H.cluster_object(name, name, prefill=1, decode=1, security={}))
    await reconcile(h.rt, NS, name)
    await h.wait_for("router deployment", lambda: h.emulator.live("apps/v1/deployments", NS, f"{name}-router"))
    await h.router_available(name)
    for node, handle in sorted(handles.items()):
        await h.add_agent_pod(name, node, handle.host, handle.port)


async def _nodes(h: Any, name: str) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in ((await h.cluster(name)).get("status") or {}).get("nodes") or ()}


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_the_operator_places_a_secure_cluster_with_the_token_from_its_secret(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert load_credentials(token_file).mode is AuthMode.TOKEN
    names = ["sec-n0", "sec-n1"]
    handles = {hd.node: hd for hd in processes.start_agents(dict.fromkeys(names, NodeMode.COLLOCATED),
                                                             extra_args=("--cluster-token-file", str(token_file)))}  # fmt: skip
    try:
        async with H.operator_running(run=False) as h:
            await _secure_cluster(h, "sec", handles)
            # no Secret yet: the operator calls nothing and says why
            await reconcile(h.rt, NS, "sec", attempt=2)
            assert {_serving(hd.address) for hd in handles.values()} == {(NodeMode.COLLOCATED, 0)}
            conditions = {c["type"]: c for c in (await h.cluster("sec"))["status"]["conditions"]}
            assert conditions["Degraded"]["status"] == "True", conditions
            assert "Secret serving/sec-cluster-token does not exist" in conditions["Degraded"]["message"], conditions
            # a wrong token: the agents refuse the operator (UNAUTHENTICATED), nothing switches
            await h.create(_secret("sec-cluster-token", "a-wrong-token-of-enough-length"))
            await reconcile(h.rt, NS, "sec", attempt=2)
            assert {_serving(hd.address) for hd in handles.values()} == {(NodeMode.COLLOCATED, 0)}
            conditions = {c["type"]: c for c in (await h.cluster("sec"))["status"]["conditions"]}
            assert "UNAUTHENTICATED" in conditions["Degraded"]["message"], conditions
            # the right token (rotated in place): the initial split is placed
            await h.api.delete(kube.SECRET, NS, "sec-cluster-token")
            await h.create(_secret("sec-cluster-token", TOKEN))
            await reconcile(h.rt, NS, "sec", attempt=0)
            assert _serving(handles["sec-n0"].address) == (NodeMode.PREFILL, 1)
            assert _serving(handles["sec-n1"].address) == (NodeMode.DECODE, 1)
            assert {n["phase"] for n in (await _nodes(h, "sec")).values()} == {Phase.PREFILL.value, Phase.DECODE.value}
    finally:
        codes = [hd.stop() for hd in handles.values()]
        assert codes == [0, 0]
