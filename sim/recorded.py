"""What-if replay of recorded traffic: a hardware profile whose iteration-time coefficients are the ones a live
router fitted (`router serve --record-models FILE`), so the simulator's nodes run as fast as the recorded
cluster's did.

The models file (`router.recording.models_document`) holds per node the prefill coefficients c0..c3 (eq. 1)
and the decode coefficients d0..d2 with the MoE shape (eq. 2). Nodes are one hardware type, so each
coefficient is the median over the nodes that fitted it; sizes, bandwidths and t_acc stay the base profile's.
A file with no fitted node (the router ran on the profile's models) and no live-path section is refused: it
holds nothing to replay.

**The live path's overheads** (`LivePathOverheads`, the file's optional `live_path` section, written by
`evolving-infra local --record`): what a live request spends outside the engine model, per request and per
decode iteration, calibrated from the recording's own timestamps against a replay that charges nothing
(`calibrate_overheads`):
- `iteration_s`: per decode iteration, the middle mean (`middle_mean`) over requests of (recorded decode span -
  replayed decode span) / iterations: the engine loop's wake-up and publication time, each token's way through gRPC, the router and
  HTTP. Charged inside the simulation as a cost added to eq. 2's fixed cost d0, so it delays every request
  that shares the node. (A per-request-in-the-batch term, regressed on the replay's decode batch, was tried:
  on the tiny preset the concurrent requests are also the cold ones, so the slope took the cold start for
  contention and overcharged the replay by 18 %.)
- `request_s`: per request, the middle mean over requests of (recorded TTFT - replayed TTFT) once the iteration
  cost is charged: HTTP and routing on the router, the prefill and decode gRPC calls, the decode node's pull
  of the prompt's KV (real bytes over gRPC instead of the profile's link), and the first token's way back
  (the client sees it from the decode node, after its first iteration; the simulator's TTFT ends at the
  prefill). Charged on each replayed request's first token and end (`charge_records`).
- the live cluster's start-up transient (the first RPCs, streams and KV pulls of freshly started processes,
  stretched by the machine's load): how much longer than `request_s` the recording's first request took (its
  residual once the iteration cost is charged, less `request_s`), in two parts by where it was spent:
  - `cold_start_s`, the part before its prefill started (its recorded queue wait, `recorded_queue_s`, beyond
    the replay's): the prefill side was not taking work. Charged inside the simulation as a start-up hold
    (`hold_start`): the agents that start before the first request's arrival + `cold_start_s` start
    `cold_start_s` later (in the same order and at the same gaps, which decide who waits for whose prefix),
    their latency still counted from when they were due, and requests that wait on them (for their context,
    or for a shared prefix they compute) wait longer too. A recording without queue waits puts it all here.
  - `first_request_s`, the rest (its KV pull, the decode node's first stream): added to that request's first
    token and end only (`charge_records`); nothing waits on it.
  One sample, the one there is: the transient is measured on the run, what the hold does to the other
  requests is predicted.
Middle means (the mean of the middle half) keep a few slow requests (requests that arrived together on a busy
machine) from setting the constants, as medians would; what they cost beyond them stays uncharged, and the
fidelity check shows it. Medians were used before and made the check flaky: the residuals of a `tiny` run fall
in two clusters about 15 ms apart (when a request catches the engine loop's wake-up, on the live side's clock),
and a median of 13 jumped between them from run to run (mean TTFT 0.1-12.0 % off over ten recordings; the
middle mean on the same ten 0.1-7.6 %, docs/traces.md).

Boundary: pure conversion (plus reading the JSON file in `load_models`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolving_infra.node_agent.profile import DecodeModel, GroundTruth, HardwareProfile, PrefillModel
from evolving_infra.sim.records import RequestRecord
from evolving_infra.traces.records import Trace

MODELS_KIND = "evolving-infra-node-models"


class ModelsFileError(ValueError):
    """The models file cannot be used (message names the file and what is wrong)."""


def load_models(path: str | Path) -> dict[str, Any]:
    """Read and check a models file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelsFileError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or doc.get("kind") != MODELS_KIND or doc.get("version") != 1:
        raise ModelsFileError(f"{path}: not a node-models file (kind {MODELS_KIND!r}, version 1)")
    if not isinstance(doc.get("nodes"), dict):
        raise ModelsFileError(f"{path}: 'nodes' must be an object")
    if doc.get("live_path") is not None:
        LivePathOverheads.from_dict(doc["live_path"], source=str(path))
    return doc


@dataclass(frozen=True)
class LivePathOverheads:
    """The live path's costs outside the engine model (module docstring), in emulated seconds."""

    request_s: float
    """Per request: added to the replayed first token and end."""
    iteration_s: float
    """Per decode iteration: added to eq. 2's fixed cost d0."""
    requests: int
    """Requests the middle means were taken over."""
    cold_start_s: float = 0.0
    """Once, at the start: a hold before the cluster takes in its first requests (`hold_start`)."""
    first_request_s: float = 0.0
    """Once: added to the first request's first token and end (the rest of the start-up transient)."""

    def __post_init__(self) -> None:
        for name in ("request_s", "iteration_s", "cold_start_s", "first_request_s"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"live_path.{name} must be finite, got {value}")
        for name in ("cold_start_s", "first_request_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"live_path.{name} must be >= 0, got {getattr(self, name)}")
        if self.requests < 1:
            raise ValueError(f"live_path.requests must be >= 1, got {self.requests}")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "method": "middle-half means of the residuals of the recording against an uncharged replay; "
                "cold_start_s + first_request_s: the first request's residual beyond request_s, before and after its "
                "prefill started"}  # fmt: skip

    @classmethod
    def from_dict(cls, doc: Any, source: str = "live_path") -> LivePathOverheads:
        if not isinstance(doc, dict):
            raise ModelsFileError(f"{source}: 'live_path' must be an object")
        try:
            return cls(float(doc["request_s"]), float(doc["iteration_s"]), int(doc["requests"]),
                       float(doc.get("cold_start_s", 0.0)), float(doc.get("first_request_s", 0.0)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelsFileError(f"{source}: bad live_path: {exc}") from None


def decode_iterations(output_tokens: int, t_acc: float) -> int:
    """Decode iterations that produce `output_tokens` at `t_acc` accepted tokens per iteration."""
    return max(1, math.ceil(output_tokens / t_acc - 1e-9))


def middle_mean(values: Sequence[float]) -> float:
    """The mean of the middle half of `values`: a quarter of them (at least one once there are three) dropped
    at each end. Robust to a few slow requests like a median, and steadier than one when the residuals fall in
    two clusters (a median of a dozen jumps from one cluster to the other with a single request)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the middle mean of no values")
    cut = max(1, len(ordered) // 4) if len(ordered) >= 3 else 0
    return statistics.fmean(ordered[cut : len(ordered) - cut])


def calibrate_overheads(
    recorded: Sequence[Mapping[str, Any]], uncharged: Sequence[RequestRecord], charged_iterations: Sequence[RequestRecord],
    t_acc: float,
) -> LivePathOverheads:  # fmt: skip
    """The live path's overheads from the recording's own timestamps (`recorded_ttft_s`, `recorded_e2e_s` of its
    request rows, emulated seconds): `iteration_s` against the replay that charges nothing (`uncharged`),
    `request_s` against the replay that charges only that (`charged_iterations`), and `cold_start_s` and
    `first_request_s` from the first request (`first_request`; both 0 when the rows carry no arrivals). Replay records
    are matched to rows by request id; rows without both times, or not replayed, are left out. Negative
    estimates are charged as 0."""
    rows = {str(r["id"]): r for r in recorded if r.get("recorded_ttft_s") is not None and r.get("recorded_e2e_s") is not None}
    per_iteration = [
        ((float(rows[s.request_id]["recorded_e2e_s"]) - float(rows[s.request_id]["recorded_ttft_s"]))
         - (s.finish - s.first_token)) / decode_iterations(s.output_tokens, t_acc)
        for s in uncharged if s.request_id in rows
    ]  # fmt: skip
    per_request = [float(rows[s.request_id]["recorded_ttft_s"]) - (s.first_token - s.issued)
                   for s in charged_iterations if s.request_id in rows]  # fmt: skip
    if not per_iteration or not per_request:
        raise ValueError("no recorded request with its TTFT and E2E was replayed: nothing to calibrate on")
    request_s = max(0.0, middle_mean(per_request))
    replayed = {s.request_id: s for s in charged_iterations if s.request_id in rows}
    first_id = first_request(rows[rid] for rid in replayed)
    hold = rest = 0.0
    if first_id is not None:
        first, row = replayed[first_id], rows[first_id]
        excess = max(0.0, float(row["recorded_ttft_s"]) - (first.first_token - first.issued) - request_s)
        waited = row.get("recorded_queue_s")
        hold = excess if waited is None else min(excess, max(0.0, float(waited) - (first.prefill_start - first.queued)))
        rest = excess - hold
    return LivePathOverheads(
        request_s=request_s, iteration_s=max(0.0, middle_mean(per_iteration)), requests=len(per_request),
        cold_start_s=hold, first_request_s=rest,
    )  # fmt: skip


def first_request(recorded: Iterable[Mapping[str, Any]]) -> str | None:
    """The id of the recorded request that arrived first (earliest `recorded_arrival_s`; None: no arrivals)."""
    arrivals = [(float(r["recorded_arrival_s"]), str(r["id"])) for r in recorded if r.get("recorded_arrival_s") is not None]
    return min(arrivals)[1] if arrivals else None


def hold_start(trace: Trace, hold_s: float) -> tuple[Trace, dict[str, float]]:
    """`trace` with the cluster's start-up hold: agents that start before the first agent's start + `hold_s`
    start `hold_s` later (gaps kept). Also returns, per request it moved (each held agent's first requests: those waiting on
    nothing), the time it was due, for `count_from_due`."""
    if hold_s <= 0 or not trace.agents:
        return trace, {}
    until = min(a.start_s for a in trace.agents.values()) + hold_s
    held = {aid: a.start_s for aid, a in trace.agents.items() if a.start_s < until}
    agents = {aid: dataclasses.replace(a, start_s=a.start_s + hold_s) if aid in held else a for aid, a in trace.agents.items()}
    due = {str(r.id): held[r.agent] + r.delay_s for r in trace.requests if r.agent in held and not r.after}
    return dataclasses.replace(trace, agents=agents), due


def count_from_due(records: Sequence[RequestRecord], due: Mapping[str, float]) -> list[RequestRecord]:
    """Records of a held replay (`hold_start`) with each moved request's latency counted from when it was due."""
    return [dataclasses.replace(r, since=min(r.origin, due[r.request_id])) if r.request_id in due else r for r in records]


def with_iteration_cost(profile: HardwareProfile, overheads: LivePathOverheads, source: str = "live path") -> HardwareProfile:
    """`profile` with the live path's per-iteration cost added to every decode iteration (d0)."""
    if overheads.iteration_s == 0:
        return profile
    decode = profile.decode.model_copy(update={"d0": profile.decode.d0 + overheads.iteration_s})
    sources = {**profile.sources, "decode.d0": f"{profile.sources.get('decode.d0', 'profile')} + {source} per-iteration cost"}
    return profile.model_copy(update={"decode": decode, "sources": sources})


def charge_records(records: Sequence[RequestRecord], overheads: LivePathOverheads, first: str | None = None) -> list[RequestRecord]:
    """Replayed requests with the live path's per-request cost added to their first token and end, and
    `first_request_s` too to the request `first` (the recording's first, `first_request`)."""
    out = []
    for r in records:
        d = overheads.request_s + (overheads.first_request_s if r.request_id == first else 0.0)
        out.append(dataclasses.replace(r, first_token=r.first_token + d, finish=r.finish + d))
    return out


def profile_with_models(base: HardwareProfile, doc: dict[str, Any], source: str = "recorded models") -> HardwareProfile:
    """`base` with the recorded coefficients (median over nodes) in place of its own, and the live path's
    per-iteration cost when the file has one (a file with a live path and no fitted node keeps `base`'s
    coefficients: the router ran on the profile's models)."""
    live = doc.get("live_path")
    overheads = LivePathOverheads.from_dict(live, source=source) if live is not None else None
    if overheads is not None and not doc["nodes"]:
        return with_iteration_cost(base.model_copy(update={"name": f"{base.name}+live-path"}), overheads, source)
    fitted_profile = _fitted(base, doc, source)
    return fitted_profile if overheads is None else with_iteration_cost(fitted_profile, overheads, source)


def _fitted(base: HardwareProfile, doc: dict[str, Any], source: str) -> HardwareProfile:
    nodes = [n for n in doc["nodes"].values() if isinstance(n, dict)]
    prefill = [n["prefill"] for n in nodes if isinstance(n.get("prefill"), dict)]
    decode = [n["decode"] for n in nodes if isinstance(n.get("decode"), dict)]
    if not prefill or not decode:
        missing = "prefill" if not prefill else "decode"
        raise ModelsFileError(f"{source}: no node has a fitted {missing} model (the router kept the profile's models?)")
    try:
        p = PrefillModel(**{k: statistics.median(float(m[k]) for m in prefill) for k in ("c0", "c1", "c2", "c3")})
        d_values: dict[str, Any] = {k: statistics.median(float(m[k]) for m in decode) for k in ("d0", "d1", "d2")}
        first = decode[0]
        d = DecodeModel(**d_values, k=int(first["k"]), experts=int(first["experts"]),
                        t_fwd=float(first["t_fwd"]), t_acc=min(base.decode.t_acc, float(first["t_fwd"])))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelsFileError(f"{source}: bad coefficients: {exc}") from None
    fitted = [f"prefill.{k}" for k in ("c0", "c1", "c2", "c3")] + [f"decode.{k}" for k in ("d0", "d1", "d2")]
    absorbed = {f"truth.{k}": f"{source}: none (the fitted models absorbed it)" for k in GroundTruth.model_fields}
    sources = {**base.sources, **{k: source for k in fitted}, **absorbed}
    # The fitted coefficients were measured on the live engine, ground truth included: the replay's engine runs on
    # them alone (with the run's noise), or the ground truth's effects would count twice.
    return base.model_copy(update={"name": f"{base.name}+recorded", "prefill": p, "decode": d, "sources": sources,
                                   "truth": GroundTruth()})  # fmt: skip
