"""`evolving-infra simulate`: run the cluster simulator on a trace file or a synthetic workload.

    evolving-infra simulate TRACE --agents 90 --system evolving
    evolving-infra simulate --workload cc --agents 90 --system dynamo --warmup 300 --duration 600 --out runs/dyn

A preset (`--system`) sets every policy; individual flags override it. Progress (simulated time, events/s) goes
to stderr; the result is a table on the terminal, or JSON with `--json`. `--out DIR` writes `metrics.json` and
`requests.jsonl` (and is the hook for plots). Bad flags end with `error: ...` and exit status 2.

Boundary: argument parsing, progress and printing; the simulation is `evolving_infra.sim`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.core.eviction import EvictionPolicyName
from evolving_infra.node_agent.engine import DataPlane
from evolving_infra.node_agent.profiles import ProfileError, load_profile
from evolving_infra.router.planner import PlannerName
from evolving_infra.router.routing import DecodePolicyName, PrefillPolicyName
from evolving_infra.sim.config import ModelSource, SimConfig, SystemName
from evolving_infra.sim.kernel import Progress as KernelProgress
from evolving_infra.sim.models import WarmupTooShort
from evolving_infra.sim.plots import write_plots
from evolving_infra.sim.run import SimResult, ideal_by_request, simulate, workload_stream
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.errors import TraceError
from evolving_infra.traces.growing import GrowingTrace
from evolving_infra.traces.loader import load_trace
from evolving_infra.traces.records import Trace
from evolving_infra.workloads import KINDS


def _values(enum: Any) -> list[str]:
    return [m.value for m in enum]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="simulate a cluster in virtual time on a trace or a synthetic workload",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", metavar="TRACE", help="trace file (.jsonl / .jsonl.gz); or use --workload")
    p.add_argument("--workload", choices=list(KINDS), help="generate a synthetic workload of this kind instead")
    p.add_argument("--trace-agents", type=int, help="agents in the generated workload (default: 2 x --agents)")
    p.add_argument("--system", choices=_values(SystemName), default="evolving", help="preset (default evolving)")
    p.add_argument("--planner", metavar="NAME", help=f"planner: {', '.join(_values(PlannerName))} or a plugin's")
    p.add_argument("--routing", metavar="NAME",
                   help=f"prefill routing policy: {', '.join(_values(PrefillPolicyName))} or a plugin's")
    p.add_argument("--decode-routing", metavar="NAME", help=f"decode binder: {', '.join(_values(DecodePolicyName))}")
    p.add_argument("--planner-set", action="append", default=None, metavar="KEY=VALUE",
                   help="a setting of the planner (repeatable; VALUE is JSON or a string), e.g. window_s=40, slices=10, "
                   "cooldown_s=120 for ours")  # fmt: skip
    p.add_argument("--plugin", action="append", default=None, metavar="MODULE_OR_FILE",
                   help="load a policy module first (repeatable): a dotted module name or a .py file")
    p.add_argument("--eviction", metavar="NAME", help=f"host eviction order: {', '.join(_values(EvictionPolicyName))} or a plugin's")
    p.add_argument("--data-plane", choices=_values(DataPlane))
    p.add_argument("--pool", choices=["shared", "private"], help="host memory: one shared pool or private per node")
    p.add_argument("--models", choices=_values(ModelSource), help="node models: fitted online or the profile's")
    p.add_argument("--profile", help="built-in hardware profile name or a profile file")
    p.add_argument("--models-from", metavar="MODELS.json",
                   help="node models a live router fitted (router serve --record-models): the nodes run with these "
                   "coefficients (sizes and links stay the profile's); for what-if replays of recorded traffic")
    p.add_argument("--nodes", type=int, help="nodes in the cluster (default 9)")
    p.add_argument("--split", help="initial split, e.g. 6P3D (default 6P3D)")
    p.add_argument("--agents", type=int, help="closed-loop concurrency (omit for open-loop replay of start_s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the run and of a generated workload (default 0)")
    p.add_argument("--warmup", type=float, help="warmup seconds excluded from scoring (default 1800)")
    p.add_argument("--duration", type=float, help="scored seconds after warmup (default: until the trace ends)")
    p.add_argument("--noise", type=float, help="relative std. dev. of the engines' iteration-time noise (default 0.05)")
    p.add_argument("--exact-models", action="store_true", default=None,
                   help="debugging switch: engines time iterations by eq. 1 and 2 alone (no ground-truth effects, "
                   "no noise), so the fitted models can be exact")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")
    p.add_argument("--out", metavar="DIR", help="write metrics.json, requests.jsonl and PNG plots (split, latency CDF, KV lost) into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    from evolving_infra.fleet.sim_cli import add_fleet_arguments  # --fleet: a fleet of partitions (fleet.sim_cli)

    add_fleet_arguments(p)
    p.set_defaults(handler=_run)


def _config(args: argparse.Namespace) -> SimConfig:
    for flag in ("nodes", "agents", "trace_agents"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CliError(f"--{flag.replace('_', '-')} must be >= 1, got {value}", USAGE_ERROR)
    overrides: dict[str, Any] = {
        "planner": args.planner, "prefill_routing": args.routing, "decode_routing": args.decode_routing,
        "eviction": args.eviction, "data_plane": args.data_plane, "models": args.models, "profile": args.profile,
        "nodes": args.nodes, "split": args.split, "agents": args.agents, "seed": args.seed,
        "warmup_s": args.warmup, "duration_s": args.duration, "noise": args.noise,
        "exact_models": args.exact_models, "planner_settings": _key_values(args.planner_set, "--planner-set"),
        "shared_pool": None if args.pool is None else args.pool == "shared", "plugins": args.plugin,
    }
    if args.nodes is not None and args.split is None:
        overrides["split"] = f"{max(1, (2 * args.nodes) // 3)}P{args.nodes - max(1, (2 * args.nodes) // 3)}D"
    if args.warmup is not None and args.warmup == 0 and args.models is None:
        overrides["models"] = "profile"
    try:
        return build_config(args.system, **overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise CliError(f"invalid settings: {problems}", USAGE_ERROR) from None
    except ValueError as exc:
        raise CliError(str(exc), USAGE_ERROR) from None


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "fleet", None):
        from evolving_infra.fleet.sim_cli import run_fleet

        return run_fleet(args)
    if (args.trace is None) == (args.workload is None):
        raise CliError("give either a TRACE file or --workload KIND (not both)", USAGE_ERROR)
    cfg = _config(args)
    err = Console(stderr=True)
    if args.models_from is not None:
        cfg = _with_recorded_models(cfg, args.models_from)
    try:
        if args.workload is not None:
            if cfg.agents is None and args.trace_agents is None:
                raise CliError("--workload needs --agents (closed loop) or --trace-agents (open loop)", USAGE_ERROR)
            count = args.trace_agents or 2 * (cfg.agents or 1)
            trace: Trace | GrowingTrace = workload_stream(args.workload, count, args.seed)  # agents made as started
        else:
            trace = load_trace(args.trace)
    except TraceError as exc:
        raise CliError(f"cannot load trace: {exc}", USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot read {args.trace!r}: {exc.strerror or exc}", USAGE_ERROR) from None
    total = cfg.scored_end
    start = time.perf_counter()
    bar = Progress(TextColumn("[bold]simulate"), BarColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                   console=err, disable=args.quiet, transient=True)
    with bar:
        task = bar.add_task("sim", total=total, info="")

        def report(p: KernelProgress) -> None:
            wall = time.perf_counter() - start
            rate = p.processed / wall if wall > 0 else 0.0
            bar.update(task, completed=min(p.now, total) if total else None,
                       info=f"t={p.now:,.0f} s  {p.processed:,} events  {rate:,.0f} events/s")

        try:
            result = simulate(cfg, trace, progress=report)
        except ProfileError as exc:
            raise CliError(str(exc), USAGE_ERROR) from None
        except WarmupTooShort as exc:
            raise CliError(str(exc), USAGE_ERROR) from None
    wall = time.perf_counter() - start
    if args.models_from is not None:
        result = _charge_live_path(result, trace, args.models_from, err)
    paths = result.write(args.out) if args.out else {}
    if args.out:
        ideal = ideal_by_request(trace, load_profile(cfg.profile).page_tokens)
        window = (result.metrics.window_start, result.metrics.window_end)
        paths.update(write_plots(result.records, result.splits, ideal, window, cfg.nodes, args.out))
    if args.json:
        print(json.dumps(result.metrics.to_dict(), indent=2))
    else:
        _table(result, wall)
    for name, path in paths.items():
        err.print(f"wrote {name}: {path}")
    err.print(f"simulated {result.end_time:,.0f} s in {wall:,.1f} s wall ({result.events:,} events)")
    return 0


def _key_values(items: list[str] | None, flag: str) -> dict[str, Any] | None:
    """`KEY=VALUE` items as a dict, each VALUE read as JSON when it is JSON (numbers, booleans, lists), else as
    a string; None when none was given."""
    if not items:
        return None
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"{flag} takes KEY=VALUE, got {item!r}", USAGE_ERROR)
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def _with_recorded_models(cfg: SimConfig, path: str) -> SimConfig:
    """`cfg` on a profile file (in the temp folder) with the recorded models' coefficients."""
    import tempfile
    from pathlib import Path

    from evolving_infra.sim.recorded import ModelsFileError, load_models, profile_with_models

    try:
        profile = profile_with_models(load_profile(cfg.profile), load_models(path), source=f"recorded models {path}")
    except (ModelsFileError, ProfileError) as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", USAGE_ERROR) from None
    folder = Path(tempfile.mkdtemp(prefix="evolving-recorded-"))
    target = folder / f"{profile.name}.json"
    target.write_text(profile.model_dump_json(indent=1), encoding="utf-8")
    return cfg.model_copy(update={"profile": str(target)})


def _charge_live_path(result: SimResult, trace: Trace | GrowingTrace, path: str, err: Console) -> SimResult:
    """A recording's models file with a live path (`live_path.request_s`, `local --record`): each request's first
    token and end come that much later, as in the fidelity check (docs/traces.md), so a what-if replay reports what
    the clients would have seen; the per-iteration cost is already in the engines (`_with_recorded_models`). The
    start-up transient of the recorded run is not charged: it belongs to that run's start, not to a what-if."""
    from evolving_infra.sim.recorded import LivePathOverheads, charge_records, load_models
    from evolving_infra.sim.run import rescore

    live = load_models(path).get("live_path")
    if live is None:
        return result
    overheads = LivePathOverheads.from_dict(live, source=f"recorded models {path}")
    if overheads.request_s <= 0:
        return result
    err.print(f"live path of {path}: {1000 * overheads.request_s:.1f} ms per request added to each first token and end, "
              f"{1000 * overheads.iteration_s:.2f} ms per decode iteration in the engines")  # fmt: skip
    charged = charge_records(result.records, dataclasses.replace(overheads, first_request_s=0.0))
    return rescore(result, trace, charged, {"live_path_request_s": overheads.request_s})


def planner_summary(extra: Mapping[str, Any], most: int = 8) -> str | None:
    """One line per run on our planner's decisions (switches and holds, from the metrics' `planner_switch_decisions`
    and `planner_hold_decisions`): when, what, and for a hold the best candidate and why it did not qualify; the
    last `most` decisions when there are more. None when the planner weighed nothing (static runs, other planners
    without switches)."""
    switches = list(extra.get("planner_switch_decisions") or [])
    holds = list(extra.get("planner_hold_decisions") or [])
    if not switches and not holds:
        return None
    from evolving_infra.fleet.sim_report import planner_holds

    decisions = sorted(switches + holds, key=lambda d: d["at"])
    parts: list[str] = []
    for d in decisions[-most:]:
        candidates = d.get("candidates") or []
        gained = [c for c in candidates if c.get("mean_gain") is not None]
        if d["outcome"] == "switch":
            chosen = [c for c in candidates if c.get("chosen")]
            what = f"-> {chosen[0]['split']} ({chosen[0]['mean_gain']:+.2f} req/s)" if chosen else "switch"
        elif gained:
            best = max(gained, key=lambda c: c["mean_gain"])
            what = f"hold (best {best['split']} {best['mean_gain']:+.2f} req/s, {best['verdict'].replace('_', ' ')})"
        else:
            what = "hold (too few slices)"
        parts.append(f"{d['at']:,.0f} s {what}")
    refused = planner_holds(extra)["kv_refused_moves"]
    head = f"planner: {len(switches)} switch{'es' if len(switches) != 1 else ''}, {len(holds)} hold{'s' if len(holds) != 1 else ''}"
    if refused:
        head += f"; {refused} candidate moves refused by the KV check"
    more = f" (last {most} of {len(decisions)})" if len(decisions) > most else ""
    return f"{head}{more}: " + "; ".join(parts)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(result: SimResult, wall: float) -> None:
    m = result.metrics
    cfg = result.config
    table = Table(title=f"{cfg.system.value if cfg.system else 'custom'}: {cfg.nodes} nodes from {cfg.split}, "
                  f"scored {m.window_start:,.0f}-{m.window_end:,.0f} s")
    table.add_column("workload")
    for col in ("requests", "req/s", "TTFT mean", "TTFT p95", "E2E mean", "E2E p95", "TPOT ms", "KV hit",
                "lost reuse"):
        table.add_column(col, justify="right")
    groups = [("all", m.overall), *m.by_workload.items()] if len(m.by_workload) > 1 else [("all", m.overall)]
    for name, g in groups:
        tpot = None if g.tpot_s.mean is None else g.tpot_s.mean * 1000
        table.add_row(name, str(g.requests), _fmt(g.throughput_rps), _fmt(g.ttft_s.mean), _fmt(g.ttft_s.p95),
                      _fmt(g.e2e_s.mean), _fmt(g.e2e_s.p95), _fmt(tpot), _fmt(g.kv_hit_rate, 4),
                      _fmt(g.lost_kv_reuse, 4))
    console = Console(file=sys.stdout)
    console.print(table)
    splits = ", ".join(f"{s} {share:.0%}" for s, share in m.split_share.items())
    console.print(f"switches: {m.switches} (mean {_fmt(m.mean_switch_s, 1)} s); splits: {splits or '-'}; "
                  f"prefill queue balance: {_fmt(m.queue_balance_ratio)}")
    summary = planner_summary(m.extra)
    if summary:
        console.print(summary)
    fits = m.extra.get("simulation", {}).get("fitted_models", {})
    errors = [f"{phase} {100 * fits[f'{phase}_held_out_error_median']:.1f} % (max {100 * fits[f'{phase}_held_out_error_max']:.1f} %)"
              for phase in ("prefill", "decode") if f"{phase}_held_out_error_median" in fits]  # fmt: skip
    if errors:
        console.print(f"fitted models' held-out error, median over nodes: {'; '.join(errors)}")
