"""Mooncake TCP transport between two node-agent processes, and its failure paths.

The Mooncake engine listens on the wildcard address, so every scenario here runs in a child process
inside a private network namespace that has only loopback (`unshare -n` as root, as CI is; `unshare -rn`
otherwise), started by `run_scenario`; the tests skip with the reason where no namespace can be made or
the engine cannot load (libibverbs1 missing). Run this file as a script to run one scenario directly
(it refuses to start outside a loopback-only namespace).
"""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolving_infra.cli.bench_transfer import (
    bring_loopback_up,
    netns_unavailable,
    private_netns_command,
    start_peer,
    stop_peer,
)
from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.transfer import (
    ChecksumMismatch,
    GrpcTransport,
    KvArena,
    MooncakeTransport,
    PagesMissing,
    TransferFailed,
    TransportKind,
    TransportSettings,
    TransportUnavailable,
    demo_chain,
    emulated_checksum,
    make_transport,
    mooncake_unavailable,
)

PAGE_BYTES = 256 * 1024


# --- scenarios (run inside the namespace) -----------------------------------------------------------
def intact(arena: KvArena, pages: tuple[PageHash, ...]) -> bool:
    return all(arena.locate(p).checksum == emulated_checksum(p, arena.page_bytes) and arena.verify(p) for p in pages)


def scenario_two_processes() -> dict:
    """A peer process serves 24 pages (6 MiB); this process reads them with both transports."""
    from evolving_infra.proto.v1 import node_agent_pb2 as pb

    pages = demo_chain(24)
    peer, info = start_peer(len(pages), PAGE_BYTES, mooncake=True)
    out: dict = {}
    try:
        local = KvArena(32, PAGE_BYTES)
        transport = make_transport(TransportSettings(kind=TransportKind.MOONCAKE_TCP), local)
        assert isinstance(transport, MooncakeTransport)
        endpoint = transport.endpoint(info["address"], pages[:2])
        out["endpoint"] = {
            "mooncake_address": endpoint.mooncake_address,
            "transports": list(endpoint.transports),
            "slot_bytes": endpoint.slot_bytes,
        }
        assert list(endpoint.transports) == [pb.TRANSPORT_KIND_MOONCAKE_TCP, pb.TRANSPORT_KIND_GRPC]
        whole = transport.read_pages(info["address"], pages)
        out["whole"] = {
            "moved": len(whole.moved),
            "bytes": whole.bytes,
            "entries": whole.requests,
            "intact": intact(local, pages),
        }
        for page in pages:
            local.release(page)
        # scattered pages: slots not consecutive on the peer, reversed order here
        scattered = (pages[20], pages[3], pages[7], pages[8], pages[9], pages[0])
        part = transport.read_pages(info["address"], scattered)
        out["scattered"] = {"moved": len(part.moved), "entries": part.requests, "intact": intact(local, scattered)}
        try:
            transport.read_pages(info["address"], [*pages[10:12], PageHash(999)])
        except PagesMissing as error:
            out["missing"] = {"error": str(error), "reserved": local.gauges().reserved, "ready": local.gauges().ready}
        transport.close()
        grpc_local = KvArena(32, PAGE_BYTES)
        via_grpc = GrpcTransport(grpc_local).read_pages(info["address"], pages)
        out["grpc"] = {"moved": len(via_grpc.moved), "intact": intact(grpc_local, pages)}
    finally:
        stop_peer(peer)
    out["peer_exit"] = peer.returncode
    return out


def scenario_failures() -> dict:
    """Two arenas and engines in one process: damage, a peer without Mooncake, mismatched slots."""
    from evolving_infra.node_agent.api.pages_service import PagesServicer
    from evolving_infra.node_agent.api.server import start_server

    pages = demo_chain(6)
    remote = KvArena(8, PAGE_BYTES)
    for page in pages:
        remote.store_emulated(page)
    remote_engine = MooncakeTransport(remote)
    with_mooncake = start_server(PagesServicer(remote, "peer", remote_engine.address))
    without = start_server(PagesServicer(remote, "peer", None))
    local = KvArena(8, PAGE_BYTES)
    transport = MooncakeTransport(local)
    out: dict = {}
    remote.slot_view(remote.locate(pages[4]).slot)[7] ^= 0xFF  # damaged after its checksum was taken
    try:
        transport.read_pages(with_mooncake.address, pages)
    except ChecksumMismatch as error:
        out["damaged"] = {
            "page": error.page == pages[4],
            "ready": sorted(local.pages()) == sorted(pages[:4]),
            "free": local.gauges().free,
        }
    try:
        transport.read_pages(without.address, [pages[5]])
    except TransportUnavailable as error:
        out["no_mooncake"] = str(error)
    small = KvArena(4, 4096)
    small_transport = MooncakeTransport(small)
    try:
        small_transport.read_pages(with_mooncake.address, [pages[0]])
    except TransferFailed as error:
        out["slot_mismatch"] = str(error)
    for closing in (small_transport, transport, remote_engine):
        closing.close()
    with_mooncake.stop(None)
    without.stop(None)
    return out


SCENARIOS = {"two_processes": scenario_two_processes, "failures": scenario_failures}


# --- the tests (run the scenarios in a namespace) ---------------------------------------------------
@pytest.fixture(scope="module")
def namespace() -> None:
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"Mooncake tests need a private loopback-only network namespace: {reason}")
    reason = mooncake_unavailable()
    if reason:
        pytest.skip(reason)


def run_scenario(name: str) -> dict:
    env = {**os.environ, "MC_LOG_LEVEL": "ERROR"}
    argv = private_netns_command([sys.executable, str(Path(__file__).resolve()), name])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"scenario {name} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pages_move_intact_between_two_processes(namespace: None) -> None:
    out = run_scenario("two_processes")
    assert out["endpoint"]["mooncake_address"].startswith("127.0.0.1:")
    assert out["endpoint"]["slot_bytes"] == PAGE_BYTES
    assert out["whole"] == {"moved": 24, "bytes": 24 * PAGE_BYTES, "entries": 6, "intact": True}
    assert out["scattered"] == {"moved": 6, "entries": 4, "intact": True}
    assert "0x00000000000003e7" in out["missing"]["error"]
    assert (out["missing"]["reserved"], out["missing"]["ready"]) == (0, 6)
    assert out["grpc"] == {"moved": 24, "intact": True}
    assert out["peer_exit"] == 0


def test_damage_and_misconfiguration_fail_cleanly(namespace: None) -> None:
    out = run_scenario("failures")
    assert out["damaged"] == {"page": True, "ready": True, "free": 4}
    assert "runs no Mooncake engine" in out["no_mooncake"] and "gRPC transport" in out["no_mooncake"]
    assert "262144-byte page slots; this node's are 4096" in out["slot_mismatch"]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ImportError("libibverbs.so.1: cannot open shared object file"), "apt-get install -y libibverbs1"),
        (
            ModuleNotFoundError("No module named 'mooncake'", name="mooncake"),
            "pip install mooncake-transfer-engine-non-cuda",
        ),
    ],
)
def test_a_missing_library_is_named(monkeypatch: pytest.MonkeyPatch, error: ImportError, expected: str) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name.startswith("mooncake"):
            raise error
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    reason = mooncake_unavailable()
    assert reason is not None and expected in reason
    with pytest.raises(TransportUnavailable, match=expected.split()[0]):
        MooncakeTransport(KvArena(1, 64))


if __name__ == "__main__":
    bring_loopback_up()  # refuses unless this is a loopback-only namespace
    print(json.dumps(SCENARIOS[sys.argv[1]]()))
