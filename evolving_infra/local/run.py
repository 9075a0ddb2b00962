"""One local-cluster run: start the cluster, replay the trace through the router, watch the split, stop.

`run_local(config, trace, on_status)` is synchronous and owns the process's signals for its duration: the first
SIGINT or SIGTERM stops issuing requests, gives those in flight `interrupt_drain_s` to finish and shuts the
cluster down (the result says `stopped_by="interrupted"`); a second one stops at once. Whatever happens (an
exception, a child that dies, a signal) every child process is stopped before it returns or raises.

The run fails (`LocalRunError`) when the cluster does not start (naming the process and its last stderr lines)
or a child process exits while the run needs it.

Boundary: lifecycle of one run; the report is `evolving_infra.local.report`, the terminal is the CLI's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType

import aiohttp

from evolving_infra.local.agents import AgentClients, ClientSettings, ReplayProgress, ReplayResult
from evolving_infra.local.cluster import ClusterSpec, LocalCluster
from evolving_infra.local.monitor import ClusterMonitor
from evolving_infra.local.processes import StartError
from evolving_infra.router.core.control import ControlRecord, record_from_json
from evolving_infra.sim.replay import ReplayMode
from evolving_infra.traces.records import Trace


class LocalRunError(RuntimeError):
    """The run could not go on: the message says which process and why."""


@dataclass(frozen=True)
class LocalRunConfig:
    cluster: ClusterSpec
    mode: ReplayMode
    client: ClientSettings
    duration_s: float | None = None
    """Wall seconds of replay after which no new request is issued (None: until the trace ends)."""
    workdir: Path | None = None
    """Where settings files and process logs go (None: a temporary folder, removed afterwards)."""
    poll_s: float = 1.0
    interrupt_drain_s: float = 5.0


@dataclass
class RunStatus:
    """What the CLI shows while the run goes on."""

    stage: str = "starting"
    wall_s: float = 0.0
    progress: ReplayProgress = field(default_factory=ReplayProgress)
    split: str = ""
    switches: int = 0


@dataclass
class LocalRunResult:
    config: LocalRunConfig
    replay: ReplayResult
    splits: list
    switches: list
    decisions: dict[str, float]
    router_switches: dict[str, float]
    retries: float
    exit_codes: dict[str, int | None]
    startup_s: float
    stopped_by: str
    control_log: list[ControlRecord] = field(default_factory=list)
    """The router's control core log (warmup, decisions, switch orders and completions), router time."""


class _Interrupt:
    def __init__(self) -> None:
        self.count = 0


def read_control_log(path: Path) -> list[ControlRecord]:
    """The router's control log (empty when it wrote none)."""
    if not path.exists():
        return []
    return [record_from_json(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_local(config: LocalRunConfig, trace: Trace, on_status: Callable[[RunStatus], None] | None = None) -> LocalRunResult:
    """Run the cluster and replay `trace` (see the module docstring)."""
    interrupt = _Interrupt()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        interrupt.count += 1
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    status = RunStatus(split=config.cluster.split)
    temp = None if config.workdir is not None else tempfile.TemporaryDirectory(prefix="evolving-local-")
    workdir = config.workdir if config.workdir is not None else Path(temp.name)  # type: ignore[union-attr]  # temp is set when workdir is None
    cluster = LocalCluster(config.cluster, workdir)
    started = time.monotonic()
    try:
        if on_status is not None:
            on_status(status)
        try:
            cluster.start()
        except StartError as error:
            raise LocalRunError(f"the local cluster did not start: {error}") from None
        startup = time.monotonic() - started
        status.stage = "replaying"
        try:
            replay, monitor, stopped_by = asyncio.run(_replay(config, trace, cluster, interrupt, status, on_status))
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None
        status.stage = "stopping"
        if on_status is not None:
            on_status(status)
        codes = cluster.stop()
        return LocalRunResult(
            config=config, replay=replay, splits=monitor.splits, switches=monitor.switches, decisions=monitor.decisions,
            router_switches=monitor.router_switches, retries=monitor.retries, exit_codes=codes, startup_s=startup,
            stopped_by=stopped_by, control_log=read_control_log(cluster.control_log_path),
        )  # fmt: skip
    finally:
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if temp is not None:
            temp.cleanup()


async def _replay(
    config: LocalRunConfig, trace: Trace, cluster: LocalCluster, interrupt: _Interrupt, status: RunStatus,
    on_status: Callable[[RunStatus], None] | None,
) -> tuple[ReplayResult, ClusterMonitor, str]:  # fmt: skip
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    spec = config.cluster
    initial = (0, 0, spec.nodes) if spec.warmup_s > 0 else (spec.prefill, spec.nodes - spec.prefill, 0)
    monitor = ClusterMonitor(cluster.router_metrics_url, cluster.node_metrics, initial)
    clients = AgentClients(trace, cluster.router_url, config.mode, config.client)
    main = asyncio.current_task()
    assert main is not None

    def interrupted() -> None:
        clients.settings = replace(clients.settings, drain_s=min(clients.settings.drain_s, config.interrupt_drain_s))
        stop.set()

    def on_signal() -> None:
        interrupt.count += 1
        interrupted()
        if interrupt.count > 1:
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    if interrupt.count:
        interrupted()
    failure: list[str] = []
    t0 = loop.time()

    def tick(progress: ReplayProgress) -> None:
        status.wall_s = loop.time() - t0
        status.progress = progress
        if on_status is not None:
            on_status(status)

    async def watch() -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                await monitor.poll(session, clients.now())
                status.split, status.switches = monitor.split, len(monitor.switches)
                dead = cluster.dead()
                if dead:
                    child = dead[0]
                    code = child.proc.returncode if child.proc else "?"
                    failure.append(str(child.failure(f"exited with status {code} during the run")))
                    stop.set()
                    return
                if config.duration_s is not None and loop.time() - t0 >= config.duration_s:
                    stop.set()
                await asyncio.sleep(config.poll_s)

    watcher = loop.create_task(watch())
    try:
        replay = await clients.run(stop, tick)
        async with aiohttp.ClientSession() as session:
            await monitor.poll(session, clients.now())
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if failure:
        raise LocalRunError(failure[0])
    stopped_by = "interrupted" if interrupt.count else ("completed" if replay.completed else "duration")
    return replay, monitor, stopped_by
