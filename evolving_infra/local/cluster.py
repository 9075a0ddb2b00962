"""The local cluster: N node agents and a router as child processes on 127.0.0.1.

`ClusterSpec` says what to run; `LocalCluster.start()` writes one settings file per process into the work folder,
starts every node agent at once (each binds port 0, so the OS picks free ports with no race, and reports them on
its JSON line), waits for all of them, then starts the router with the node addresses and waits until its
`/readyz` answers 200. `stop()` stops the router first (it finishes in-flight requests), then the nodes.

Peers: the nodes start with no peer map. The router names the peer's address in every fetch run it sends (prefill
prefix fetches and decode KV pulls), so a node never needs one; this keeps port choice race-free.

Time: the nodes run emulated time at `speed_up` x the wall clock; the router's clock (planner windows, cooldown,
switch deadlines) is the wall clock. The planner's decisions depend only on per-slice means and time averages,
which are the same on either clock, so the spec keeps windows in emulated seconds and hands the router
`window / speed_up` wall seconds (and likewise the cooldown): a window then covers the same emulated time on the
router as on the nodes.

Gateway: with `gateway=Gateway.SMG` the SGLang gateway (`smg`, from its side venv) stands where the router
stands: the node agents serve SGLang's worker API (`local.smg node`; prefill nodes first, so that each decode
node is started with the prefill nodes as its peers: the gateway's bootstrap addresses), and `local.smg
gateway` runs `smg` in PD mode with cache-aware prefill routing in front of them, at the static split (no planner,
no warmup, no recording: those are our router's). Without `smg`, `start` raises `SmgUnavailable` (the message
says how to install it).

Boundary: process orchestration and settings files; what runs inside is `evolving-infra node-agent serve` and
`evolving-infra router serve` (or `local.smg`).
"""

from __future__ import annotations

import enum
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evolving_infra.core.eviction import EVICTION
from evolving_infra.core.plugins import load_plugins
from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.local.processes import Child, StartError, python_command, stop_all
from evolving_infra.router.planner.registry import PLANNERS
from evolving_infra.router.routing.registry import PREFILL_ROUTING


class Gateway(str, enum.Enum):
    """What fronts the node agents: our router, or SGLang's model gateway (`smg`)."""

    OURS = "ours"
    SMG = "smg"


@dataclass(frozen=True)
class ClusterSpec:
    """What the local cluster runs. Times marked "emulated" are node-clock seconds."""

    nodes: int = 4
    prefill: int = 2
    speed_up: float = 10.0
    profile: str = "deepseek-v4-flash-4xh200-tp4"
    l2_pages: int = 8192
    page_bytes: int = 1024
    planner: str = "ours"
    routing: str = "ttft"
    window_s: float = 600.0
    """Planning window, emulated seconds."""
    slices: int = 10
    cooldown_s: float = 120.0
    """No new decision this long after a switch, emulated seconds."""
    warmup_s: float = 0.0
    """Collocated warmup (algorithm E.3), emulated seconds: every node serves both phases while the router fits
    its models, then the router switches each to its initial phase (0: nodes start in their phases)."""
    fit_interval_s: float = 60.0
    """During the warmup, the router refreshes its provisional models this often, emulated seconds."""
    seed: int = 0
    request_timeout_s: float = 120.0
    """Router deadline per request, wall seconds."""
    start_timeout_s: float = 60.0
    """How long each process may take to report ready, wall seconds."""
    stop_grace_s: float = 10.0
    plugins: tuple[str, ...] = ()
    """Policy modules the router and the node agents load first (dotted names or .py paths): a plugin's planner,
    routing or eviction order."""
    eviction: str = "branch-count"
    """Host eviction order of every node (a declared one)."""
    noise: float | None = None
    """Relative iteration-time noise of the node agents' engines (None: the node agent's default, 5 %)."""
    exact_models: bool = False
    """Debugging switch: the engines' iteration times are eq. 1 and 2 alone (no ground-truth effects, no noise)."""
    planner_settings: Mapping[str, Any] = field(default_factory=dict)
    """More settings of the planner (its declared fields; times in it are wall seconds)."""
    routing_settings: Mapping[str, Any] = field(default_factory=dict)
    """Settings of the prefill routing policy (its declared fields)."""
    node_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Extra settings per node id (tests use it to break one node)."""
    record_dir: Path | None = None
    """The router records what it served into `trace.jsonl` and its fitted models into `models.json` here."""
    gateway: Gateway = Gateway.OURS
    """What fronts the nodes (module docstring)."""

    def __post_init__(self) -> None:
        if self.gateway is Gateway.SMG and (self.warmup_s > 0 or self.record_dir is not None):
            raise ValueError("--gateway smg runs SGLang's gateway instead of our router: no warmup and no recording "
                             "(both are our router's)")  # fmt: skip
        if self.nodes < 2:
            raise ValueError(f"a local cluster needs at least 2 nodes (one per phase), got {self.nodes}")
        if not 1 <= self.prefill <= self.nodes - 1:
            raise ValueError(f"prefill nodes must be 1..{self.nodes - 1} of {self.nodes}, got {self.prefill}")
        if not self.speed_up > 0:
            raise ValueError(f"speed_up must be > 0, got {self.speed_up}")
        if not self.warmup_s >= 0 or not self.fit_interval_s > 0:
            raise ValueError(f"warmup_s must be >= 0 and fit_interval_s > 0, got {self.warmup_s}, {self.fit_interval_s}")

    @property
    def split(self) -> str:
        return f"{self.prefill}P{self.nodes - self.prefill}D"

    def node_ids(self) -> list[str]:
        return [f"n{i}" for i in range(self.nodes)]

    def initial_phase(self, index: int) -> Phase:
        return Phase.PREFILL if index < self.prefill else Phase.DECODE


def check_policies(spec: ClusterSpec) -> None:
    """Refuse unknown policies or settings before any process starts (the router would refuse them too)."""
    load_plugins(spec.plugins)
    PLANNERS.get(spec.planner, "planner")
    PREFILL_ROUTING.validate(spec.routing, spec.routing_settings, "routing_settings")
    EVICTION.get(spec.eviction, "eviction")


def parse_split(text: str, nodes: int | None = None) -> tuple[int, int]:
    """`"2P2D"` -> (2, 2); checks both counts are >= 1 and, if given, that they add up to `nodes`."""
    raw = text.strip().upper()
    head, p_sep, rest = raw.partition("P")
    tail, d_sep, extra = rest.partition("D")
    if not (p_sep and d_sep and not extra and head.isdigit() and tail.isdigit()):
        raise ValueError(f"split {text!r} must look like 2P2D (prefill nodes, P, decode nodes, D)")
    p, d = int(head), int(tail)
    if p < 1 or d < 1:
        raise ValueError(f"split {text!r} needs at least one prefill and one decode node")
    if nodes is not None and p + d != nodes:
        raise ValueError(f"split {text!r} has {p + d} nodes but --nodes is {nodes}")
    return p, d


class LocalCluster:
    """The running cluster (see the module docstring). Use as a context manager or call start/stop."""

    def __init__(self, spec: ClusterSpec, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir
        self.nodes: dict[str, Child] = {}
        self.router: Child | None = None
        self.router_url = ""
        self.router_metrics_url = ""
        self.node_metrics: dict[str, str] = {}
        self.node_addresses: dict[str, str] = {}
        self.exit_codes: dict[str, int | None] = {}

    @property
    def control_log_path(self) -> Path:
        """Where the router appends its control core's log (JSON lines)."""
        return self.workdir / "control.jsonl"

    # -- settings ------------------------------------------------------------------------------------
    def node_settings(self, index: int) -> dict[str, Any]:
        s = self.spec
        node = s.node_ids()[index]
        settings: dict[str, Any] = {
            "node": node, "host": "127.0.0.1", "grpc_port": 0, "metrics_port": 0, "profile": s.profile,
            "mode": (NodeMode.COLLOCATED if s.warmup_s > 0 else NodeMode(s.initial_phase(index).value)).value, "speed_up": s.speed_up, "l2_pages": s.l2_pages,
            "page_bytes": s.page_bytes, "seed": s.seed + index, "shutdown_grace_s": 5.0, "workers": 2,
            "eviction": s.eviction, "plugins": list(s.plugins), "exact_models": s.exact_models,
        }  # fmt: skip
        if s.noise is not None:
            settings["noise"] = s.noise
        settings.update(dict(s.node_settings.get(node, {})))
        return settings

    def router_settings(self) -> dict[str, Any]:
        s = self.spec
        planner_settings: dict[str, Any] = {}
        if s.planner == "ours":
            planner_settings["cooldown_s"] = s.cooldown_s / s.speed_up
        planner_settings.update(s.planner_settings)
        return {
            "host": "127.0.0.1", "port": 0, "metrics_port": 0, "nodes": dict(self.node_addresses),
            "planner": s.planner, "planner_settings": planner_settings, "window_s": s.window_s / s.speed_up,
            "slices": s.slices, "prefill_routing": s.routing, "profile": s.profile, "applier": "local",
            "request_timeout_s": s.request_timeout_s, "switch_timeout_s": 60.0, "bind_wait_s": 30.0,
            "rpc_timeout_s": 10.0, "seed": s.seed, "insecure": True,
            "warmup_s": s.warmup_s / s.speed_up, "fit_interval_s": s.fit_interval_s / s.speed_up,
            "initial_split": {n: s.initial_phase(i).value for i, n in enumerate(s.node_ids())},
            "control_log": str(self.control_log_path), "plugins": list(s.plugins),
            "routing_settings": dict(s.routing_settings), "eviction": s.eviction,
        }  # fmt: skip

    def record_settings(self) -> dict[str, Any]:
        """The router's recording settings (emulated times: the router's wall clock x speed_up)."""
        d = self.spec.record_dir
        if d is None:
            return {}
        d.mkdir(parents=True, exist_ok=True)
        return {"record_trace": str(d.resolve() / "trace.jsonl"), "record_models": str(d.resolve() / "models.json"),
                "record_time_scale": self.spec.speed_up}  # fmt: skip

    def _write(self, name: str, data: Mapping[str, Any]) -> Path:
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(dict(data), sort_keys=True), encoding="utf-8")
        return path

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the nodes, then the router; raises `StartError` naming the process that failed."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.spec.gateway is Gateway.SMG:
            self._start_smg()
            return
        try:
            for i, node in enumerate(self.spec.node_ids()):
                path = self._write(f"node-{node}", self.node_settings(i))
                child = Child(f"node-agent {node}", python_command("node-agent", "serve", "--settings", str(path),
                                                                  "--log-level", "WARNING", "--insecure"), self.workdir)  # fmt: skip
                self.nodes[node] = child
                child.start()
            deadline = time.monotonic() + self.spec.start_timeout_s
            for node, child in self.nodes.items():
                info = child.wait_ready(deadline)
                self.node_addresses[node] = str(info["address"])
                if info.get("metrics_address"):
                    self.node_metrics[node] = f"http://{info['metrics_address']}/metrics"
            path = self._write("router", {**self.router_settings(), **self.record_settings()})
            self.router = Child("router", python_command("router", "serve", "--settings", str(path),
                                                         "--log-level", "WARNING"), self.workdir)  # fmt: skip
            self.router.start()
            info = self.router.wait_ready(time.monotonic() + self.spec.start_timeout_s)
            self.router_url = str(info["url"]).rstrip("/")
            self.router_metrics_url = str(info.get("metrics_url") or "")
            self._wait_router_ready(time.monotonic() + self.spec.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start_smg(self) -> None:
        """Prefill nodes, then decode nodes (peers: the prefill nodes), then the gateway (module docstring)."""
        from evolving_infra.local.smg import GatewaySpec, require_smg

        smg = require_smg()
        entry = (sys.executable, "-P", "-m", "evolving_infra.local.smg")
        urls: dict[str, str] = {}
        try:
            ids = self.spec.node_ids()
            for group in (ids[: self.spec.prefill], ids[self.spec.prefill :]):
                for node in group:
                    settings = self.node_settings(ids.index(node))
                    if node not in ids[: self.spec.prefill]:
                        settings["peers"] = {n: self.node_addresses[n] for n in ids[: self.spec.prefill]}
                    path = self._write(f"node-{node}", {**settings, "insecure": True})
                    peer_urls = [f"--peer-url={self.node_addresses[n]}={urls[n]}" for n in ids[: self.spec.prefill] if n in urls]
                    child = Child(f"node-agent {node}", (*entry, "node", "--settings", str(path), *peer_urls), self.workdir)
                    self.nodes[node] = child
                    child.start()
                deadline = time.monotonic() + self.spec.start_timeout_s
                for node in group:
                    info = self.nodes[node].wait_ready(deadline)
                    self.node_addresses[node] = str(info["address"])
                    urls[node] = str(info["url"])
                    if info.get("metrics_address"):
                        self.node_metrics[node] = f"http://{info['metrics_address']}/metrics"
            prefill = ids[: self.spec.prefill]
            spec = GatewaySpec(
                smg, tuple((urls[n], int(self.node_addresses[n].rsplit(":", 1)[1])) for n in prefill),
                tuple(urls[n] for n in ids if n not in prefill), start_timeout_s=self.spec.start_timeout_s,
                request_timeout_s=self.spec.request_timeout_s,
                **{k: v for k, v in self.spec.routing_settings.items() if k in _SMG_ROUTING},
            )  # fmt: skip
            path = self._write("gateway", spec.to_dict())
            self.router = Child("smg", (*entry, "gateway", "--settings", str(path)), self.workdir)
            self.router.start()
            info = self.router.wait_ready(time.monotonic() + self.spec.start_timeout_s + 5.0)
            self.router_url = str(info["url"]).rstrip("/")
            self.router_metrics_url = ""  # smg's metrics are its own (info["metrics_url"]), not the router's
        except BaseException:
            self.stop()
            raise

    def _wait_router_ready(self, deadline: float) -> None:
        assert self.router is not None
        last = ""
        while True:
            try:
                with urllib.request.urlopen(f"{self.router_url}/readyz", timeout=2.0) as answer:
                    if answer.status == 200:
                        return
            except urllib.error.HTTPError as error:
                last = f"HTTP {error.code}: {error.read()[:300].decode('utf-8', 'replace')}"
            except (urllib.error.URLError, OSError) as error:
                last = str(error)
            if not self.router.alive():
                raise self.router.failure(f"exited with status {self.router.proc.returncode if self.router.proc else '?'}")
            if time.monotonic() >= deadline:
                raise self.router.failure(f"/readyz never answered 200 (last: {last or 'no answer'})")
            time.sleep(0.1)

    def children(self) -> list[Child]:
        out = [self.router] if self.router is not None else []
        return out + list(self.nodes.values())

    def dead(self) -> list[Child]:
        """Children that exited while they should be running."""
        return [c for c in self.children() if c.proc is not None and not c.alive()]

    def stop(self) -> dict[str, int | None]:
        """Router first (in-flight requests finish), then the nodes; SIGKILL after the grace period."""
        codes: dict[str, int | None] = {}
        if self.router is not None:
            codes.update(stop_all([self.router], self.spec.stop_grace_s))
        codes.update(stop_all(list(self.nodes.values()), self.spec.stop_grace_s))
        self.exit_codes.update(codes)
        return codes

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_SMG_ROUTING = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
"""Cache-aware settings the gateway takes from `routing_settings` (the same names as our policy's)."""

__all__ = ["ClusterSpec", "Gateway", "LocalCluster", "StartError", "check_policies", "parse_split"]
