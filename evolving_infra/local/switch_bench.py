"""Phase-switch time on a small local cluster: SwitchPhase durations as the node agents report them.

A 3-node cluster (2P1D, the static planner so the router never switches by itself) runs at speed-up 1, so the
node clock is the wall clock. Node n1 is switched prefill -> decode -> prefill ... by calling its SwitchPhase
directly, as the operator does: first while the cluster is idle, then while agents replay a small Putnam-like
workload through the router (the router learns of each switch from the node's state reports and stops sending
it old-phase work). Each answer carries `drain_seconds` (begin to the last old-phase request finishing) and
`switch_seconds` (call to serving); the phase-switch time after the drain is their difference.

Boundary: measurement orchestration; the figures are the node agents' own.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from evolving_infra.local.agents import AgentClients, ClientSettings
from evolving_infra.local.cluster import ClusterSpec, LocalCluster
from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc
from evolving_infra.sim.replay import ReplayMode


@dataclass(frozen=True)
class SwitchSample:
    target: str
    loaded: bool
    drain_s: float
    switch_s: float
    call_wall_s: float
    handed_back: int

    @property
    def after_drain_s(self) -> float:
        return max(0.0, self.switch_s - self.drain_s)


@dataclass
class SwitchBenchResult:
    samples: list[SwitchSample] = field(default_factory=list)
    requests_done: int = 0
    requests_failed: int = 0

    def summary(self, loaded: bool | None = None) -> dict[str, float | int | None]:
        xs = [s for s in self.samples if loaded is None or s.loaded is loaded]
        after = sorted(s.after_drain_s for s in xs)
        return {
            "switches": len(xs),
            "after_drain_mean_s": statistics.fmean(after) if after else None,
            "after_drain_p50_s": after[len(after) // 2] if after else None,
            "after_drain_max_s": after[-1] if after else None,
            "total_mean_s": statistics.fmean(s.switch_s for s in xs) if xs else None,
            "drain_mean_s": statistics.fmean(s.drain_s for s in xs) if xs else None,
        }


async def _flips(address: str, count: int, loaded: bool, first_generation: int, pause_s: float,
                 out: list[SwitchSample]) -> int:  # fmt: skip
    loop = asyncio.get_running_loop()
    generation = first_generation
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpc.NodeAgentStub(channel)
        for i in range(count):
            target = pb.PHASE_DECODE if i % 2 == 0 else pb.PHASE_PREFILL
            started = loop.time()
            answer = await stub.SwitchPhase(pb.SwitchPhaseRequest(target=target, generation=generation), timeout=120)
            out.append(SwitchSample("decode" if target == pb.PHASE_DECODE else "prefill", loaded, answer.drain_seconds,
                                    answer.switch_seconds, loop.time() - started, len(answer.handed_back)))  # fmt: skip
            generation += 1
            await asyncio.sleep(pause_s)
    return generation


async def _measure(cluster: LocalCluster, idle: int, loaded: int) -> SwitchBenchResult:
    result = SwitchBenchResult()
    address = cluster.node_addresses["n1"]
    generation = await _flips(address, idle, False, 1, 0.2, result.samples)
    trace = PRESETS[PresetName.PUTNAM].trace(0, 6)
    clients = AgentClients(trace, cluster.router_url, ReplayMode.closed_loop(6), ClientSettings(speed_up=1.0, drain_s=30))
    stop = asyncio.Event()
    replay = asyncio.get_running_loop().create_task(clients.run(stop))
    try:
        await asyncio.sleep(3.0)
        await _flips(address, loaded, True, generation, 1.0, result.samples)
    finally:
        stop.set()
        await replay
    result.requests_done = clients.progress.done
    result.requests_failed = clients.progress.failed
    return result


def run_switch_bench(idle: int = 6, loaded: int = 6, workdir: Path | None = None) -> SwitchBenchResult:
    """Start the cluster, measure `idle` then `loaded` switches of node n1 (an even count ends where it began)."""
    spec = ClusterSpec(nodes=3, prefill=2, speed_up=1.0, planner="static")
    with tempfile.TemporaryDirectory(prefix="evolving-switch-") as temp:
        with LocalCluster(spec, workdir or Path(temp)) as cluster:
            return asyncio.run(_measure(cluster, idle, loaded))
