"""The simulator's fidelity check against the live system: replay a local run's recording (the router's
`trace.jsonl`, and its fitted `models.json` when it fitted any) in the simulator with the run's cluster settings,
and compare mean TTFT, mean E2E and the KV hit rate with the live run's report.

The replay is open-loop on the recorded arrival times (`start_s`) and pauses, on the same nodes, initial split,
planner, prefill routing and hardware profile, on the emulated clock (the recording is scaled by the run's
speed-up). When the live router fitted no model (no warmup, or one too short) it used the profile's models,
and so does the replay; otherwise the replay's nodes run on the recorded fitted coefficients and the replay's
router fits its own during the same warmup. Both sides are scored over the whole run, warmup included. The bound is relative: |replay - live| / live.

Boundary: building the replay's settings, running it (`sim.run.simulate`) and comparing numbers; files are
read and written by the caller.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.metrics import compute_run_metrics
from evolving_infra.sim.records import ScoreWindow
from evolving_infra.sim.recorded import load_models, profile_with_models
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

    @property
    def within_bound(self) -> bool:
        return all(f.relative_error is not None and f.relative_error <= self.bound for f in self.figures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": self.bound, "within_bound": self.within_bound, "replay_command": self.command,
            "figures": [{**asdict(f), "relative_error": f.relative_error} for f in self.figures],
        }  # fmt: skip


def replay_config(report: Mapping[str, Any], record_dir: Path) -> tuple[SimConfig, str]:
    """The simulator settings that mirror the live run of `report` (and the equivalent command line)."""
    cluster = report["config"]["cluster"]
    warmup = float(cluster.get("warmup_s") or 0.0)
    profile = str(cluster["profile"])
    models = record_dir / "models.json"
    extra = ""
    fitted = warmup > 0 and models.is_file() and bool(load_models(models)["nodes"])
    if fitted:
        recorded = profile_with_models(load_profile(profile), load_models(models), source=f"recorded models {models}")
        target = Path(tempfile.mkdtemp(prefix="evolving-fidelity-")) / f"{recorded.name}.json"
        target.write_text(recorded.model_dump_json(indent=1), encoding="utf-8")
        profile, extra = str(target), f" --models-from {models}"
    split = report["config"]["split"]
    cfg = build_config(
        "evolving", profile=profile, nodes=int(cluster["nodes"]), split=split, planner=cluster["planner"],
        prefill_routing=cluster["routing"], warmup_s=warmup, models="fitted" if fitted else "profile",
        seed=int(cluster.get("seed", 0)),
    )  # fmt: skip
    command = (f"evolving-infra simulate {record_dir / 'trace.jsonl'} --profile {cluster['profile']}{extra} "
               f"--nodes {cluster['nodes']} --split {split} --planner {cluster['planner']} "
               f"--routing {cluster['routing']} --warmup {warmup:g}")  # fmt: skip
    return cfg, command


def check_fidelity(report: Mapping[str, Any], record_dir: Path, bound: float = BOUND) -> Fidelity:
    """Replay the recording in `record_dir` and compare it with the live `report` (report.json's content)."""
    cfg, command = replay_config(report, record_dir)
    result = simulate(cfg, load_trace(record_dir / "trace.jsonl"))
    # Scored like the live report: every request of the run, warmup included.
    end = max([r.finish for r in result.records] + [1e-9])
    o = compute_run_metrics(result.records, ScoreWindow(0.0, end)).overall
    live = report["latency_s"]
    figures = (
        Figure("mean TTFT (s)", live["ttft"]["mean"], o.ttft_s.mean),
        Figure("mean E2E (s)", live["e2e"]["mean"], o.e2e_s.mean),
        Figure("KV hit rate", report["kv"]["hit_rate"], o.kv_hit_rate),
    )
    return Fidelity(figures, bound, command)


def write_fidelity(fidelity: Fidelity, path: Path) -> None:
    path.write_text(json.dumps(fidelity.to_dict(), indent=1) + "\n", encoding="utf-8")
