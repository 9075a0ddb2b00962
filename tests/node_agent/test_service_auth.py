"""Hardening of the node agent's gRPC API: credentials on every method, poisoned switch generations
refused, bounded ids and numbers, peer addresses only within the cluster.

Live parts run in-process nodes on 127.0.0.1 (every wait bounded); the generation rules and the message
validation are property-tested (hypothesis) as pure functions.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.types import NodeId, NodeMode, Phase
from evolving_infra.node_agent.api.auth import (
    AuthMode,
    ClusterCredentials,
    CredentialsError,
    blocking_channel,
    load_credentials,
    token_matches,
)
from evolving_infra.node_agent.api.convert import decode_request_from_proto, prefill_request_from_proto
from evolving_infra.node_agent.api.limits import MAX_GENERATION
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.node_agent.service.mover import PeerPolicy, UnknownPeer
from evolving_infra.node_agent.service.switch_generations import MAX_GENERATION_STEP, Generation, SwitchAction, decide_switch
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

TOKEN = "cluster-token-0123456789abcdef"
METHODS = [m.name for m in pb.DESCRIPTOR.services_by_name["NodeAgent"].methods]


def settings_for(tmp: Path, **extra: Any) -> NodeAgentSettings:
    values: dict[str, Any] = dict(
        node="a", mode=NodeMode.PREFILL, grpc_port=0, metrics_port=0, metrics_enabled=False, speed_up=20.0,
        l2_pages=512, l1_pages=512, page_bytes=256, state_interval_s=0,
    )  # fmt: skip
    values.update(extra)
    return NodeAgentSettings(**values)


def token_file(tmp: Path, token: str = TOKEN) -> Path:
    path = tmp / "token"
    path.write_text(token + "\n")
    return path


async def call(stub: rpc.NodeAgentStub, method: str, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    """Call `method` with a harmless request; the status it ends with (OK when it answered)."""
    try:
        if method == "PushCounts":

            async def updates():  # type: ignore[no-untyped-def]
                yield pb.CountUpdate(sequence=1)

            await stub.PushCounts(updates(), metadata=metadata, timeout=5)
        elif method in ("SubmitDecode", "ReadPages", "StreamEvents"):
            request: Any = {
                "SubmitDecode": pb.SubmitDecodeRequest(),
                "ReadPages": pb.ReadPagesRequest(),
                "StreamEvents": pb.StreamEventsRequest(subscriber="t"),
            }[method]
            stream = getattr(stub, method)(request, metadata=metadata, timeout=5)
            async for _ in stream:
                stream.cancel()
                break
        else:
            request = {
                "SwitchPhase": pb.SwitchPhaseRequest(target=pb.PHASE_PREFILL, generation=0),
                "GetState": pb.GetStateRequest(),
                "SubmitPrefill": pb.SubmitPrefillRequest(),
                "GetTransferEndpoint": pb.GetTransferEndpointRequest(),
                "Cancel": pb.CancelRequest(request_id="absent"),
            }[method]
            await getattr(stub, method)(request, metadata=metadata, timeout=5)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


# --- credentials ------------------------------------------------------------------------------------
def test_a_node_without_credentials_refuses_to_start_unless_insecure(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="--insecure"):
        load_credentials()
    assert load_credentials(insecure=True).mode is AuthMode.INSECURE
    assert load_credentials(token_file(tmp_path)).mode is AuthMode.TOKEN
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(CredentialsError, match="16-4096"):
        load_credentials(short)
    with pytest.raises(CredentialsError, match="cannot read"):
        load_credentials(tmp_path / "absent")
    with pytest.raises(CredentialsError, match="all three"):
        load_credentials(tls_cert_file=token_file(tmp_path))

    async def start() -> None:
        node = NodeAgent(settings_for(tmp_path))
        await node.start()

    with pytest.raises(CredentialsError):
        asyncio.run(start())


def test_cli_exits_2_without_credentials() -> None:
    argv = [sys.executable, "-P", "-m", "evolving_infra.cli.main", "node-agent", "serve", "--grpc-port", "0", "--metrics-port", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--insecure" in done.stderr


def test_token_comparison() -> None:
    assert token_matches("Bearer " + TOKEN, TOKEN)
    assert not token_matches(TOKEN, TOKEN)
    assert not token_matches("Bearer " + TOKEN[:-1], TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches("Bearer " + TOKEN + "x", TOKEN)


async def token_scenario(tmp: Path) -> dict[str, Any]:
    node = NodeAgent(settings_for(tmp, cluster_token_file=token_file(tmp)))
    await node.start()
    out: dict[str, Any] = {}
    try:
        async with grpc.aio.insecure_channel(node.address) as channel:
            stub = rpc.NodeAgentStub(channel)
            good = (("authorization", "Bearer " + TOKEN),)
            out["none"] = {m: await call(stub, m) for m in METHODS}
            out["wrong"] = {m: await call(stub, m, (("authorization", "Bearer " + TOKEN[::-1]),)) for m in METHODS}
            out["good"] = {m: await call(stub, m, good) for m in METHODS}
            health = health_pb2_grpc.HealthStub(channel)
            out["health"] = (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status
            # the attack of issue 17: a huge generation, with and without the token
            attack = pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=2**64 - 1)
            for key, metadata in (("attack_anon", ()), ("attack_auth", good)):
                try:
                    await stub.SwitchPhase(attack, metadata=metadata, timeout=5)
                    out[key] = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as error:
                    out[key] = error.code()
            step = pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=MAX_GENERATION_STEP + 1)
            try:
                await stub.SwitchPhase(step, metadata=good, timeout=5)
                out["too_far"] = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                out["too_far"] = error.code()
            state = await stub.GetState(pb.GetStateRequest(), metadata=good, timeout=5)
            out["after_attack"] = (state.mode, state.generation)
            # a (credentialed) caller moves the node within the step; the owner recovers with max + 1
            await stub.SwitchPhase(pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=777_000), metadata=good, timeout=30)
            gen = (await stub.GetState(pb.GetStateRequest(), metadata=good, timeout=5)).generation
            back = await stub.SwitchPhase(pb.SwitchPhaseRequest(target=pb.PHASE_PREFILL, generation=gen + 1), metadata=good, timeout=30)
            out["recovered"] = (back.phase, back.generation)
        # a peer channel built with the credentials reaches the node
        channel = blocking_channel(node.address, ClusterCredentials(token=TOKEN))
        try:
            out["blocking"] = await asyncio.to_thread(lambda: rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=5).node)
        finally:
            channel.close()
        out["denied_metric"] = node.metrics.denied._value.get()
        out["invalid_metric"] = node.metrics.invalid.labels("SwitchPhase")._value.get()
    finally:
        await node.close()
    return out


def test_without_the_token_every_method_is_denied_and_the_generation_attack_is_refused(tmp_path: Path) -> None:
    out = asyncio.run(asyncio.wait_for(token_scenario(tmp_path), 60))
    assert out["none"] == {m: grpc.StatusCode.UNAUTHENTICATED for m in METHODS}
    assert out["wrong"] == {m: grpc.StatusCode.UNAUTHENTICATED for m in METHODS}
    assert all(code is not grpc.StatusCode.UNAUTHENTICATED for code in out["good"].values()), out["good"]
    assert out["health"] == health_pb2.HealthCheckResponse.SERVING
    assert out["attack_anon"] == grpc.StatusCode.UNAUTHENTICATED
    assert out["attack_auth"] == grpc.StatusCode.INVALID_ARGUMENT
    assert out["too_far"] == grpc.StatusCode.INVALID_ARGUMENT
    assert out["after_attack"] == (pb.NODE_MODE_PREFILL, 0)
    assert out["recovered"] == (pb.PHASE_PREFILL, 777_001)
    assert out["blocking"] == "a"
    assert out["denied_metric"] >= 2 * len(METHODS) + 1
    assert out["invalid_metric"] == 2


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca_and_cert(tmp: Path, san: str = "IP:127.0.0.1,DNS:localhost") -> tuple[Path, Path, Path]:
    """A throwaway CA and one certificate for `san` (default 127.0.0.1) signed by it (openssl CLI)."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=test-ca", cwd=tmp)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node", cwd=tmp)
    (tmp / "ext.cnf").write_text(f"subjectAltName={san}\n")
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "node.pem",
             "-days", "1", "-extfile", "ext.cnf", cwd=tmp)  # fmt: skip
    return tmp / "node.pem", tmp / "node.key", tmp / "ca.pem"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make test certificates")
def test_mutual_tls_requires_a_client_certificate_from_the_cluster_ca(tmp_path: Path) -> None:
    cert, key, ca = make_ca_and_cert(tmp_path)

    async def scenario() -> dict[str, Any]:
        node = NodeAgent(settings_for(tmp_path, tls_cert_file=cert, tls_key_file=key, tls_ca_file=ca))
        await node.start()
        out: dict[str, Any] = {}
        try:
            port = node.address.rsplit(":", 1)[1]
            server_only = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", server_only) as channel:
                out["no_client_cert"] = await call(rpc.NodeAgentStub(channel), "GetState")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                out["plaintext"] = await call(rpc.NodeAgentStub(channel), "GetState")
            creds = load_credentials(tls_cert_file=cert, tls_key_file=key, tls_ca_file=ca)
            channel = blocking_channel(f"127.0.0.1:{port}", creds)
            try:
                out["mtls"] = await asyncio.to_thread(
                    lambda: rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=10).node
                )
            finally:
                channel.close()
        finally:
            await node.close()
        return out

    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert out["no_client_cert"] is grpc.StatusCode.UNAVAILABLE
    assert out["plaintext"] is grpc.StatusCode.UNAVAILABLE
    assert out["mtls"] == "a"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make test certificates")
def test_mutual_tls_checks_the_service_name_the_certificates_carry_not_the_pod_address(tmp_path: Path) -> None:
    """As in Kubernetes: one certificate naming the node agents' Service (no IP), members dialled by address."""
    from evolving_infra.router.service.client import load_node_credentials, open_channel

    service = "c-node-agent.serving.svc"
    cert, key, ca = make_ca_and_cert(tmp_path, f"DNS:{service}")

    async def scenario() -> dict[str, Any]:
        node = NodeAgent(settings_for(tmp_path, tls_cert_file=cert, tls_key_file=key, tls_ca_file=ca, tls_server_name=service))
        await node.start()
        out: dict[str, Any] = {}
        try:
            address = "127.0.0.1:" + node.address.rsplit(":", 1)[1]
            for label, name in (("named", service), ("by_address", None), ("wrong_name", "other.serving.svc")):
                creds = load_credentials(tls_cert_file=cert, tls_key_file=key, tls_ca_file=ca, tls_server_name=name)
                channel = blocking_channel(address, creds)  # a peer node agent's or the operator's channel
                try:
                    out[label] = await asyncio.to_thread(lambda: rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=5).node)
                except grpc.RpcError as error:
                    out[label] = error.code()
                finally:
                    channel.close()
            router_creds = load_node_credentials(None, cert, key, ca, False, service)
            async with open_channel(address, router_creds) as channel:  # the router's channel
                out["router"] = (await rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=5)).node
        finally:
            await node.close()
        return out

    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert out["named"] == "a" and out["router"] == "a"
    assert out["by_address"] is grpc.StatusCode.UNAVAILABLE  # the address is in no certificate
    assert out["wrong_name"] is grpc.StatusCode.UNAVAILABLE


# --- generations ------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([Phase.PREFILL, Phase.DECODE]), st.integers(0, 2**64 - 1) | st.integers(0, 3 * MAX_GENERATION_STEP)), max_size=40))
def test_generations_stay_monotone_bounded_and_step_limited(calls: list[tuple[Phase, int]]) -> None:
    gen, mode = Generation(), NodeMode.PREFILL
    for target, generation in calls:
        decision = decide_switch(gen, mode, None, target, generation)
        if decision.action in (SwitchAction.SWITCH, SwitchAction.ADOPT):
            assert gen.value <= generation <= min(MAX_GENERATION, gen.value + MAX_GENERATION_STEP)
            gen, mode = Generation(generation, True), NodeMode.of(target)
        if generation > MAX_GENERATION or generation > gen.value + MAX_GENERATION_STEP:
            assert decision.action is SwitchAction.INVALID
        assert gen.value <= MAX_GENERATION and gen.value + 1 < 2**64


# --- validation of messages -------------------------------------------------------------------------
_text = st.text(st.characters(codec="utf-8"), max_size=300) | st.sampled_from(["", "x" * 100_000, "a\x00b", "ok"])
_numbers = st.integers(0, 2**32 - 1)
_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -1.0, math.inf, 1.0])


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    runs = draw(st.lists(st.builds(pb.FetchRun, peer=_text, pages=st.lists(st.integers(0, 2**64 - 1), max_size=4),
                                   peer_address=_text), max_size=3))  # fmt: skip
    return dict(
        request_id=draw(_text), branch_id=draw(_text), prompt_pages=draw(st.lists(st.integers(0, 2**64 - 1), max_size=8)),
        prompt_tokens=draw(_numbers), output_tokens=draw(_numbers), t_acc=draw(_floats), fetch=runs,
    )  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(requests())
def test_request_validation_never_crashes_and_bounds_what_it_accepts(fields: dict[str, Any]) -> None:
    for build, convert in ((pb.SubmitPrefillRequest, prefill_request_from_proto), (pb.SubmitDecodeRequest, decode_request_from_proto)):
        try:
            converted = convert(build(**fields))
        except ValueError:
            continue
        req = converted[0] if isinstance(converted, tuple) else converted
        assert 1 <= len(req.request) <= 256 and req.request.isprintable()
        assert math.isfinite(req.t_acc) and req.t_acc > 0


def test_specific_refusals_name_the_field() -> None:
    base = dict(request_id="r", branch_id="b", prompt_tokens=10, output_tokens=1, t_acc=1.0)
    for change, field in (
        ({"request_id": ""}, "request_id"),
        ({"request_id": "x" * 100_000}, "request_id"),
        ({"branch_id": "a\x01"}, "branch_id"),
        ({"t_acc": math.inf}, "t_acc"),
        ({"prompt_tokens": 2**31}, "prompt_tokens"),
    ):
        with pytest.raises(ValueError, match=field):
            prefill_request_from_proto(pb.SubmitPrefillRequest(**{**base, **change}))


def test_peer_addresses_only_within_the_cluster() -> None:
    policy = PeerPolicy({"b": "node-b.svc:50051"}, ["127.0.0.0/8", "10.0.0.0/16"])
    assert policy.check("b", "node-b.svc:50051") == "node-b.svc:50051"
    assert policy.check("b", "127.0.0.1:5") == "127.0.0.1:5"
    assert policy.check("b", "10.0.3.4:50051") == "10.0.3.4:50051"
    for address in ("169.254.169.254:80", "evil.example:443", "10.1.0.1:50051", "[::1]:1", "nohost", "1.2.3.4:99999"):
        with pytest.raises(UnknownPeer):
            policy.check("b", address)


def test_with_a_peer_service_a_fetch_may_name_only_a_member_of_the_cluster() -> None:
    policy = PeerPolicy({}, ["0.0.0.0/0", "::/0"])  # any network, as Kubernetes clusters render it
    policy.members = frozenset({"10.0.3.4", "10.0.3.5"})
    assert policy.check("b", "10.0.3.4:50051") == "10.0.3.4:50051"
    for address in ("10.0.3.6:50051", "169.254.169.254:80", "127.0.0.1:50051"):
        with pytest.raises(UnknownPeer, match="not a member of the cluster"):
            policy.check("b", address)


def test_a_node_agent_learns_its_clusters_members_from_the_peer_service() -> None:
    """`peer_service` resolves to the node agents' addresses (here `localhost`: loopback only); a fetch naming a
    loopback address outside it is refused before any connection is made."""

    async def scenario() -> tuple[frozenset[str] | None, bool]:
        node = NodeAgent(NodeAgentSettings(node="m", mode=NodeMode.PREFILL, grpc_port=0, metrics_port=0,
                                           metrics_enabled=False, insecure=True, peer_service="localhost:50051",
                                           peer_refresh_s=0.05))  # fmt: skip
        await node.start()
        try:
            for _ in range(200):  # the first lookup runs in the background (no fetch allowed before it answers)
                if node.mover.policy.members:
                    break
                await asyncio.sleep(0.01)
            members = node.mover.policy.members
            try:
                node.mover.address_of(NodeId("x"), "127.0.0.2:50051")
                refused = False
            except UnknownPeer:
                refused = True
            await asyncio.sleep(0.12)  # refreshed in the background, still the same members
            assert node.mover.policy.members == members
            return members, refused
        finally:
            await node.close(grace=None)

    members, refused = asyncio.run(scenario())
    assert members is not None and "127.0.0.1" in members and "127.0.0.2" not in members
    assert refused
