"""The evaluation runner: a matrix of simulator runs in parallel processes, cached as JSON, rendered as markdown.

    python scripts/evaluate.py run --matrix calibration --warmup 600 --duration 1200 --jobs 2 --cache runs/eval
    python scripts/evaluate.py render --cache runs/eval > tables.md

    python scripts/evaluate.py run --trace mine.jsonl --profile glm-5.2-4xgb300-tp4 --split 4P5D --agents 32

A run is a `RunSpec` (workload, concurrency, system preset, initial split, warmup, scored duration, seed and
optional generator overrides, or a trace file instead of the generator); its result is one JSON file in the cache folder named by `RunSpec.key()`, so an
interrupted matrix resumes where it stopped and `render` reads whatever has finished. A generator run's key carries a
hash of the generators' source (`generator_fingerprint`), so runs cached before a generator changed are not reused. The paper's figures
(tables C.1, C.3 and D.1) sit next to the measured ones in the rendered tables (`evaluation.tables`).

Boundary: `run_spec` is the only function that simulates; the table renderers (`evaluation.tables`,
`evaluation.protocol`) are pure functions of the cached records.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from evolving_infra.evaluation.protocol import PROTOCOL_MATRICES, protocol_matrix, render_protocol
from evolving_infra.evaluation.tables import (
    BEST_SPLIT, PAPER_CONCURRENCY, SYSTEMS, render_calibration, render_evaluation,
)  # fmt: skip

PROFILE = {"putnam": "glm-5.2-4xgb300-tp4", "cc": "glm-5.2-4xgb300-tp4", "osworld": "kimi-k2.6-4xgb300-tp4",
           "shift": "kimi-k2.6-4xgb300-tp4"}
"""Hardware profile per workload (paper 6.1: GLM-5.2 for Putnam and CC, Kimi K2.6 for OSWorld and the shift)."""

MATRICES = ("calibration", "cc90", "putnam224", "osworld128", "paper", "cc-high", "all", *PROTOCOL_MATRICES)
SERIES_BUCKET_S = 60.0
"""Requests finished per bucket of this many seconds are kept in each record (`series`: the per-window oracle,
throughput over time)."""

MIN_LIFETIME_S = {"putnam": 200.0, "osworld": 300.0, "cc": 3000.0}
"""A lower bound on how long one agent of each workload runs; sizes the generated trace so that the closed loop
never runs out of agents before the window ends (a run that does is flagged in the tables)."""


def trace_agents(workload: str, agents: int, span_s: float) -> int:
    """Agents to generate for a closed loop of `agents` over `span_s` simulated seconds (plus the drain)."""
    return agents * (2 + math.ceil(span_s / MIN_LIFETIME_S.get(workload, 200.0)))


def shift_periods(warmup_s: float, period_s: float) -> tuple[Any, ...]:
    """Section 6.3's three periods: Putnam through the warmup and one period, then mixed, then OSWorld."""
    from evolving_infra.workloads.compose import Period

    return (Period("putnam", warmup_s + period_s, {"putnam": 288}),
            Period("mixed", period_s, {"putnam": 144, "osworld": 72}),
            Period("osworld", period_s, {"osworld": 144}))  # fmt: skip


def open_loop_trace(spec: RunSpec) -> tuple[list[dict[str, Any]], int]:
    """The generated records of an open-loop run and its agent count (enough arrivals for the whole span)."""
    from evolving_infra.workloads import generate
    from evolving_infra.workloads.compose import ShiftParams
    from evolving_infra.workloads.params import with_overrides

    overrides = dict(spec.overrides)
    if spec.period_s is not None:
        params = with_overrides(ShiftParams(), {**overrides, "periods": shift_periods(spec.warmup_s, spec.period_s)})
        count = params.closed_loop_agents()
        from evolving_infra.workloads.generate import generate_with

        return generate_with("shift", count, spec.seed, params), count
    assert spec.arrival_rate is not None
    count = math.ceil(spec.arrival_rate * (spec.warmup_s + spec.duration_s) / 60.0 * 1.2) + 10
    return generate(spec.workload, count, spec.seed, **{**overrides, "arrival_rate_per_min": spec.arrival_rate}), count


def completion_series(records: Sequence[Any], end_s: float, bucket_s: float = SERIES_BUCKET_S) -> dict[str, Any]:
    """Requests finished per `bucket_s` bucket over [0, end_s) and the mean TTFT of those issued in each."""
    n = max(1, math.ceil(end_s / bucket_s))
    finished = [0] * n
    ttft_sum = [0.0] * n
    issued = [0] * n
    for r in records:
        i = int(r.finish // bucket_s)
        if 0 <= i < n:
            finished[i] += 1
        j = int(r.issued // bucket_s)
        if 0 <= j < n:
            issued[j] += 1
            ttft_sum[j] += r.first_token - r.issued
    return {"bucket_s": bucket_s, "finished": finished,
            "ttft_mean": [s / c if c else None for s, c in zip(ttft_sum, issued, strict=True)]}  # fmt: skip


def early_figures(records: Sequence[Any], start_s: float, span_s: float) -> dict[str, Any]:
    """TTFT of the requests issued in the first `span_s` seconds of the scored window (the end of the warmup)."""
    ttft = sorted(r.first_token - r.issued for r in records if start_s <= r.issued < start_s + span_s)
    if not ttft:
        return {"n": 0}
    return {"n": len(ttft), "ttft_mean": sum(ttft) / len(ttft), "ttft_p95": ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))],
            "ttft_max": ttft[-1]}  # fmt: skip


WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"


@functools.cache
def generator_fingerprint(folder: Path = WORKLOADS_DIR) -> str:
    """8 hex digits of a hash over the workload generators' source (every `*.py` of `folder`, by name): a run
    from a generator whose code or defaults changed gets another cache key, so a cached run never passes for a
    run of today's generator."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:8]


@dataclass(frozen=True)
class RunSpec:
    """One simulator run of the matrix."""

    workload: str
    agents: int
    system: str
    split: str
    warmup_s: float
    duration_s: float
    seed: int = 0
    overrides: tuple[tuple[str, Any], ...] = field(default=())
    """Generator parameter overrides (dotted path, value), e.g. `(("output_tokens.mean", 900),)`."""
    trace: str | None = None
    """A trace file (imported, recorded, scaled or merged) replayed instead of the generator; `workload` is then
    its label in the tables."""
    trace_sha256: str = ""
    profile_name: str | None = None
    """The hardware profile (required with `trace`; the generator's workloads have their own)."""
    sim: tuple[tuple[str, Any], ...] = field(default=())
    """Simulator settings over the system's preset (`build_config` overrides), e.g. `(("shared_pool", False),)`."""
    label: str = ""
    """The run's name in the tables (default: the system), e.g. an ablation's."""
    arrival_rate: float | None = None
    """Open loop: agents arrive at this rate per minute (Poisson) and `agents` caps the active ones."""
    period_s: float | None = None
    """The `shift` workload: each period after the warmup lasts this long (replayed open loop)."""
    warmup_exit: str = ""
    """How the nodes leave the collocated warmup (`WarmupExit` value; "": the control core's default)."""

    @property
    def profile(self) -> str:
        return self.profile_name or PROFILE[self.workload]

    def key(self) -> str:
        """A file-name-safe name that differs whenever any field differs."""
        base = (f"{self.workload}-{self.agents}-{self.system}-{self.split}-w{self.warmup_s:g}-d{self.duration_s:g}"
                f"-s{self.seed}")
        if self.overrides:
            tail = "_".join(f"{k}={v}" for k, v in self.overrides)
            base += "-" + "".join(c if c.isalnum() or c in "._=-" else "_" for c in tail)
        if self.trace is not None:
            base += f"-t{self.trace_sha256[:12]}-" + "".join(c if c.isalnum() or c in "._-" else "_" for c in self.profile)
        else:
            base += f"-g{generator_fingerprint()}"
        if self.sim:
            tail = "_".join(f"{k}={v}" for k, v in self.sim)
            base += "-x" + "".join(c if c.isalnum() or c in "._=-" else "_" for c in tail)
        if self.arrival_rate is not None:
            base += f"-r{self.arrival_rate:g}"
        if self.period_s is not None:
            base += f"-p{self.period_s:g}"
        if self.warmup_exit:
            base += f"-e{self.warmup_exit}"
        return base

    def command(self) -> str:
        """The equivalent `evolving-infra simulate` command line (generator overrides are not expressible); for
        open-loop runs, which `simulate` cannot generate, the runner's command that runs this spec alone."""
        if self.trace is not None:
            return (f"evolving-infra simulate {self.trace} --agents {self.agents} --system {self.system} "
                    f"--split {self.split} --profile {self.profile} --warmup {self.warmup_s:g} "
                    f"--duration {self.duration_s:g} --seed {self.seed} --json")
        if self.open_loop:
            return self._runner_command() + self._notes(warmup_exit=False)
        span = self.warmup_s + self.duration_s
        cmd = (f"evolving-infra simulate --workload {self.workload} --agents {self.agents} "
               f"--trace-agents {trace_agents(self.workload, self.agents, span)} --system {self.system} "
               f"--split {self.split} --profile {self.profile} --warmup {self.warmup_s:g} "
               f"--duration {self.duration_s:g} --seed {self.seed} --json")
        return cmd + self._notes(warmup_exit=True)

    def _runner_command(self) -> str:
        """This open-loop spec alone through the runner (`simulate` cannot generate open-loop workloads; the
        runner generates their arrivals), with what it is in a trailing comment."""
        name = self.label or self.system
        if self.warmup_exit:  # the runner names a run with a warmup exit after its filters
            name = name.removesuffix(f" (exit {self.warmup_exit})")
        cmd = (f"python scripts/evaluate.py run --matrix {'shift' if self.period_s is not None else 'open-loop'} "
               f"--systems {shlex.quote(name)} --splits {self.split} --warmup {self.warmup_s:g} "
               f"--duration {self.duration_s:g} --seed {self.seed}")
        if self.arrival_rate is not None:
            cmd += f" --rates {self.arrival_rate:g}"
        if self.warmup_exit:
            cmd += f" --warmup-exit {self.warmup_exit}"
        return cmd + f"  # open loop: {self.spec_trace_note()}"

    def _notes(self, warmup_exit: bool) -> str:
        """What the command line cannot say, as trailing comments."""
        notes = ""
        if warmup_exit and self.warmup_exit:
            notes += f"  # warmup exit {self.warmup_exit} (control settings, set by the runner)"
        if self.sim:
            notes += f"  # simulator settings over the preset (build_config overrides): {dict(self.sim)}"
        return notes + (f"  # generator overrides {dict(self.overrides)}" if self.overrides else "")

    def spec_trace_note(self) -> str:
        if self.period_s is not None:
            return f"shift periods of {self.period_s:g} s after the warmup, arrivals from the periods"
        return f"{self.arrival_rate:g} agents/min, at most {self.agents} active"

    @property
    def open_loop(self) -> bool:
        return self.arrival_rate is not None or self.period_s is not None


def matrix(name: str, warmup_s: float, duration_s: float, seed: int = 0) -> list[RunSpec]:
    """The named run matrix: `calibration` (best-static at table D.1's splits and concurrencies), `cc90`,
    `paper` (the three workloads at the paper's lowest concurrency, all systems), `cc-high` (CC 108 and 126,
    all systems) or `all`."""
    def runs(workload: str, agents: int, systems: Iterable[str]) -> list[RunSpec]:
        return [RunSpec(workload, agents, s, BEST_SPLIT[workload], warmup_s, duration_s, seed) for s in systems]

    if name == "calibration":
        return [r for w, n in PAPER_CONCURRENCY.items() for r in runs(w, n, ["best-static"])]
    if name == "cc90":
        return runs("cc", 90, SYSTEMS)
    if name in ("putnam224", "osworld128"):
        workload = name.rstrip("0123456789")
        return runs(workload, PAPER_CONCURRENCY[workload], SYSTEMS)
    if name == "paper":
        return [r for w in ("cc", "putnam", "osworld") for r in runs(w, PAPER_CONCURRENCY[w], SYSTEMS)]
    if name == "cc-high":
        return runs("cc", 108, SYSTEMS) + runs("cc", 126, SYSTEMS)
    if name == "all":
        return matrix("paper", warmup_s, duration_s, seed) + matrix("cc-high", warmup_s, duration_s, seed)
    if name in PROTOCOL_MATRICES:
        return protocol_matrix(name, RunSpec, BEST_SPLIT, warmup_s, duration_s, [seed])
    raise ValueError(f"unknown matrix {name!r}; known: {', '.join(MATRICES)}")


def trace_runs(paths: Sequence[str], *, profile: str, split: str, agents: int, warmup_s: float, duration_s: float,
               seed: int = 0, systems: Sequence[str] = SYSTEMS) -> list[RunSpec]:
    """Every system on each trace file (label: the file name without its extensions), keyed by its content."""
    import hashlib

    specs = []
    for path in paths:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        label = Path(path).name.split(".")[0]
        specs += [RunSpec(label, agents, s, split, warmup_s, duration_s, seed, trace=str(path), trace_sha256=digest,
                          profile_name=profile) for s in systems]
    return specs


def run_spec(spec: RunSpec) -> dict[str, Any]:
    """Simulate one run; returns the record cached for it (spec, metrics, wall time, events)."""
    from evolving_infra.sim.run import simulate
    from evolving_infra.sim.systems import build_config
    from evolving_infra.traces.loader import trace_from_records
    from evolving_infra.workloads import generate

    from evolving_infra.traces.loader import load_trace

    span = spec.warmup_s + spec.duration_s * (3 if spec.period_s is not None else 1)
    cfg = build_config(spec.system, profile=spec.profile, split=spec.split,
                       agents=None if spec.open_loop else spec.agents, seed=spec.seed, warmup_s=spec.warmup_s,
                       duration_s=span - spec.warmup_s,
                       max_active=spec.agents if spec.arrival_rate is not None else None, **dict(spec.sim))  # fmt: skip
    if spec.trace is not None:
        trace = load_trace(spec.trace)
        count = len(trace.agents)
    elif spec.open_loop:
        records, count = open_loop_trace(spec)
        trace = trace_from_records(records, source=f"workload:{spec.workload}")
    else:
        count = trace_agents(spec.workload, spec.agents, spec.warmup_s + spec.duration_s)
        trace = trace_from_records(generate(spec.workload, count, spec.seed, **dict(spec.overrides)),
                                   source=f"workload:{spec.workload}")
    prepare = None
    if spec.warmup_exit:
        from evolving_infra.router.core.control import WarmupExit

        exit_mode = WarmupExit(spec.warmup_exit)

        def prepare(state: Any) -> None:
            state.control.settings = replace(state.control.settings, warmup_exit=exit_mode)

    start = time.perf_counter()
    result = simulate(cfg, trace, prepare=prepare)
    wall = time.perf_counter() - start
    return {"spec": asdict(spec), "key": spec.key(), "command": spec.command(), "metrics": result.metrics.to_dict(),
            "wall_s": wall, "events": result.events, "sim_end_s": result.end_time, "trace_agents": count,
            "series": completion_series(result.records, result.end_time),
            "early": {f"{s:g}s": early_figures(result.records, spec.warmup_s, s) for s in (60.0, 300.0)}}


def run_matrix(specs: Sequence[RunSpec], cache: Path, jobs: int, force: bool = False,
               log: Any = sys.stderr, executor: str = "processes",
               ray_address: str | None = None) -> list[dict[str, Any]]:
    """Run every spec not yet cached in `cache` on `jobs` processes; returns all records (cached and new)."""
    cache.mkdir(parents=True, exist_ok=True)
    todo = [s for s in specs if force or not (cache / f"{s.key()}.json").exists()]
    print(f"{len(specs) - len(todo)} cached, {len(todo)} to run on {jobs} processes", file=log)
    from evolving_infra.fleet.executors import open_executor  # processes (default) or ray: fleet.executors

    with open_executor(executor, max(1, jobs), ray_address) as pool:
        futures = {pool.submit(run_spec, s): s for s in todo}
        for fut in as_completed(futures):
            spec = futures[fut]
            try:
                record = fut.result()
            except Exception as exc:  # a failed run is reported and skipped; the others go on
                remote = exc.__cause__  # concurrent.futures attaches the worker's traceback here
                (cache / f"{spec.key()}.error.txt").write_text(f"{spec.command()}\n{remote or ''}\n{exc!r}\n")
                print(f"FAILED {spec.key()}: {type(exc).__name__}: {exc} (traceback: {spec.key()}.error.txt)",
                      file=log)
                continue
            (cache / f"{spec.key()}.json").write_text(json.dumps(record, indent=1))
            print(f"done {spec.key()} in {record['wall_s']:.0f} s wall", file=log)
    return load_records(cache)


def load_records(cache: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]


# ---- command line ------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evaluate", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a matrix (cached runs are skipped)")
    run.add_argument("--matrix", default="cc90", choices=MATRICES, help="default cc90")
    run.add_argument("--warmup", type=float, default=1800.0, help="warmup seconds (paper: 1800)")
    run.add_argument("--duration", type=float, default=3600.0, help="scored seconds (paper: 3600)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--seeds", help="comma-separated seeds (e.g. 0,1,2: the paper's protocol); overrides --seed")
    run.add_argument("--workloads", help="comma-separated subset of the matrix's workloads (e.g. putnam,osworld)")
    run.add_argument("--splits", help="comma-separated subset of the matrix's initial splits")
    run.add_argument("--rates", help="comma-separated subset of the open-loop arrival rates (agents per minute)")
    run.add_argument("--warmup-exit", choices=["at-once", "staged"],
                     help="how the nodes leave the collocated warmup (default: the control core's, staged); "
                     "at-once is the behaviour before #13 step 6, for before/after runs")
    run.add_argument("--systems", help="comma-separated subset of the matrix's systems")
    run.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    run.add_argument("--executor", choices=["processes", "ray"], default="processes",
                     help="where runs execute: worker processes (default) or Ray tasks (evolving_infra.fleet.executors)")
    run.add_argument("--ray-address", help="Ray cluster of --executor ray (default: a private local instance)")
    run.add_argument("--cache", default="runs/eval", help="folder of cached run records (default runs/eval)")
    run.add_argument("--force", action="store_true", help="rerun cached runs")
    run.add_argument("--dry-run", action="store_true", help="list the runs (key and command) and how many are cached")
    run.add_argument("--trace", action="append", metavar="FILE",
                     help="replay this trace file (repeatable) instead of the matrix; needs --profile, --split, --agents")
    run.add_argument("--profile", help="hardware profile of --trace runs")
    run.add_argument("--split", help="initial split of --trace runs, e.g. 4P5D")
    run.add_argument("--agents", type=int, help="closed-loop concurrency of --trace runs")
    render = sub.add_parser("render", help="print the markdown tables of the cached runs")
    render.add_argument("--cache", default="runs/eval")
    render.add_argument("--plots", metavar="DIR", help="also write PNG figures per group of runs into DIR")
    render.add_argument("--table", choices=["calibration", "evaluation", "both", "protocol"], default="both",
                        help="protocol: seeds aggregated (mean ± 95 %% interval), searched best static, oracle, sweep")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cache = Path(args.cache)
    if args.command == "run":
        if args.warmup < 0 or args.duration <= 0 or args.jobs < 1:
            print("error: --warmup must be >= 0, --duration > 0 and --jobs >= 1", file=sys.stderr)
            return 2
        try:
            if args.trace:
                if not (args.profile and args.split and args.agents and args.agents > 0):
                    raise ValueError("--trace needs --profile, --split and --agents (>= 1)")
                specs = trace_runs(args.trace, profile=args.profile, split=args.split, agents=args.agents,
                                   warmup_s=args.warmup, duration_s=args.duration, seed=args.seed)
            else:
                seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
                specs = [s for seed in seeds for s in matrix(args.matrix, args.warmup, args.duration, seed)]
        except OSError as exc:
            print(f"error: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.systems:
            wanted = set(args.systems.split(","))
            specs = [s for s in specs if s.system in wanted or (s.label and s.label in wanted)]
        if args.workloads:
            specs = [s for s in specs if s.workload in set(args.workloads.split(","))]
        if args.splits:
            specs = [s for s in specs if s.split in set(args.splits.split(","))]
        if args.rates:
            try:
                rates = {float(x) for x in args.rates.split(",")}
            except ValueError:
                print(f"error: --rates takes comma-separated numbers, got {args.rates!r}", file=sys.stderr)
                return 2
            specs = [s for s in specs if s.arrival_rate in rates]
        if args.warmup_exit:
            specs = [replace(s, warmup_exit=args.warmup_exit, label=f"{s.label or s.system} (exit {args.warmup_exit})")
                     for s in specs]  # fmt: skip
        if args.dry_run:
            for s in specs:
                cached = (cache / f"{s.key()}.json").exists()
                print(f"{'cached ' if cached else 'to run '}{s.key()}\t{s.command()}")
            print(f"{len(specs)} runs, {sum((cache / f'{s.key()}.json').exists() for s in specs)} cached", file=sys.stderr)
            return 0
        run_matrix(specs, cache, args.jobs, args.force, executor=args.executor, ray_address=args.ray_address)
        return 0
    records = load_records(cache)
    if args.plots:
        from evolving_infra.evaluation.plots import plot_group, plot_sweep
        from evolving_infra.evaluation.protocol import seed_groups, sweep_groups

        for key, variants in seed_groups(records).items():
            workload, agents, rate, period, warmup, duration = key
            stem = f"{workload}-{agents}" + (f"-r{rate:g}" if rate is not None else "") + f"-w{warmup:g}-d{duration:g}"
            for path in plot_group(variants, Path(args.plots), stem):
                print(f"wrote {path}", file=sys.stderr)
        for (workload, agents, warmup, duration), rs in sorted(sweep_groups(records).items()):
            for path in plot_sweep(rs, Path(args.plots), f"{workload}-{agents}-w{warmup:g}-d{duration:g}"):
                print(f"wrote {path}", file=sys.stderr)
    if args.table == "protocol":
        print(render_protocol(records, BEST_SPLIT))
        return 0
    if args.table in ("calibration", "both"):
        print(render_calibration(records))
        print()
    if args.table in ("evaluation", "both"):
        print(render_evaluation(records))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`evolving-infra evaluate ...`: comparisons with the real peers (the matrix runs via scripts/evaluate.py)."""
    from evolving_infra.cli import peers

    parser = sub.add_parser("evaluate", help="compare our simulator with the real peers (Dynamo's replay)")
    actions = parser.add_subparsers(dest="evaluate_command", metavar="ACTION", required=True)
    peers.add_parser(actions)
