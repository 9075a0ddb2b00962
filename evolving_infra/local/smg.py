"""The local cluster behind the real SGLang gateway (`evolving-infra local --gateway smg`): the node agents serve
SGLang's worker API (`node_agent.service.sglang_node` over `sglang_http`) and `smg` routes to them in its PD mode,
with cache-aware prefill routing at the static split (the paper's best-static configuration), instead of our
router.

Two child-process entry points, each printing one JSON line when ready (as `local.processes.Child` expects) and
serving until SIGTERM or SIGINT:

- `python -m evolving_infra.local.smg node --settings FILE [--peer-url GRPC=URL ...]`: one node agent (the
  same YAML settings as `evolving-infra node-agent serve`) in-process, with SGLang's worker API on 127.0.0.1. A
  decode node's settings name the prefill nodes as peers: the gateway's bootstrap address (the prefill node's
  gRPC address) must be one.
- `python -m evolving_infra.local.smg gateway --settings FILE`: `smg launch --pd-disaggregation` on
  127.0.0.1 in front of the workers of FILE (`GatewaySpec`), ready once it lists them all; it dies with its
  parent (PR_SET_PDEATHSIG) and is stopped with it.

**Reuse reported to the client.** In PD mode the gateway answers with the decode worker's response, and only the
prefill worker knows how much of the prompt it reused. So a prefill worker keeps, per bootstrap room (the id the
gateway gives both legs of one request), the cached tokens its engine reported (`GET /evolving/reuse/{room}`,
the last `REUSE_KEPT` rooms), and a decode worker asks the prefill worker named by the bootstrap address
(`--peer-url`) when its leg finishes, and reports that in its usage; 0 when the answer is missing.

Without `smg` (`find_smg`: $EVOLVING_INFRA_SMG, the side venv made by scripts/peers/setup-smg.sh, or PATH),
`require_smg` raises `SmgUnavailable` naming how to install it. The gateway judge (`peers.smg_judge`) finds it
the same way.

Boundary: process entry points and the gateway's command line; the API is `sglang_http`'s, the node's work is
`NodeAgent`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

__all__ = ["GatewaySpec", "ReuseBook", "SmgUnavailable", "find_smg", "free_port", "gateway_command", "require_smg"]

ENV_SMG = "EVOLVING_INFRA_SMG"
SIDE_VENV = Path(".peers") / "smg-venv"
REPO = Path(__file__).resolve().parents[2]


class SmgUnavailable(RuntimeError):
    """No `smg` executable (the message says how to install it)."""


def find_smg() -> Path:
    """The `smg` executable: $EVOLVING_INFRA_SMG, the side venv made by scripts/peers/setup-smg.sh, or PATH."""
    named = os.environ.get(ENV_SMG)
    candidates = [Path(named)] if named else [REPO / SIDE_VENV / "bin" / "smg", SIDE_VENV / "bin" / "smg"]
    if not named and shutil.which("smg"):
        candidates.append(Path(str(shutil.which("smg"))))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise SmgUnavailable(
        f"no smg executable at {named or REPO / SIDE_VENV / 'bin' / 'smg'}; install it with "
        f"scripts/peers/setup-smg.sh (or set {ENV_SMG})"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class GatewaySpec:
    """The gateway's settings file: the smg executable, its workers and its policy."""

    smg: str
    prefill: tuple[tuple[str, int], ...]
    """(worker URL, bootstrap port) per prefill node."""
    decode: tuple[str, ...]
    prefill_policy: str = "cache_aware"
    decode_policy: str = "round_robin"
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    start_timeout_s: float = 60.0
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("the gateway needs at least one prefill and one decode worker")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prefill"] = [list(p) for p in self.prefill]
        d["decode"] = list(self.decode)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GatewaySpec:
        return cls(**{**d, "prefill": tuple((str(u), int(p)) for u, p in d["prefill"]), "decode": tuple(d["decode"])})


def require_smg() -> str:
    """The smg executable, or `SmgUnavailable` saying how to install it."""
    return str(find_smg())


def gateway_command(spec: GatewaySpec, port: int, metrics_port: int) -> list[str]:
    """`smg launch` in PD mode on 127.0.0.1 (the documented cache-aware rule: no warm-up slice, own load counts)."""
    cmd = [spec.smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(metrics_port), "--pd-disaggregation"]  # fmt: skip
    for url, bootstrap in spec.prefill:
        cmd += ["--prefill", url, str(bootstrap)]
    for url in spec.decode:
        cmd += ["--decode", url]
    cmd += [
        "--prefill-policy", spec.prefill_policy, "--decode-policy", spec.decode_policy,
        "--cache-threshold", str(spec.cache_threshold), "--balance-abs-threshold", str(spec.balance_abs_threshold),
        "--balance-rel-threshold", str(spec.balance_rel_threshold),
        "--request-timeout-secs", str(int(spec.request_timeout_s)),
        "--worker-startup-check-interval", "1", "--shutdown-grace-period-secs", "1", "--log-level", "warn",
        # the documented rule, as in the differential (peers/smg_judge.py): no warm-up slice, its own load counts
        "--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0", "--worker-warmup-thin-ratio", "0",
        "--disable-load-monitoring",
    ]  # fmt: skip
    return cmd


# -- node entry point ---------------------------------------------------------------------------------------
REUSE_KEPT = 100_000
"""Bootstrap rooms whose reuse a prefill worker remembers."""


class ReuseBook:
    """Prefill side: cached tokens per bootstrap room, the most recent `limit` rooms."""

    def __init__(self, limit: int = REUSE_KEPT) -> None:
        self.limit = limit
        self._rooms: OrderedDict[int, int] = OrderedDict()

    def put(self, room: int, cached: int) -> None:
        self._rooms[room] = cached
        self._rooms.move_to_end(room)
        while len(self._rooms) > self.limit:
            self._rooms.popitem(last=False)

    def get(self, room: int) -> int | None:
        return self._rooms.get(room)


def _reuse_backend(node: Any, book: ReuseBook, peer_urls: dict[str, str], session: Any) -> Any:
    """The node's SGLang backend with the reuse hand-over of the module docstring."""
    from evolving_infra.node_agent.service.sglang_http import GenerateJob, SglangRole, Step
    from evolving_infra.node_agent.service.sglang_node import NodeAgentSglang

    class ReuseReporting(NodeAgentSglang):
        async def run(self, job: GenerateJob) -> AsyncIterator[Step]:
            role, boot = self.role, job.bootstrap
            async for step in super().run(job):
                if role is SglangRole.PREFILL and step.finished and boot is not None:
                    book.put(boot.room, step.cached_tokens)
                elif role is SglangRole.DECODE and step.finished and boot is not None:
                    step = Step(step.completion_tokens, await _ask_reuse(session, peer_urls, boot), True)
                yield step

    return ReuseReporting(node, t_acc=node.memory.profile.decode.t_acc)


async def _ask_reuse(session: Any, peer_urls: dict[str, str], boot: Any) -> int:
    import aiohttp

    url = peer_urls.get(f"{boot.host}:{boot.port}")
    if url is None:
        return 0
    for _ in range(3):  # the prefill leg's answer may still be on its way
        try:
            async with session.get(f"{url}/evolving/reuse/{boot.room}", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    return int((await r.json())["cached_tokens"])
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
            pass
        await asyncio.sleep(0.01)
    return 0


async def _serve_node(settings_path: Path, peer_urls: dict[str, str]) -> int:
    import aiohttp

    from evolving_infra.node_agent.service.main import ready_info
    from evolving_infra.node_agent.service.node import NodeAgent
    from evolving_infra.node_agent.service.settings import load_settings
    from evolving_infra.node_agent.service.sglang_http import make_app

    settings = load_settings(settings_path, {})
    node = NodeAgent(settings)
    await node.start()
    book = ReuseBook()
    session = aiohttp.ClientSession()
    backend = _reuse_backend(node, book, peer_urls, session)
    app = make_app(backend, backend.identity())

    async def reuse(request: web.Request) -> web.Response:
        try:
            cached = book.get(int(request.match_info["room"]))
        except ValueError:
            return web.json_response({"error": "room must be an integer"}, status=400)
        if cached is None:
            return web.json_response({"error": "no prefill of this room here"}, status=404)
        return web.json_response({"cached_tokens": cached})

    app.router.add_get("/evolving/reuse/{room}", reuse)
    port = free_port()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({**ready_info(node), "url": f"http://127.0.0.1:{port}"}), flush=True)
    failed = asyncio.ensure_future(node.failed.wait())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
    failed.cancel()
    stopped.cancel()
    await runner.cleanup()
    await session.close()
    await node.close()
    return 1 if node.failed.is_set() else 0


# -- gateway entry point ------------------------------------------------------------------------------------
def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _workers(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/workers", timeout=2.0) as answer:
            return len(json.loads(answer.read()).get("workers", []))
    except (urllib.error.URLError, OSError, ValueError):
        return 0


def _serve_gateway(settings_path: Path) -> int:
    spec = GatewaySpec.from_dict(yaml.safe_load(settings_path.read_text(encoding="utf-8")))
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen(gateway_command(spec, port, metrics), stdin=subprocess.DEVNULL, stdout=sys.stderr,
                            preexec_fn=_die_with_parent)  # fmt: skip
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + spec.start_timeout_s
        want = len(spec.prefill) + len(spec.decode)
        while _workers(url) < want:
            if proc.poll() is not None:
                print(f"smg exited with status {proc.returncode} before listing its workers", file=sys.stderr)
                return 1
            if stopping:
                return 0
            if time.monotonic() > deadline:
                print(f"smg did not list its {want} workers within {spec.start_timeout_s:g} s", file=sys.stderr)
                return 1
            time.sleep(0.25)
        print(json.dumps({"url": url, "metrics_url": f"http://127.0.0.1:{metrics}/metrics", "pid": proc.pid}), flush=True)
        while not stopping and proc.poll() is None:
            time.sleep(0.2)
        return 0 if stopping else 1
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evolving_infra.local.smg", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["node", "gateway"])
    parser.add_argument("--settings", type=Path, required=True)
    parser.add_argument("--peer-url", action="append", default=[], metavar="GRPC=URL",
                        help="a prefill peer's SGLang API URL by its gRPC address (decode nodes)")
    args = parser.parse_args(argv)
    if args.role == "node":
        peers = dict(item.split("=", 1) for item in args.peer_url if "=" in item)
        return asyncio.run(_serve_node(args.settings, peers))
    return _serve_gateway(args.settings)


if __name__ == "__main__":
    sys.exit(main())
