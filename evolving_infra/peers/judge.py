"""Dynamo's own replay as the judge of our Dynamo baseline: one workload, replayed open loop by Dynamo's replay
(its KV router and mocker engines, disaggregated, with our profile's timing, `dynamo_timing`) and by our
simulator under several configurations, compared figure by figure (`metrics.compare`). Open loop by default;
closed loop with `concurrency` (agents on our side, sessions in Dynamo's: one branch per agent required).

Sides (`OurSide`): `dynamo-kv` is our re-implementation of Dynamo's KV router on our SGLang-like baseline
engines at the same static split (the closest analogue of Dynamo's replay); `dynamo` is the paper's Dynamo
baseline preset (Dynamo's planner on SGLang workers behind the SGLang gateway); `evolving` is our system.
Our engines run the profile's eq. 1/2 without the ground-truth effects and noise that `simulate` adds by default
(`exact_models`): Dynamo's mocker gets one timing table fitted to those same equations for every worker
(`dynamo_timing`), so both simulators' engines take the same time and the comparison is of the systems' routing
and scheduling, not of their engines.
Every side replays the same trace open loop (agents start at their `start_s`, turns follow completions) or closed loop
from an empty cluster with the profile's models and no warmup, and each request is matched across sides by
(branch, position in the branch), which is also how Dynamo's replay names it (session id, turn index).

Boundary: runs simulations and one subprocess; the figures and the comparison are pure (`metrics`).
"""

from __future__ import annotations

import dataclasses
import enum
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.peers.dynamo_replay import DynamoSetup, find_dynamo_python, run_dynamo_replay
from evolving_infra.peers.dynamo_timing import fit_timing
from evolving_infra.peers.metrics import DEFAULT_TOLERANCE, PeerRequest, compare, summarize
from evolving_infra.sim.records import RequestRecord
from evolving_infra.traces.mooncake_export import export_rows, write_rows
from evolving_infra.traces.records import Trace

REFERENCE = "dynamo-replay"


class OurSide(enum.Enum):
    """Our simulator's configurations compared with Dynamo's replay."""

    DYNAMO_KV = "dynamo-kv"
    DYNAMO = "dynamo"
    EVOLVING = "evolving"

    def config(self) -> tuple[str, dict[str, Any]]:
        """(preset, overrides) of `sim.systems.build_config` for this side."""
        if self is OurSide.DYNAMO_KV:
            return "best-static", {"prefill_routing": "dynamo-kv"}
        return self.value, {}


def request_keys(trace: Trace) -> dict[str, str]:
    """Request id -> `<branch>#<position in the branch>` (Dynamo's session id and turn index)."""
    return {rid: f"{b.id}#{i}" for b in trace.branches.values() for i, rid in enumerate(b.requests)}


def our_requests(trace: Trace, records: Iterable[RequestRecord]) -> list[PeerRequest]:
    """Our simulator's request records as `PeerRequest`s keyed like Dynamo's."""
    keys = request_keys(trace)
    return [
        PeerRequest(
            request_id=keys[r.request_id], arrival_s=r.issued, ttft_s=r.first_token - r.issued,
            e2e_s=r.finish - r.issued, prompt_tokens=r.prompt_tokens,
            reused_tokens=min(r.cached_tokens + r.fetched_tokens, r.prompt_tokens), output_tokens=r.output_tokens,
        )  # fmt: skip
        for r in records
    ]


@dataclass(frozen=True)
class SideRun:
    name: str
    requests: list[PeerRequest]
    wall_s: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def requests_per_wall_s(self) -> float:
        return len(self.requests) / self.wall_s if self.wall_s > 0 else float("inf")


def parse_split(split: str) -> tuple[int, int]:
    """(prefill, decode) nodes of a split written `<P>P<D>D`; ValueError otherwise."""
    text = split.strip().upper()
    try:
        p, d = text.removesuffix("D").split("P")
        prefill, decode = int(p), int(d)
    except ValueError:
        raise ValueError(f"split {split!r} is not of the form <P>P<D>D, e.g. 4P5D") from None
    if prefill < 1 or decode < 1 or not text.endswith("D"):
        raise ValueError(f"split {split!r} needs at least one prefill and one decode node, as <P>P<D>D")
    return prefill, decode


def run_ours(side: OurSide, trace: Trace, *, profile: str, split: str, seed: int = 0,
             concurrency: int | None = None) -> SideRun:  # fmt: skip
    """Replay `trace` in our simulator as `side`: open loop, or closed loop with `concurrency` agents active."""
    from evolving_infra.sim.run import simulate
    from evolving_infra.sim.systems import build_config

    preset, overrides = side.config()
    p, d = parse_split(split)
    cfg = build_config(preset, profile=profile, nodes=p + d, split=split.upper(), seed=seed, warmup_s=0.0,
                       models="profile", collocated_warmup=False, agents=concurrency, exact_models=True,
                       **overrides)  # fmt: skip
    start = time.perf_counter()
    result = simulate(cfg, trace)
    wall = time.perf_counter() - start
    detail = {"preset": preset, "overrides": overrides, "engines": "exact eq. 1/2 (as Dynamo's mocker)",
              "events": result.events, "stop_reason": result.stop_reason,
              "switches": len(result.switches), "sim_end_s": result.end_time}  # fmt: skip
    return SideRun(side.value, our_requests(trace, result.records), wall, detail)


def matched(sides: Sequence[SideRun]) -> tuple[list[SideRun], int]:
    """Every side restricted to the requests that every side completed, and how many were dropped."""
    common = set.intersection(*({r.request_id for r in s.requests} for s in sides)) if sides else set()
    most = max((len(s.requests) for s in sides), default=0)
    out = [SideRun(s.name, [r for r in s.requests if r.request_id in common], s.wall_s, s.detail) for s in sides]
    return out, most - len(common)


def judge_dynamo(
    trace: Trace, *, profile: str, split: str, sides: Sequence[OurSide] = tuple(OurSide), seed: int = 0,
    block_tokens: int = 64, service_s: float = 0.0, host_offload: bool = True, python: Path | None = None,
    timeout_s: float = 600.0, tolerance: float = DEFAULT_TOLERANCE, log_path: Path | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
    """Replay `trace` in Dynamo's replay and in our simulator as each of `sides`; the report (JSON-ready).

    `concurrency`: closed loop, that many agents active on our side and that many sessions in Dynamo's
    (`replay_concurrency`). Dynamo counts sessions, i.e. branches, so the trace must have one branch per agent
    for the two to mean the same (ValueError otherwise)."""
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError(f"closed-loop concurrency must be >= 1, got {concurrency}")
        if len(trace.branches) != len(trace.agents):
            raise ValueError(f"a closed-loop comparison needs one branch per agent (Dynamo's replay_concurrency counts "
                             f"sessions, i.e. branches): this trace has {len(trace.agents)} agents and "
                             f"{len(trace.branches)} branches; compare it open loop")  # fmt: skip
    python = python or find_dynamo_python()  # fail before any work when the side environment is missing
    hw = load_profile(profile)
    p, d = parse_split(split)
    fit = fit_timing(hw, trace)
    rows, export = export_rows(trace, block_tokens, service_s=service_s)
    setup = dataclasses.replace(DynamoSetup.for_profile(hw, p, d, host_offload=host_offload, block_tokens=block_tokens),
                                replay_concurrency=concurrency)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="evolving-infra-peers-") as tmp:
        path = Path(tmp) / "trace.mooncake.jsonl"
        write_rows(rows, path)
        dyn = run_dynamo_replay(path, setup, fit, python=python, timeout_s=timeout_s, log_path=log_path)
    runs = [SideRun(REFERENCE, dyn.requests, dyn.wall_s, {"failed": dyn.failed, "version": dyn.dynamo_version})]
    runs += [run_ours(s, trace, profile=profile, split=split, seed=seed, concurrency=concurrency) for s in sides]
    common, dropped = matched(runs)
    metrics = {s.name: summarize(s.requests) for s in common}
    rows_cmp = compare(metrics, REFERENCE, tolerance)
    return {
        "trace": {"name": trace.name, "requests": len(trace.requests), "agents": len(trace.agents),
                  "branches": len(trace.branches)},
        "profile": profile, "split": split, "seed": seed, "reference": REFERENCE, "tolerance": tolerance,
        "loop": "open" if concurrency is None else {"closed": concurrency},
        "export": export.to_dict(), "service_s": service_s, "timing_fit": fit.describe(),
        "dynamo_setup": {"prefill_workers": setup.prefill_workers, "decode_workers": setup.decode_workers,
                         "block_tokens": setup.block_tokens, "router_mode": setup.router_mode,
                         "engine": setup.engine},
        "matched_requests": len(common[0].requests) if common else 0, "unmatched_requests": dropped,
        "metrics": {name: m.to_dict() for name, m in metrics.items()},
        "comparison": [r.to_dict() for r in rows_cmp],
        "speed": {s.name: {"wall_s": s.wall_s, "requests_per_wall_s": s.requests_per_wall_s} for s in runs},
        "details": {s.name: s.detail for s in runs},
    }  # fmt: skip
