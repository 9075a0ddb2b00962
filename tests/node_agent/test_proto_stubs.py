"""The checked-in gRPC stubs are current, importable under `evolving_infra.proto.v1`, and name the API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUBS = ("node_agent_pb2.py", "node_agent_pb2.pyi", "node_agent_pb2_grpc.py")


def test_checked_in_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) generates the stubs")
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gen-proto.sh"), str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    stale = [name for name in STUBS if (tmp_path / name).read_bytes() != (REPO / "proto" / "v1" / name).read_bytes()]
    assert not stale, f"stale generated stubs {stale}: run scripts/gen-proto.sh and commit the result"


def test_stubs_import_under_the_namespace() -> None:
    from evolving_infra.proto.v1 import node_agent_pb2, node_agent_pb2_grpc

    assert node_agent_pb2.DESCRIPTOR.package == "evolving_infra.v1"
    assert node_agent_pb2.DESCRIPTOR.name == "evolving_infra/proto/v1/node_agent.proto"
    assert node_agent_pb2_grpc.NodeAgentStub.__module__ == "evolving_infra.proto.v1.node_agent_pb2_grpc"


def test_service_has_the_node_agent_rpcs_with_their_stream_shapes() -> None:
    from evolving_infra.proto.v1 import node_agent_pb2

    service = node_agent_pb2.DESCRIPTOR.services_by_name["NodeAgent"]
    shapes = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert shapes == {
        "SwitchPhase": (False, False),
        "GetState": (False, False),
        "SubmitPrefill": (False, False),
        "SubmitDecode": (False, True),
        "ReadPages": (False, True),
        "GetTransferEndpoint": (False, False),
        "StreamEvents": (False, True),
        "PushCounts": (True, False),
        "Cancel": (False, False),
    }


def test_every_enum_starts_with_an_unspecified_zero() -> None:
    from evolving_infra.proto.v1 import node_agent_pb2

    for enum in node_agent_pb2.DESCRIPTOR.enum_types_by_name.values():
        assert enum.values_by_number[0].name.endswith("_UNSPECIFIED"), enum.name
