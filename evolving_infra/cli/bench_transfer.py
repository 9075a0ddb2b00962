"""`evolving-infra bench transfer`: KV bytes/s between two node-agent processes, per transport, against a
plain memory copy measured in the same run.

Setup: a peer process (`evolving_infra.node_agent.api.pages_server`) fills a host arena with `--mib` of
emulated pages and serves it (gRPC `ReadPages` / `GetTransferEndpoint`, and a Mooncake engine); this
process is the reading node agent with its own arena. Each transport reads every page `--repeats` times
(the local pages are released between reads, untimed); a read is the whole `read_pages` call: endpoint
exchange, transfer and the checksum check of every page. The first read of each transport includes
connection setup and is reported apart. The memory-copy baseline copies the same number of bytes
between two arrays in this process.

Namespace rule: the Mooncake engine listens on the wildcard address, so the whole measurement runs in a
private network namespace with only loopback (`unshare -n`, or `unshare -rn` without root). Where no
namespace can be made, Mooncake is skipped with the reason and the rest still runs.

Boundary: measurement and process wiring only.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
from rich.console import Console
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.transfer import (
    GrpcTransport,
    KvArena,
    MooncakeTransport,
    Transport,
    demo_chain,
    emulated_checksum,
    mooncake_unavailable,
)

INSIDE_FLAG = "--inside-private-netns"
MIB = 1 << 20


# --- private network namespace ----------------------------------------------------------------------
def private_netns_command(argv: list[str]) -> list[str]:
    """`argv` run in a new network namespace (`unshare -n` as root, `unshare -rn` otherwise)."""
    return ["unshare", "-n" if os.geteuid() == 0 else "-rn", "--", *argv]


def netns_unavailable() -> str | None:
    """Why no private network namespace can be made here, or None."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = [sys.executable, "-c", "import evolving_infra.cli.bench_transfer as b; b.bring_loopback_up()"]
    try:
        done = subprocess.run(private_netns_command(probe), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unshare failed: {error}"
    if done.returncode != 0:
        return f"cannot make a loopback-only network namespace: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def bring_loopback_up() -> None:
    """Set `lo` up in this process's network namespace, after checking `lo` is its only interface."""
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        raise RuntimeError(f"not a private loopback-only network namespace (interfaces: {names})")
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh14s", b"lo", 0, b"")
        flags = struct.unpack("16sh14s", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sh14s", b"lo", flags | iff_up, b""))


def start_peer(pages: int, page_bytes: int, mooncake: bool, seed: int = 0) -> tuple[subprocess.Popen[str], dict]:
    """Start a pages_server peer process; returns it and the JSON line it printed (its addresses)."""
    argv = [sys.executable, "-P", "-m", "evolving_infra.node_agent.api.pages_server"]
    argv += ["--pages", str(pages), "--page-bytes", str(page_bytes), "--seed", str(seed)]
    argv += ["--mooncake"] if mooncake else []
    env = {**os.environ, "MC_LOG_LEVEL": os.environ.get("MC_LOG_LEVEL", "ERROR")}
    pipe = subprocess.PIPE
    peer = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=pipe, text=True, env=env)
    assert peer.stdout is not None
    line = peer.stdout.readline()
    if not line:
        peer.wait(timeout=30)
        stderr = peer.stderr.read() if peer.stderr else ""
        raise RuntimeError(f"peer process exited ({peer.returncode}) before serving: {stderr.strip()[-2000:]}")
    return peer, json.loads(line)


def stop_peer(peer: subprocess.Popen[str]) -> None:
    if peer.stdin:
        peer.stdin.close()
    try:
        peer.wait(timeout=30)
    except subprocess.TimeoutExpired:
        peer.kill()
        peer.wait()


# --- measurement ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PathFigures:
    """One transport (or the memory copy): GB/s of the warm reads, and the first read apart."""

    name: str
    first_seconds: float
    warm_seconds: list[float]
    bytes: int
    requests: int
    verified: bool

    @property
    def median_gbps(self) -> float:
        return self.bytes / statistics.median(self.warm_seconds) / 1e9

    @property
    def best_gbps(self) -> float:
        return self.bytes / min(self.warm_seconds) / 1e9


@dataclass(frozen=True)
class TransferBenchResult:
    mib: int
    page_bytes: int
    pages: int
    repeats: int
    chunk_bytes: int
    paths: list[dict] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    private_netns: bool = False
    python: str = platform.python_version()
    cpus: int = os.cpu_count() or 0
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _memcpy(nbytes: int, repeats: int) -> PathFigures:
    source = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    target = np.empty_like(source)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - start)
    same = bool((target == source).all())
    return PathFigures("memory copy", times[0], times[1:], nbytes, 1, same)


def _transport_path(
    name: str, transport: Transport, arena: KvArena, peer: str, pages: tuple[PageHash, ...], repeats: int
) -> PathFigures:
    times, requests, verified = [], 0, True
    for _ in range(repeats + 1):
        for page in arena.pages():
            arena.release(page)
        start = time.perf_counter()
        result = transport.read_pages(peer, pages)
        times.append(time.perf_counter() - start)
        requests = result.requests
        verified = verified and result.moved == pages
    verified = verified and all(arena.locate(p).checksum == emulated_checksum(p, arena.page_bytes) for p in pages)
    return PathFigures(name, times[0], times[1:], len(pages) * arena.page_bytes, requests, verified)


def measure(mib: int, page_bytes: int, repeats: int, chunk_bytes: int, mooncake: str | None) -> TransferBenchResult:
    """Run every path; `mooncake` is None to include Mooncake, else the reason it is skipped."""
    count = mib * MIB // page_bytes
    pages = demo_chain(count)
    result = TransferBenchResult(mib, page_bytes, count, repeats, chunk_bytes, private_netns=mooncake is None)
    figures = [_memcpy(count * page_bytes, repeats)]
    peer, info = start_peer(count, page_bytes, mooncake=mooncake is None)
    try:
        if mooncake is None:
            arena = KvArena(count, page_bytes)
            mooncake_transport = MooncakeTransport(arena)
            figures.append(_transport_path("Mooncake TCP", mooncake_transport, arena, info["address"], pages, repeats))
            mooncake_transport.close()
        else:
            result.skipped["mooncake"] = mooncake
        arena = KvArena(count, page_bytes)
        grpc_transport = GrpcTransport(arena, chunk_bytes=chunk_bytes)
        figures.append(_transport_path("gRPC stream", grpc_transport, arena, info["address"], pages, repeats))
        grpc_transport.close()
    finally:
        stop_peer(peer)
    result.paths.extend({**asdict(f), "median_gbps": f.median_gbps, "best_gbps": f.best_gbps} for f in figures)
    memcpy = figures[0].median_gbps
    for f in figures[1:]:
        key = "mooncake" if f.name.startswith("Mooncake") else "grpc"
        result.ratios[f"{key}/memcpy"] = f.median_gbps / memcpy
    if "mooncake/memcpy" in result.ratios:
        result.ratios["mooncake/grpc"] = result.ratios["mooncake/memcpy"] / result.ratios["grpc/memcpy"]
    return TransferBenchResult(**{**asdict(result), "load_average": os.getloadavg()})


# --- command ----------------------------------------------------------------------------------------
def _validated(args: argparse.Namespace) -> tuple[int, int, int, int]:
    page_bytes, chunk = args.page_kib * 1024, args.chunk_kib * 1024
    if args.mib < 1 or args.repeats < 1 or args.page_kib < 1:
        raise CliError("--mib, --repeats and --page-kib must be positive integers", USAGE_ERROR)
    if (args.mib * MIB) % page_bytes:
        raise CliError(f"--mib {args.mib} is not a whole number of {args.page_kib} KiB pages", USAGE_ERROR)
    if not 4 <= args.chunk_kib <= 8192:
        raise CliError(f"--chunk-kib must be 4..8192, got {args.chunk_kib}", USAGE_ERROR)
    return args.mib, page_bytes, args.repeats, chunk


def _inside(args: argparse.Namespace) -> int:
    """Child mode: we are in the private namespace; measure everything and print JSON for the parent."""
    bring_loopback_up()
    mib, page_bytes, repeats, chunk = _validated(args)
    result = measure(mib, page_bytes, repeats, chunk, mooncake=mooncake_unavailable())
    print(json.dumps(asdict(result)))
    return 0


def _handler(args: argparse.Namespace) -> int:
    if args.inside_private_netns:
        return _inside(args)
    mib, page_bytes, repeats, chunk = _validated(args)
    reason = netns_unavailable()
    if reason is None:
        argv = [sys.executable, "-P", "-m", "evolving_infra.cli.main", "bench", "transfer", INSIDE_FLAG]
        argv += ["--mib", str(mib), "--page-kib", str(args.page_kib), "--repeats", str(repeats)]
        argv += ["--chunk-kib", str(args.chunk_kib)]
        env = {**os.environ, "MC_LOG_LEVEL": os.environ.get("MC_LOG_LEVEL", "ERROR")}
        done = subprocess.run(private_netns_command(argv), capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise CliError(f"transfer benchmark failed in its network namespace: {done.stderr.strip()[-3000:]}")
        data = json.loads(done.stdout.strip().splitlines()[-1])
    else:
        data = asdict(measure(mib, page_bytes, repeats, chunk, mooncake=f"no private network namespace: {reason}"))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    _print_table(data)
    return 0


def _print_table(data: dict) -> None:
    table = Table(title=f"KV transfer: {data['mib']} MiB in {data['pages']} pages of {data['page_bytes'] // 1024} KiB")
    for column in ("path", "median GB/s", "best GB/s", "first read", "transfers", "checksums"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for p in data["paths"]:
        table.add_row(
            p["name"],
            f"{p['median_gbps']:.2f}",
            f"{p['best_gbps']:.2f}",
            f"{p['first_seconds'] * 1000:.0f} ms",
            str(p["requests"]),
            "ok" if p["verified"] else "FAILED",
        )
    console = Console()
    console.print(table)
    console.print("ratios (median): " + ", ".join(f"{k} {v:.3f}" for k, v in data["ratios"].items()))
    for name, why in data["skipped"].items():
        console.print(f"skipped {name}: {why}")
    console.print(
        f"{data['repeats']} warm reads each; private network namespace: {data['private_netns']}; "
        f"Python {data['python']}, {data['cpus']} CPUs, load average {data['load_average'][0]:.2f}"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("transfer", help="KV transfer bytes/s: Mooncake TCP and gRPC vs memory copy")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--mib", type=int, default=64, help="MiB of KV pages per read (default 64)")
    parser.add_argument("--page-kib", type=int, default=256, help="page size in KiB (default 256)")
    parser.add_argument("--repeats", type=int, default=5, help="warm reads per path after the first (default 5)")
    parser.add_argument("--chunk-kib", type=int, default=1024, help="gRPC stream message size in KiB (default 1024)")
    parser.add_argument(INSIDE_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(handler=_handler)
