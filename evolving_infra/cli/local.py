"""`evolving-infra local [TRACE] [--preset P] ...`: run the whole system on this machine and replay a workload.

Starts N node agents and the router as local processes (evolving_infra.local), replays a trace file or a
built-in preset through the router's HTTP API, shows live progress (requests, throughput, TTFT, KV hit rate,
the split and switches), and writes `report.md`, `report.json`, `requests.jsonl` and plots into `--out`
(default `runs/local-<timestamp>`). With no arguments it runs the `shift` preset (about two minutes), which
makes the planner re-split the cluster. With `--against smg` the same workload then runs through our cache-aware
baseline and through SGLang's real gateway at a static split, and the report compares the three
(`evolving_infra.local.against`).

Exit status: 0 when the run finished with every request answered; 1 when requests failed or the cluster broke
(the message names the process and its last log lines); 2 for bad arguments; 130 after Ctrl-C (a partial
report is still written).

Boundary: arguments, terminal output and files; the run is `evolving_infra.local.run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.local.against import Peer, SideKey, compare, format_value, peer_sides
from evolving_infra.local.agents import ClientSettings
from evolving_infra.local.cluster import ClusterSpec, Gateway, check_policies, parse_split
from evolving_infra.local.presets import PRESETS, Preset, PresetName, preset
from evolving_infra.local.report import markdown, write_report
from evolving_infra.local.run import LocalRunConfig, LocalRunError, LocalRunResult, RunStatus, run_local
from evolving_infra.node_agent.service.sglang_http import ServerIdentity
from evolving_infra.router.planner import PlannerName
from evolving_infra.router.routing import PrefillPolicyName
from evolving_infra.sim.replay import ReplayMode
from evolving_infra.traces import TraceError, load_trace
from evolving_infra.traces.records import Trace


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("local", help="run node agents and a router locally and replay an agent workload through it",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)  # fmt: skip
    p.add_argument("trace", nargs="?", type=Path, default=None, metavar="TRACE", help="trace file (.jsonl / .jsonl.gz)")
    p.add_argument("--preset", choices=[n.value for n in PresetName], default=None,
                   help="built-in workload (default: shift, unless TRACE is given): "
                   + "; ".join(f"{p.name.value}: {p.summary}" for p in PRESETS.values()))  # fmt: skip
    p.add_argument("--nodes", type=int, default=None, help="node agents (default: the preset's, 4)")
    p.add_argument("--split", default=None, help="initial split, e.g. 2P2D (default: half and half)")
    p.add_argument("--agents", type=int, default=None, help="closed loop: agents kept active (preset: its scale)")
    p.add_argument("--speed-up", type=float, default=None, help="emulated time runs this many times faster than wall time")
    p.add_argument("--duration", type=float, default=None, help="stop issuing after this many wall seconds")
    p.add_argument("--planner", default="ours", metavar="NAME",
                   help=f"phase-split planner: {', '.join(n.value for n in PlannerName)} or a plugin's (default ours)")
    p.add_argument("--routing", default="ttft", metavar="NAME",
                   help=f"prefill routing: {', '.join(n.value for n in PrefillPolicyName)} or a plugin's (default ttft)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="load a policy module in the router first (repeatable): a dotted module name or a .py file")
    p.add_argument("--window", type=float, default=None, help="planner window, emulated seconds (preset's: 40)")
    p.add_argument("--slices", type=int, default=None, help="slices per planner window")
    p.add_argument("--cooldown", type=float, default=None, help="no re-split this long after one, emulated seconds")
    p.add_argument("--warmup", type=float, default=None,
                   help="collocated warmup before the initial split, emulated seconds (preset's; 0: none)")
    p.add_argument("--max-in-flight", type=int, default=64, help="requests open at once (default 64)")
    p.add_argument("--out", type=Path, default=None, help="report folder (default runs/local-<timestamp>)")
    p.add_argument("--work-dir", type=Path, default=None, help="keep settings files and process logs here")
    p.add_argument("--record", type=Path, default=None, metavar="DIR",
                   help="the router records the run into DIR: trace.jsonl (what it served) and models.json")
    p.add_argument("--gateway", choices=[g.value for g in Gateway], default=Gateway.OURS.value,
                   help="what fronts the node agents: our router (default), or smg, SGLang's model gateway in PD mode "
                   "with cache-aware prefill routing at the static split (scripts/peers/setup-smg.sh)")  # fmt: skip
    p.add_argument("--against", choices=[x.value for x in Peer], default=None, metavar="PEER",
                   help="then run the same workload through our cache-aware baseline and through the real peer (smg: "
                   "SGLang's gateway, scripts/peers/setup-smg.sh) at a static split, and compare the three in the report")
    p.add_argument("--against-split", default=None, metavar="SPLIT",
                   help="the static split of the --against runs (default: the initial split)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated workload and the cluster")
    p.add_argument("--noise", type=float, default=None,
                   help="relative iteration-time noise of the engines (default: the node agents', 0.05)")
    p.add_argument("--exact-models", action="store_true",
                   help="debugging switch: iteration times are eq. 1 and 2 alone (no ground-truth effects, no noise)")
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.set_defaults(handler=_run)


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise CliError(f"{name} must be > 0, got {value:g}", USAGE_ERROR)


def _configure(args: argparse.Namespace) -> tuple[LocalRunConfig, Trace, str]:
    if args.trace is not None and args.preset is not None:
        raise CliError("give a TRACE file or --preset, not both", USAGE_ERROR)
    for name in ("nodes", "agents", "speed_up", "duration", "window", "slices", "cooldown", "max_in_flight"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    base: Preset = preset(PresetName.SHIFT if args.trace is None and args.preset is None else (args.preset or "shift"))
    if args.trace is not None:
        try:
            trace = load_trace(args.trace)
        except TraceError as exc:
            raise CliError(str(exc), USAGE_ERROR) from exc
        except OSError as exc:
            raise CliError(f"cannot read {args.trace}: {exc.strerror or exc}", USAGE_ERROR) from exc
        label = str(args.trace)
        mode = ReplayMode.closed_loop(args.agents) if args.agents else ReplayMode.open_loop()
        duration = args.duration
    else:
        trace = base.trace(args.seed, args.agents)
        label = f"preset {base.name.value} ({base.summary}), seed {args.seed}"
        mode = ReplayMode.closed_loop(args.agents or base.agents) if base.closed_loop else ReplayMode.open_loop()
        duration = args.duration if args.duration is not None else base.duration_s
    if not trace.requests:
        raise CliError(f"{label} has no requests to replay", USAGE_ERROR)
    nodes = args.nodes or base.nodes
    gateway = Gateway(args.gateway)
    if args.against_split is not None and args.against is None:
        raise CliError("--against-split needs --against", USAGE_ERROR)
    if args.against is not None and gateway is not Gateway.OURS:
        raise CliError("--against compares our router's run with the peer's: drop --gateway", USAGE_ERROR)
    if gateway is Gateway.SMG:
        if args.planner not in ("ours", "static") or args.warmup:
            raise CliError("--gateway smg runs at the static split with no warmup (no --planner, no --warmup)", USAGE_ERROR)
        if args.routing not in ("ttft", "cache-aware"):
            raise CliError("--gateway smg routes prefill with smg's cache_aware policy (no --routing)", USAGE_ERROR)
        args.planner, args.warmup, args.routing = "static", 0.0, "cache-aware"
    try:
        if args.split is not None:
            prefill, _ = parse_split(args.split, nodes if args.nodes else None)
            nodes = prefill + _
        else:
            prefill = base.prefill if nodes == base.nodes else max(1, nodes // 2)
        speed = args.speed_up or base.speed_up
        cluster = ClusterSpec(
            nodes=nodes, prefill=prefill, speed_up=speed, planner=args.planner, routing=args.routing,
            window_s=args.window or base.window_s, slices=args.slices or base.slices,
            cooldown_s=args.cooldown if args.cooldown is not None else base.cooldown_s, seed=args.seed,
            warmup_s=args.warmup if args.warmup is not None else base.warmup_s,
            plugins=tuple(str(Path(p).resolve()) if p.endswith(".py") else p for p in args.plugin),
            gateway=gateway, record_dir=args.record, exact_models=args.exact_models,
            noise=args.noise,
        )  # fmt: skip
        if args.exact_models and args.noise is not None:
            raise ValueError("--exact-models runs without noise; drop --noise")
        if args.noise is not None and not 0 <= args.noise <= 1:
            raise ValueError(f"--noise must be within 0..1, got {args.noise}")
        check_policies(cluster)
    except ValueError as exc:
        raise CliError(str(exc), USAGE_ERROR) from exc
    client = ClientSettings(speed_up=speed, max_in_flight=args.max_in_flight)
    if gateway is Gateway.SMG:  # SGLang's API: text prompts (one word per token), a model name, no branch calls
        client = dataclasses.replace(client, text_prompts=True, finish_branches=False, model=ServerIdentity().model)
    config = LocalRunConfig(cluster=cluster, mode=mode, client=client, duration_s=duration, workdir=args.work_dir)
    if args.against is not None:
        try:
            prefill_static = None if args.against_split is None else parse_split(args.against_split, nodes)[0]
            peer_sides(config, Peer(args.against), prefill=prefill_static)
        except ValueError as exc:
            raise CliError(f"--against-split: {exc}", USAGE_ERROR) from exc
    return config, trace, label


def _render(status: RunStatus, config: LocalRunConfig, total: int) -> Table:
    p = status.progress
    table = Table(title=f"evolving-infra local: {status.stage}", show_header=False, min_width=60)
    table.add_column(style="bold")
    table.add_column()
    limit = f" of {config.duration_s:g} s" if config.duration_s else ""
    table.add_row("elapsed", f"{status.wall_s:6.1f} s wall{limit}  ({p.now:7.1f} s emulated)")
    table.add_row("requests", f"{p.done} done, {p.in_flight} in flight, {p.failed} failed  ({p.issued} issued of {total})")
    rate = p.done / status.wall_s if status.wall_s > 0 else 0.0
    table.add_row("throughput", f"{rate:5.2f} req/s wall, {p.output_tokens / max(status.wall_s, 1e-9):7.0f} output tok/s wall")
    ttft = "-" if p.mean_ttft is None else f"{p.mean_ttft:.3f} s (emulated)"
    table.add_row("mean TTFT", ttft)
    table.add_row("KV hit rate", "-" if p.hit_rate is None else f"{p.hit_rate:.1%}")
    table.add_row("split", f"{status.split or config.cluster.split}   switches so far: {status.switches}")
    table.add_row("agents", f"{p.agents_started} started, {p.agents_finished} finished")
    if p.errors:
        table.add_row("last error", p.errors[-1][:120])
    return table


def _summary(report: dict[str, Any], out: Path) -> Table:
    t = Table(title=f"report: {out / 'report.md'}", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    run, lat, kv = report["run"], report["latency_s"], report["kv"]
    t.add_row("outcome", f"{report['outcome']}: {run['finished']} requests finished, {run['failed']} failed")
    t.add_row("TTFT mean / p95", f"{_fmt(lat['ttft']['mean'])} / {_fmt(lat['ttft']['p95'])} s (emulated)")
    t.add_row("E2E mean / p95", f"{_fmt(lat['e2e']['mean'])} / {_fmt(lat['e2e']['p95'])} s (emulated)")
    t.add_row("KV hit rate", f"{_fmt(kv['hit_rate'])} (ideal {_fmt(kv['ideal_hit_rate'])})")
    t.add_row("split", " -> ".join(f"{e['split']}@{e['at_s']:.0f}s" for e in report["split_timeline"]) or "-")
    sw = report["switch_after_drain_wall_s"]
    t.add_row("phase switches", f"{sw['count']} (after drain: mean {_fmt(sw['mean'], 4)} s, max {_fmt(sw['max'], 4)} s wall)")
    return t


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fidelity(report: dict[str, Any], record_dir: Path, console: Console) -> None:
    """Replay the recording in the simulator and print how close it comes to the live run."""
    from evolving_infra.local.fidelity import check_fidelity, write_fidelity

    fidelity = check_fidelity(report, record_dir)
    write_fidelity(fidelity, record_dir / "fidelity.json")
    rows = "; ".join(
        f"{f.name} live {f.live if f.live is None else round(f.live, 4)} replay "
        f"{f.replay if f.replay is None else round(f.replay, 4)}"
        + ("" if f.relative_error is None else f" ({100 * f.relative_error:.1f} %)")
        for f in fidelity.figures
    )
    verdict = "within" if fidelity.within_bound else "NOT within"
    console.print(f"recording in {record_dir}; simulator replay {verdict} {100 * fidelity.bound:g} %: {rows}")
    if fidelity.overheads is not None:
        o = fidelity.overheads
        bare = "; ".join(f"{f.name} {100 * f.relative_error:.1f} %" for f in fidelity.uncharged if f.relative_error is not None)
        console.print(f"live path charged (from the recording, in models.json): {1000 * o.request_s:.1f} ms per request, "
                      f"{1000 * o.iteration_s:.2f} ms per decode iteration, a start-up hold of {1000 * o.cold_start_s:.1f} ms; "
                      f"errors without them: {bare}")  # fmt: skip
    console.print(f"what-if replays: {fidelity.command} [--nodes N --split S --system S]")


def _run_one(config: LocalRunConfig, trace: Trace, console: Console, quiet: bool) -> LocalRunResult:
    """One run with live progress; Ctrl-C propagates as KeyboardInterrupt after the cluster is down."""
    live = None if quiet else Live(console=console, refresh_per_second=4, transient=False)
    shown = [0.0]

    def on_status(status: RunStatus) -> None:
        now = time.monotonic()
        if live is not None and (now - shown[0] >= 0.25 or status.stage != "replaying"):
            shown[0] = now
            live.update(_render(status, config, len(trace.requests)))

    if live is not None:
        live.start()
    try:
        return run_local(config, trace, on_status)
    finally:
        if live is not None:
            live.stop()


def _require_smg(flag: str) -> None:
    from evolving_infra.local.smg import SmgUnavailable, require_smg

    try:
        require_smg()
    except SmgUnavailable as exc:
        raise CliError(f"{flag}: {exc}", 1) from exc


def _run(args: argparse.Namespace) -> int:
    config, trace, label = _configure(args)
    if config.cluster.gateway is Gateway.SMG:
        _require_smg("--gateway smg")
    if args.against == Peer.SMG.value:
        _require_smg("--against smg")
    out = args.out or Path("runs") / f"local-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    console = Console(stderr=True)
    command = "evolving-infra local " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["local"] else "evolving-infra local"
    console.print(f"[bold]evolving-infra local[/]: {label}; {config.cluster.nodes} nodes ({config.cluster.split}), "
                  f"speed-up {config.cluster.speed_up:g}x; report in {out}")  # fmt: skip
    try:
        result = _run_one(config, trace, console, args.quiet)
    except LocalRunError as exc:
        raise CliError(str(exc), 1) from exc
    except KeyboardInterrupt:
        console.print("interrupted: the cluster was shut down (no report)")
        return 130
    report = write_report(result, trace, out, trace_label=label, command=command)
    Console().print(_summary(report, out))
    if args.record is not None and (args.record / "trace.jsonl").is_file() and report["run"]["finished"]:
        _fidelity(report, args.record, console)
    failed = report["run"]["failed"]
    if result.stopped_by == "interrupted":
        console.print(f"interrupted: partial report in {out}")
        return 130
    if failed:
        raise CliError(f"{failed} of {report['run']['issued']} requests failed (see {out / 'report.md'})", 1)
    if not result.replay.records:
        raise CliError("no request finished during the run", 1)
    if args.against is not None:
        return _against(args, config, trace, label, report, out, console)
    return 0


def _against(args: argparse.Namespace, config: LocalRunConfig, trace: Trace, label: str, report: dict[str, Any],
             out: Path, console: Console) -> int:  # fmt: skip
    """The `--against` runs after the main one (evolving_infra.local.against), each with its own report folder
    under OUT/against-PEER/, and the comparison added to the main report."""
    peer = Peer(args.against)
    prefill = None if args.against_split is None else parse_split(args.against_split, config.cluster.nodes)[0]
    sides = peer_sides(config, peer, prefill=prefill)
    reports: dict[SideKey, dict[str, Any]] = {SideKey.OURS: report}
    descriptions = {SideKey.OURS: f"our router, planner {config.cluster.planner}, routing {config.cluster.routing}, "
                                  f"initial split {config.cluster.split}, warmup {config.cluster.warmup_s:g} s"}  # fmt: skip
    problems: list[str] = []
    for side in sides:
        folder = out / f"against-{peer.value}" / side.key.name.lower()
        console.print(f"[bold]against {peer.value}[/]: {side.key.value}: {side.description}; report in {folder}")
        try:
            result = _run_one(side.config, trace, console, args.quiet)
        except LocalRunError as exc:
            problems.append(f"{side.key.value}: {exc}")
            console.print(f"{side.key.value} did not run to the end: {exc}")
            continue
        except KeyboardInterrupt:
            console.print(f"interrupted during the {side.key.value} run (its cluster was shut down)")
            return 130
        side_report = write_report(result, trace, folder, trace_label=label, command=f"{report['command']} ({side.key.value})")
        reports[side.key], descriptions[side.key] = side_report, side.description
        if side_report["run"]["failed"] or not side_report["run"]["finished"]:
            problems.append(f"{side.key.value}: {side_report['run']['failed']} requests failed, "
                            f"{side_report['run']['finished']} finished (see {folder / 'report.md'})")  # fmt: skip
    if SideKey.SMG not in reports:
        raise CliError(f"--against {peer.value}: no run of the peer to compare with ({'; '.join(problems)})", 1)
    report["against"] = compare(reports, descriptions)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    Console().print(_against_table(report["against"]))
    if problems:
        raise CliError(f"--against {peer.value}: " + "; ".join(problems), 1)
    return 0


def _against_table(comparison: dict[str, Any]) -> Table:
    ref = comparison["reference"]
    t = Table(title=f"ours vs the real peer (differences from {ref})")
    t.add_column("figure", style="bold")
    for side in comparison["sides"]:
        t.add_column(side, justify="right")
    for row in comparison["rows"]:
        cells = []
        for side in comparison["sides"]:
            diff = row["differences"].get(side)
            cells.append(format_value(row, side) + ("" if diff is None else f" ({diff:+.0%})"))
        t.add_row(row["figure"], *cells)
    return t
