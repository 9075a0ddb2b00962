"""`evolving-infra simulate --fleet DIR_OR_FILE ...`: simulate a fleet of partitions from its AgentServingCluster files.

    evolving-infra simulate --fleet examples/fleet-d2/fleet-mini.yaml --workload fleet --agents 192 \\
        --warmup 600 --duration 3000 --compare-static --out runs/fleet
    evolving-infra simulate --fleet manifests/examples/fleet-3072-gpus/ fleet-trace.jsonl --executor ray \\
        --ray-address auto --duration 3600

The partitions are the AgentServingClusters in the files (a directory: its YAML files); each runs as its own
simulated cluster (router, planner, KV directory) with its CR's nodes, profile, split, planner and routing. Tasks
are bound to partitions by user with the global router's binding (`fleet.binding`). The workload is a fleet trace
file (agent records with `user` and `requires`) or `--workload fleet` (generated; `--agents` is the fleet's
concurrency, and the generated schedule spans warmup + duration). Each partition follows the workload's schedule
(`--skip-late`: a freed slot skips tasks more than one slice of the schedule late and goes to the workload furthest
below its scheduled share of the running agents, so a local shift happens when the schedule says even where tasks
outlast the trace's layout). `--planner static` runs every partition at its
initial split; `--compare-static` runs the fleet twice (the CRs' planners, then static) and reports both.
Partitions run on `--executor processes` (default, `--workers` processes), `ray` (`--ray-address`, or a private
local instance on loopback) or `inline`; the result does not depend on the executor or the worker count.

`--partition-cache DIR` keeps each partition's result as it finishes and reuses stored ones (`fleet.cache`): a
long run that is stopped starts again where it stopped; `--stored-only` shows what DIR holds for the run (per
partition, adaptive / static where both are done, and how far the partitions still running are) without
simulating. `--partitions NAME,...` runs only those partitions (every run of each), e.g. the ones a reader wants
first, or a share of the fleet per machine over a shared DIR; users are still bound over the whole fleet, so each
is exactly the run (and the stored file) the whole fleet's command makes. While partitions run, a line per running
partition every minute says how far it is (`fleet.progress`).

Output: a table per partition (or `--json`); `--out DIR` writes `fleet.json` (every partition's metrics and time
series, the fleet summary), `fleet.md` (the tables of docs/evaluation.md) and `fleet.png` (like figure D.2).

Boundary: argument handling, progress and printing; the simulation is `fleet.sim`, running many partitions
`fleet.runs`, the figures `fleet.sim_report`.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.fleet import progress as fleet_progress
from evolving_infra.fleet.cache import CacheError, code_digest
from evolving_infra.fleet.cache import load as load_stored
from evolving_infra.fleet.cache import others as stored_elsewhere
from evolving_infra.fleet.executors import ExecutorKind, ExecutorUnavailable, open_executor
from evolving_infra.fleet.partitions import FleetFileError, FleetPartition, load_partitions
from evolving_infra.fleet.runs import progress_file, run_tasks, simulate_fleets
from evolving_infra.fleet.sim import (
    FleetOptions,
    FleetResult,
    FleetRunError,
    FleetWorkload,
    PartitionResult,
    PartitionTask,
    partition_tasks,
)
from evolving_infra.fleet.sim_report import (
    compare,
    fleet_summary,
    partition_rows,
    render_markdown,
    render_stored,
    shifting,
    stored_rows,
    write_figure,
)


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """The fleet flags of `simulate` (the other flags keep their meaning; `--agents` is the fleet's concurrency)."""
    g = p.add_argument_group("fleet (simulate --fleet)")
    g.add_argument("--fleet", metavar="DIR_OR_FILE", action="append",
                   help="simulate a fleet: AgentServingCluster YAML files or directories (repeatable)")
    g.add_argument("--executor", choices=[k.value for k in ExecutorKind], default=ExecutorKind.PROCESSES.value,
                   help="where partitions run: processes (default), ray, inline")
    g.add_argument("--workers", type=int, help="worker processes or local Ray CPUs (default: this machine's CPUs)")
    g.add_argument("--ray-address", metavar="ADDRESS",
                   help="run on this Ray cluster (ray.init address, e.g. auto or ray://head:10001); implies "
                   "--executor ray")
    g.add_argument("--compare-static", action="store_true",
                   help="run the fleet twice: the CRs' planners, then every partition static at its initial split")
    g.add_argument("--static-split", metavar="SPLIT",
                   help="the static run (--compare-static, or --planner static) holds SPLIT, e.g. 4P8D, on every "
                   "partition instead of its CR's initialSplit (adaptive runs still start from the CR's)")
    g.add_argument("--bucket", type=float, default=300.0, help="seconds per time-series bucket (default 300)")
    g.add_argument("--fleet-set", action="append", default=[], metavar="PATH=VALUE",
                   help="set a parameter of the generated fleet workload (repeatable; as `workload generate --set`, "
                   "e.g. cc.main_steps=12, task_estimate_s='{\"cc\": 360, \"codex\": 440}')")
    g.add_argument("--partition-cache", metavar="DIR",
                   help="keep each finished partition's result in DIR and reuse the ones stored there (same inputs "
                   "and code), so a stopped run resumes where it stopped")
    g.add_argument("--stored-only", action="store_true",
                   help="simulate nothing: list what --partition-cache holds for this run (per partition and run; "
                   "adaptive / static where both are stored) and what is still missing")
    g.add_argument("--partitions", metavar="NAME[,NAME...]",
                   help="run only these partitions (CR names, or namespace/name), every run of each; users are "
                   "still bound over the whole fleet, so each is the same run as in the whole fleet (and stored "
                   "under the same name); prints what is stored, as --stored-only")
    g.add_argument("--skip-late", type=_skip_late, metavar="S|off",
                   help="replay each partition on the workload's schedule: a freed slot skips tasks whose scheduled "
                   "start is more than S s past (default: one slice of the trace header's fleet.schedule) and "
                   "goes to the workload furthest below its share of the running agents (the header's fleet.mix); "
                   "off: every task in file order, however late")
    g.add_argument("--fleet-drain", type=float, metavar="S",
                   help="run at most S s past the scored window to finish its requests (default: the simulator's)")


def _skip_late(text: str) -> float | str:
    """`--skip-late`: seconds >= 0, or `off`."""
    if text.strip().lower() == "off":
        return "off"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 or 'off', got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 or 'off', got {text!r}")
    return value


SINGLE_CLUSTER_FLAGS = ("trace_agents", "routing", "decode_routing", "planner_set", "plugin", "eviction", "data_plane",
                        "pool", "models", "profile", "models_from", "nodes", "split", "noise", "exact_models")
"""`simulate` flags of one cluster that a fleet takes from its CRs (or does not vary): refused with --fleet."""


def run_fleet(args: argparse.Namespace) -> int:
    """The `simulate --fleet` command."""
    err = Console(stderr=True, quiet=args.quiet)
    given = [f"--{name.replace('_', '-')}" for name in SINGLE_CLUSTER_FLAGS if getattr(args, name, None) is not None]
    if args.system != "evolving":
        given.insert(0, "--system")
    if given:
        raise CliError(f"{', '.join(given)}: not a fleet setting; each partition's nodes, profile, split, planner "
                       "and routing come from its AgentServingCluster (edit the CR files; --planner and "
                       "--static-split set every partition's planner or static split)", USAGE_ERROR)
    if args.trace is not None and args.workload is not None:
        raise CliError("give either a fleet TRACE file or --workload fleet (not both)", USAGE_ERROR)
    if args.workload not in (None, "fleet"):
        raise CliError(f"--fleet needs a fleet trace or --workload fleet, not --workload {args.workload}", USAGE_ERROR)
    kind = ExecutorKind.RAY if args.ray_address else ExecutorKind(args.executor)
    try:
        partitions = load_partitions(args.fleet)
    except FleetFileError as exc:
        raise CliError(f"cannot use the fleet files:\n{exc}", USAGE_ERROR) from None
    try:
        opts = FleetOptions(duration_s=args.duration, warmup_s=args.warmup, planner=args.planner,
                            agents=args.agents, seed=args.seed, bucket_s=args.bucket, drain_s=args.fleet_drain,
                            follow_schedule=args.skip_late != "off",
                            skip_late_s=args.skip_late if isinstance(args.skip_late, float) else None)
        workload = _workload(args, opts)
    except FleetRunError as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    runs = [opts] + ([replace(opts, planner="static")] if args.compare_static else [])
    per_run = [_static_split(partitions, args.static_split) if args.static_split and o.planner == "static"
               else partitions for o in runs]
    if args.static_split and per_run[-1] is partitions:
        raise CliError("--static-split sets the static run's split: add --compare-static (or --planner static)",
                       USAGE_ERROR)
    cache = Path(args.partition_cache) if args.partition_cache else None
    if args.stored_only:
        if cache is None:
            raise CliError("--stored-only reads --partition-cache DIR: give the folder", USAGE_ERROR)
        return _print_stored(args, partitions, _tasks_by_run(per_run, workload, runs), cache)
    only = _selected(partitions, args.partitions) if args.partitions is not None else None
    if only is not None and args.out:
        raise CliError("--out writes the whole fleet's report: run without --partitions for it (partitions stored "
                       "in --partition-cache are read, not simulated again)", USAGE_ERROR)
    start = time.perf_counter()
    try:
        with open_executor(kind, args.workers, args.ray_address) as executor:
            what = f"{len(partitions)} partitions" if only is None else f"{len(only)} of {len(partitions)} partitions"
            err.print(f"simulating {what} x {len(runs)} run(s) on {kind.value}...")

            def done(r: PartitionResult) -> None:
                err.print(f"  {r.key} ({r.planner}): {r.requests:,} requests, {r.sim_end_s:,.0f} simulated s in "
                          f"{r.wall_s:,.0f} s wall")

            def cached(r: PartitionResult) -> None:
                err.print(f"  {r.key} ({r.planner}): stored in {cache} ({r.requests:,} requests, {r.sim_end_s:,.0f} "
                          f"simulated s; simulated in {r.wall_s:,.0f} s wall then)")

            def waiting(unfinished: list[PartitionTask]) -> None:
                for task in unfinished:
                    state = fleet_progress.read(Path(task.progress_path or ""))
                    if state is not None:
                        err.print(f"  {task.key} ({task.config.planner}): {fleet_progress.describe(state)}")

            with tempfile.TemporaryDirectory(prefix="fleet-progress-") as scratch:
                if only is not None:
                    by_run = _tasks_by_run(per_run, workload, runs)
                    tasks = [(name, t) for name, ts in by_run for t in ts if t.key in only]
                    ran = run_tasks([t for _, t in tasks], executor, on_done=done, cache=cache, on_cached=cached,
                                    progress_dir=cache or Path(scratch), on_wait=waiting)
                    fresh = {(name, t.key): r for (name, t), r in zip(tasks, ran, strict=True)}
                    err.print(f"{len(only)} partitions simulated in {time.perf_counter() - start:,.1f} s wall")
                    return _print_stored(args, partitions, by_run, cache, fresh)
                results = simulate_fleets(partitions, workload, runs, executor, on_done=done, cache=cache,
                                          on_cached=cached, progress_dir=cache or Path(scratch), on_wait=waiting,
                                          per_run=per_run)
    except ExecutorUnavailable as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    except (FleetRunError, CacheError) as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    adaptive = results[0]
    static = results[1] if len(results) > 1 else None
    report = fleet_report(adaptive, static)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "fleet.json").write_text(json.dumps(report, indent=1))
        (folder / "fleet.md").write_text(render_markdown(adaptive, static) + "\n")
        write_figure(adaptive, static, folder / "fleet.png", highlight=shifting(static or adaptive))
        err.print(f"wrote {folder / 'fleet.json'}, fleet.md, fleet.png")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_markdown(adaptive, static))
    err.print(f"{len(partitions)} partitions simulated in {time.perf_counter() - start:,.1f} s wall")
    return 0


def _selected(partitions: list[FleetPartition], names: str) -> set[str]:
    """The keys of the partitions `names` (comma-separated CR names or namespace/name keys) selects."""
    keys = {p.key for p in partitions}
    by_name: dict[str, list[str]] = {}
    for p in partitions:
        by_name.setdefault(p.key.rpartition("/")[2], []).append(p.key)
    chosen: set[str] = set()
    for name in (n.strip() for n in names.split(",")):
        if name in keys:
            chosen.add(name)
        elif len(by_name.get(name, [])) == 1:
            chosen.add(by_name[name][0])
        elif name in by_name:
            raise CliError(f"--partitions: {name!r} names several partitions ({', '.join(by_name[name])}): give "
                           "namespace/name", USAGE_ERROR)
        else:
            raise CliError(f"--partitions: no partition {name!r} in the fleet files (partitions: "
                           f"{', '.join(sorted(keys))})", USAGE_ERROR)
    return chosen


def _static_split(partitions: list[FleetPartition], split: str) -> list[FleetPartition]:
    """The partitions with initial split `split` (`--static-split`), refused where it does not fit one."""
    from evolving_infra.operator.spec import InitialSplit
    from evolving_infra.router.planner import parse_split

    try:
        prefill, decode = parse_split(split)
    except ValueError as exc:
        raise CliError(f"--static-split: {exc}", USAGE_ERROR) from None
    wrong = [f"{p.key} ({p.node_count} nodes)" for p in partitions if prefill + decode != p.node_count]
    if prefill < 1 or decode < 1 or wrong:
        raise CliError(f"--static-split {split!r}: needs >= 1 node per phase and as many nodes as each partition; "
                       f"does not fit {', '.join(wrong) or 'any partition'}", USAGE_ERROR)
    return [replace(p, spec=p.spec.model_copy(update={"initial_split": InitialSplit(prefill=prefill, decode=decode)}))
            for p in partitions]


def _tasks_by_run(per_run: list[list[FleetPartition]], workload: FleetWorkload,
                  runs: list[FleetOptions]) -> list[tuple[str, list[PartitionTask]]]:
    """Each run's name ("adaptive" / "static", or "run") and its partitions' (`per_run`) bound tasks."""
    names = ["adaptive", "static"] if len(runs) > 1 else ["run"]
    try:
        return [(name, partition_tasks(parts, workload, opts))
                for name, opts, parts in zip(names, runs, per_run, strict=True)]
    except FleetRunError as exc:
        raise CliError(str(exc), USAGE_ERROR) from None


def _print_stored(args: argparse.Namespace, partitions: list[FleetPartition],
                  tasks: list[tuple[str, list[PartitionTask]]], cache: Path | None,
                  fresh: dict[tuple[str, str], PartitionResult] | None = None) -> int:
    """`--stored-only`: the partitions of each run (`_tasks_by_run`) that `cache` holds, without simulating
    anything; with `fresh` (`--partitions`: results by run name and partition key, just simulated), those too."""
    fresh = fresh or {}
    try:
        stored = [(name, [fresh.get((name, t.key)) or (None if cache is None else load_stored(cache, t))
                          for t in ts]) for name, ts in tasks]
    except CacheError as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    running = {} if cache is None else {f"{t.key} ({name})": state for name, ts in tasks for t in ts
                                        if (state := fleet_progress.read(progress_file(cache, t))) is not None}
    missing = [t for (_, ts), (_, got) in zip(tasks, stored, strict=True)
               for t, r in zip(ts, got, strict=True) if r is None]
    other_code = [] if cache is None else sorted(
        {code for t in missing for code in stored_elsewhere(cache, t).values()})
    if args.json:
        print(json.dumps({"partitions": [p.key for p in partitions], "rows": stored_rows(stored),
                          "running": running, "code": code_digest(), "other_code": other_code}, indent=2))
    else:
        print(render_stored(stored, [p.key for p in partitions]))
        for what, state in running.items():
            print(f"running: {what}: {fleet_progress.describe(state)}")
        if other_code:
            print(f"note: {cache} also holds results of these partitions stored under other inputs or code (code "
                  f"{', '.join(other_code)}; this code is {code_digest()}): give the same flags, or run "
                  "--stored-only from the tree that made them")
    return 0


def _workload(args: argparse.Namespace, opts: FleetOptions) -> FleetWorkload:
    if args.trace is not None:
        import gzip

        from evolving_infra.traces.errors import TraceError
        from evolving_infra.traces.loader import load_trace

        try:
            load_trace(args.trace)  # refuses a broken trace with its line and rule before anything runs
            with open(args.trace, "rb") as raw:
                gz = raw.read(2) == b"\x1f\x8b"
            with (gzip.open(args.trace, "rt", encoding="utf-8") if gz else
                  open(args.trace, encoding="utf-8")) as handle:
                return FleetWorkload.from_records(json.loads(line) for line in handle if line.strip())
        except TraceError as exc:
            raise FleetRunError(f"cannot load trace: {exc}") from None
        except OSError as exc:
            raise FleetRunError(f"cannot read {args.trace!r}: {exc.strerror or exc}") from None
    if args.workload != "fleet":
        raise FleetRunError("--fleet needs a fleet TRACE file or --workload fleet")
    if args.agents is None:
        raise FleetRunError("--workload fleet needs --agents (the fleet's concurrent agents)")
    from evolving_infra.workloads.fleet import FleetParams

    from evolving_infra.workloads import OverrideError, with_overrides

    params = FleetParams()
    if args.duration is not None:
        warmup = args.warmup if args.warmup is not None else 0.0
        params = replace(params, span_s=warmup + args.duration)
    overrides: dict[str, object] = {}
    for item in args.fleet_set:
        path, sep, value = item.partition("=")
        if not sep or not path.strip():
            raise FleetRunError(f"--fleet-set {item!r}: expected PATH=VALUE, e.g. cc.main_steps=12")
        overrides[path.strip()] = value
    try:
        params = with_overrides(params, overrides)
    except (OverrideError, ValueError) as exc:
        raise FleetRunError(f"--fleet-set: {exc}") from None
    return FleetWorkload.generated(params, args.agents, args.seed)


def fleet_report(adaptive: FleetResult, static: FleetResult | None) -> dict[str, Any]:
    """Everything `--json` prints and `fleet.json` holds."""
    def one(result: FleetResult) -> dict[str, Any]:
        return {"options": asdict(result.options), "summary": fleet_summary(result),
                "rows": partition_rows(result),
                "partitions": [{k: v for k, v in asdict(p).items() if k != "records"} for p in result.partitions]}

    out: dict[str, Any] = {"adaptive" if static else "run": one(adaptive)}
    if static is not None:
        out["static"] = one(static)
        out["comparison"] = compare(adaptive, static)
    return out

