"""The simulator's fidelity check against the live system: replay a local run's recording (the router's
`trace.jsonl`, and its fitted `models.json` when it fitted any) in the simulator with the run's cluster settings,
and compare mean TTFT, mean E2E and the KV hit rate with the live run's report.

The replay is open-loop on the recorded arrival times (`start_s`) and pauses, on the same nodes, initial split,
planner, prefill routing and hardware profile, on the emulated clock (the recording is scaled by the run's
speed-up). When the live router fitted no model (no warmup, or one too short) it used the profile's models,
and so does the replay; otherwise the replay's nodes run on the recorded fitted coefficients and the replay's
router fits its own during the same warmup. Both sides are scored over the whole run, warmup included. The bound is relative: |replay - live| / live.

The live path's own costs (HTTP, routing, gRPC, the KV pull, token streaming, the engine loop, and the cluster's
start-up transient: see `sim.recorded`) are calibrated from the recording's timestamps in two
uncharged-then-charged replays, written to the recording's `models.json` (`live_path`, so `simulate
--models-from` charges the per-iteration part too) and charged in the replay that is compared (a third run when
there is a start-up hold). The figures of the uncharged replay are kept beside (`uncharged`).

Boundary: building the replay's settings, running it (`sim.run.simulate`) and comparing numbers; files are
read and written by the caller.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.metrics import compute_run_metrics
from evolving_infra.sim.records import RequestRecord, ScoreWindow
from evolving_infra.sim.recorded import (
    LivePathOverheads, calibrate_overheads, charge_records, count_from_due, first_request, hold_start, load_models,
    profile_with_models, with_iteration_cost,
)  # fmt: skip
from evolving_infra.sim.run import simulate
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.loader import load_trace

BOUND = 0.10
"""The stated bound: each figure of the replay within 10 % of the live run's."""


@dataclass(frozen=True)
class Figure:
    name: str
    live: float | None
    replay: float | None

    @property
    def relative_error(self) -> float | None:
        if self.live is None or self.replay is None or self.live == 0:
            return None
        return abs(self.replay - self.live) / abs(self.live)


@dataclass(frozen=True)
class Fidelity:
    figures: tuple[Figure, ...]
    bound: float
    command: str
    uncharged: tuple[Figure, ...] = ()
    """The same figures from a replay that charges none of the live path's overheads."""
    overheads: LivePathOverheads | None = None

    @property
    def within_bound(self) -> bool:
        return all(f.relative_error is not None and f.relative_error <= self.bound for f in self.figures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": self.bound, "within_bound": self.within_bound, "replay_command": self.command,
            "figures": [{**asdict(f), "relative_error": f.relative_error} for f in self.figures],
            "uncharged": [{**asdict(f), "relative_error": f.relative_error} for f in self.uncharged],
            "live_path": None if self.overheads is None else self.overheads.to_dict(),
        }  # fmt: skip


def replay_config(
    report: Mapping[str, Any], record_dir: Path, overheads: LivePathOverheads | None = None,
) -> tuple[SimConfig, str]:  # fmt: skip
    """The simulator settings that mirror the live run of `report` (and the equivalent command line); with
    `overheads`, the nodes' decode iterations carry the live path's per-iteration cost."""
    cluster = report["config"]["cluster"]
    warmup = float(cluster.get("warmup_s") or 0.0)
    profile = str(cluster["profile"])
    models = record_dir / "models.json"
    extra = ""
    doc = load_models(models) if models.is_file() else None
    fitted = warmup > 0 and doc is not None and bool(doc["nodes"])
    if fitted or overheads is not None:
        base = load_profile(profile)
        if fitted:
            assert doc is not None
            base = profile_with_models(base, {**doc, "live_path": None}, source=f"recorded models {models}")
        if overheads is not None:
            base = with_iteration_cost(base, overheads, source=f"live path {models}")
        target = Path(tempfile.mkdtemp(prefix="evolving-fidelity-")) / f"{base.name}.json"
        target.write_text(base.model_dump_json(indent=1), encoding="utf-8")
        profile, extra = str(target), f" --models-from {models}"
    split = report["config"]["split"]
    planner_settings: dict[str, Any] = {}
    if cluster["planner"] == "ours":  # the run's window, slices and cooldown (emulated seconds), as its router had them
        planner_settings = {"window_s": float(cluster["window_s"]), "slices": int(cluster["slices"]),
                            "cooldown_s": float(cluster["cooldown_s"])}  # fmt: skip
    cfg = build_config(
        "evolving", profile=profile, nodes=int(cluster["nodes"]), split=split, planner=cluster["planner"],
        prefill_routing=cluster["routing"], warmup_s=warmup, models="fitted" if fitted else "profile",
        seed=int(cluster.get("seed", 0)), planner_settings=planner_settings or None,
    )  # fmt: skip
    command = (f"evolving-infra simulate {record_dir / 'trace.jsonl'} --profile {cluster['profile']}{extra} "
               f"--nodes {cluster['nodes']} --split {split} --planner {cluster['planner']} "
               f"--routing {cluster['routing']} --warmup {warmup:g}"
               + "".join(f" --planner-set {k}={v:g}" for k, v in planner_settings.items()))  # fmt: skip
    return cfg, command


def check_fidelity(report: Mapping[str, Any], record_dir: Path, bound: float = BOUND) -> Fidelity:
    """Replay the recording in `record_dir` and compare it with the live `report` (report.json's content):
    calibrate the live path's overheads on the recording (module docstring), store them in its models.json
    (when there is one), and compare the replay that charges them."""
    trace_path = record_dir / "trace.jsonl"
    trace = load_trace(trace_path)
    rows = [json.loads(line) for line in trace_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r.get("kind") == "request"]
    t_acc = load_profile(str(report["config"]["cluster"]["profile"])).decode.t_acc
    cfg, _ = replay_config(report, record_dir)
    uncharged = simulate(cfg, trace).records
    first = calibrate_overheads(rows, uncharged, uncharged, t_acc)
    with_cost = dataclasses.replace(first, request_s=0.0)
    cfg_cost, _ = replay_config(report, record_dir, with_cost)
    iterations_charged = simulate(cfg_cost, trace).records
    overheads = calibrate_overheads(rows, uncharged, iterations_charged, t_acc)
    if overheads.cold_start_s > 0:
        held, due = hold_start(trace, overheads.cold_start_s)
        iterations_charged = count_from_due(simulate(cfg_cost, held).records, due)
    charged = charge_records(iterations_charged, overheads, first_request(rows))
    models = record_dir / "models.json"
    if models.is_file():
        doc = load_models(models)
        models.write_text(json.dumps({**doc, "live_path": overheads.to_dict()}, indent=1) + "\n", encoding="utf-8")
    _, command = replay_config(report, record_dir, overheads)
    return Fidelity(_figures(report, charged), bound, command, _figures(report, uncharged), overheads)


def _figures(report: Mapping[str, Any], records: list[RequestRecord]) -> tuple[Figure, ...]:
    # Scored like the live report: every request of the run, warmup included.
    end = max([r.finish for r in records] + [1e-9])
    o = compute_run_metrics(records, ScoreWindow(0.0, end)).overall
    live = report["latency_s"]
    return (
        Figure("mean TTFT (s)", live["ttft"]["mean"], o.ttft_s.mean),
        Figure("mean E2E (s)", live["e2e"]["mean"], o.e2e_s.mean),
        Figure("KV hit rate", report["kv"]["hit_rate"], o.kv_hit_rate),
    )


def write_fidelity(fidelity: Fidelity, path: Path) -> None:
    path.write_text(json.dumps(fidelity.to_dict(), indent=1) + "\n", encoding="utf-8")
