"""The gRPC fallback transport between two arenas in one process, over a real server on 127.0.0.1:
pages arrive intact (checksums), including a multi-MiB run; failures leave nothing reserved; the server
answers health checks and reflection."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.api.pages_service import PagesServicer
from evolving_infra.node_agent.api.server import SERVICE_NAME, RunningServer, start_server
from evolving_infra.node_agent.transfer import (
    ChecksumMismatch,
    GrpcTransport,
    KvArena,
    PagesMissing,
    TransferFailed,
    TransportKind,
    TransportSettings,
    demo_chain,
    emulated_checksum,
    make_transport,
)
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

MIB = 1 << 20


@pytest.fixture
def peer() -> Iterator[tuple[KvArena, RunningServer]]:
    arena = KvArena(96, 64 * 1024)
    for page in demo_chain(80):
        arena.store_emulated(page)
    running = start_server(PagesServicer(arena, "peer-0"), workers=4)
    yield arena, running
    running.stop(grace=None)


def assert_intact(arena: KvArena, pages: tuple[PageHash, ...]) -> None:
    for page in pages:
        assert arena.locate(page).checksum == emulated_checksum(page, arena.page_bytes)
        assert arena.verify(page)


@pytest.mark.parametrize("chunk", [MIB, 48 * 1024, 200 * 1024])
def test_a_multi_mib_run_arrives_intact(peer: tuple[KvArena, RunningServer], chunk: int) -> None:
    _, running = peer
    pages = demo_chain(80)  # 5 MiB in 64 KiB pages
    local = KvArena(100, 64 * 1024)
    transport = GrpcTransport(local, chunk_bytes=chunk)
    try:
        result = transport.read_pages(running.address, pages)
    finally:
        transport.close()
    assert result.moved == pages and result.bytes == 80 * 64 * 1024
    assert result.requests == -(-result.bytes // chunk)
    assert_intact(local, pages)
    local.check_invariants()


def test_pages_already_held_are_not_read_again(peer: tuple[KvArena, RunningServer]) -> None:
    _, running = peer
    pages = demo_chain(10)
    local = KvArena(16, 64 * 1024)
    local.store_emulated(pages[3])
    with_transport = make_transport(TransportSettings(kind=TransportKind.GRPC), local)
    result = with_transport.read_pages(running.address, pages)
    with_transport.close()
    assert result.present == (pages[3],) and result.moved == pages[:3] + pages[4:]
    assert_intact(local, pages)


def test_missing_pages_fail_cleanly(peer: tuple[KvArena, RunningServer]) -> None:
    _, running = peer
    wanted = demo_chain(3) + (PageHash(12345),)
    local = KvArena(8, 64 * 1024)
    transport = GrpcTransport(local)
    with pytest.raises(PagesMissing, match="0x0000000000003039"):
        transport.read_pages(running.address, wanted)
    transport.close()
    assert local.gauges().free == 8, "no slot stays reserved after a failed read"


def test_a_page_damaged_at_the_peer_is_caught_by_its_checksum(peer: tuple[KvArena, RunningServer]) -> None:
    arena, running = peer
    pages = demo_chain(4)
    arena.slot_view(arena.locate(pages[2]).slot)[100] ^= 0x5A
    local = KvArena(8, 64 * 1024)
    transport = GrpcTransport(local)
    with pytest.raises(ChecksumMismatch, match=f"page {pages[2]:#018x}"):
        transport.read_pages(running.address, pages)
    transport.close()
    assert set(local.pages()) == set(pages[:2]), "pages before the damaged one are intact and kept"
    local.check_invariants()
    assert local.gauges().reserved == 0


def test_a_dead_peer_is_a_transfer_failure() -> None:
    running = start_server(PagesServicer(KvArena(1, 64), "gone"))
    address = running.address
    running.stop(grace=None)
    transport = GrpcTransport(KvArena(1, 64), timeout=5)
    with pytest.raises(TransferFailed, match="UNAVAILABLE"):
        transport.read_pages(address, [PageHash(1)])
    transport.close()


def test_transfer_endpoint_describes_the_arena(peer: tuple[KvArena, RunningServer]) -> None:
    arena, running = peer
    pages = demo_chain(2)
    with grpc.insecure_channel(running.address) as channel:
        endpoint = rpc.NodeAgentStub(channel).GetTransferEndpoint(
            pb.GetTransferEndpointRequest(pages=[*pages, 77])
        )
    assert endpoint.node == "peer-0" and endpoint.mooncake_address == ""
    assert list(endpoint.transports) == [pb.TRANSPORT_KIND_GRPC]
    assert (endpoint.buffer_base, endpoint.buffer_length) == (arena.base_address, arena.nbytes)
    assert (endpoint.slot_bytes, endpoint.slots) == (64 * 1024, 96)
    assert [(loc.page, loc.slot, loc.checksum) for loc in endpoint.locations] == [
        (p, arena.locate(p).slot, arena.locate(p).checksum) for p in pages
    ]
    assert list(endpoint.missing) == [77]


def test_the_rest_of_the_service_answers_unimplemented(peer: tuple[KvArena, RunningServer]) -> None:
    _, running = peer
    with grpc.insecure_channel(running.address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest())
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_health_and_reflection_answer(peer: tuple[KvArena, RunningServer]) -> None:
    _, running = peer
    with grpc.insecure_channel(running.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert SERVICE_NAME in services and "grpc.health.v1.Health" in services
        assert ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol(SERVICE_NAME).package == (
            "evolving_infra.v1"
        )


def test_servers_never_bind_the_wildcard_address() -> None:
    for host in ("0.0.0.0", "::", ""):
        with pytest.raises(ValueError, match="wildcard"):
            start_server(PagesServicer(KvArena(1, 64), "n"), host=host)
