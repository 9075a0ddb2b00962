"""`evolving-infra bench directory`: KV-directory ingest rate, lookup latency and memory per page.

Workload (seeded, generated before any timing): agent branches grow contexts from shared system prompts,
fork from each other at random points, and append 20-200 pages per request. Each request's new pages are
stored on the branch's prefill node (GPU and host, write-through) and on its decode node (GPU and host);
now and then a branch moves to another prefill node, which then stores its whole path (a fetch). GPU
memory of each node is bounded, so old chains leave GPU memory through `KvRemoved` events. Generation
stops when the number of distinct pages is reached.

Figures (wall clock and thread CPU time both, since CPU time leaves out preemption by other processes):
- ingest rate = pages named in all events (stored and removed) / seconds to apply them;
- lookup latency = `KvDirectory.lookup` of 128K-token prompts (2,000 pages of 64 tokens by default),
  each a cached branch path cut to a random length of at least 90 % of the prompt and completed with new
  pages; the generated events are freed and collected before the lookups are timed;
- bytes per page = sizes (`sys.getsizeof`) of every object reachable from the directory
  (`gc.get_referents` walk, each object counted once, types and modules excluded) / distinct pages, also split
  by the objects' type (`bytes_per_page_by_type`: the page index is the largest `dict`, the page hashes are
  `int`, run page lists `list`, per-page last-use times `array`, runs `_Run`, `_holding` `set`);
- runs: the runs of pages the directory keeps (`--page-exact` measures the page-exact oracle instead, where
  every page is its own entry).

`--sim SECONDS` measures the directory under the simulator's events instead: it runs `bench sim`'s simulation
(CC, 90 agents, 9 nodes, our system, profile models, SECONDS simulated) once, recording every call the simulator
makes on its `KvDirectory` (stores, removals, clears, lookups, nodes added), and replays them into a fresh
run-based and a fresh page-exact directory, alternated `--sim-reps` times: the best process CPU time of stores,
removals and lookups, and the runs and bytes per page at the end (docs/benchmarks.md, "The KV directory under the
simulator's events").

Boundary: measurement code only; the directory itself stays pure.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
import types
from collections import deque
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.core.kv_events import KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import DEFAULT_PAGE_TOKENS, PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.directory_pages import PageKvDirectory

SYSTEM_PROMPTS = 32
GPU_PAGES_PER_NODE = 20_000
MOVE_PROBABILITY = 0.05


@dataclass(frozen=True)
class DirectoryBenchResult:
    nodes: int
    distinct_pages: int
    events: int
    event_pages: int
    ingest_seconds: float
    ingest_pages_per_second: float
    ingest_events_per_second: float
    lookups: int
    prompt_pages: int
    prompt_tokens: int
    lookup_p50_ms: float
    lookup_p99_ms: float
    lookup_mean_ms: float
    lookup_cpu_p50_ms: float
    lookup_cpu_p99_ms: float
    ingest_cpu_pages_per_second: float
    mean_cached_pages: float
    bytes_per_page: float
    bytes_method: str
    seed: int
    python: str
    implementation: str = "runs"
    runs: int = 0
    bytes_per_page_by_type: dict[str, float] = field(default_factory=dict)


def generate_events(nodes: int, pages: int, seed: int) -> tuple[list[KvEvent], list[list[PageHash]]]:
    """KV events of a seeded agent workload reaching `pages` distinct pages, and the branch paths."""
    rng = random.Random(seed)
    ids = [NodeId(f"node-{i:03d}") for i in range(nodes)]
    prefill, decode = ids[: max(1, nodes // 2)], ids[max(1, nodes // 2) :] or ids
    events: list[KvEvent] = []
    gpu_chains: dict[NodeId, deque[tuple[PageHash, ...]]] = {n: deque() for n in ids}
    gpu_used = dict.fromkeys(ids, 0)
    clock = 0.0
    distinct = 0

    def fresh(k: int) -> list[PageHash]:
        return [PageHash(rng.getrandbits(64)) for _ in range(k)]

    def store(node: NodeId, parent: PageHash | None, chain: tuple[PageHash, ...]) -> None:
        for tier in (Tier.GPU, Tier.HOST):
            events.append(KvStored(node, tier, parent, chain, clock))
        gpu_chains[node].append(chain)
        gpu_used[node] += len(chain)
        while gpu_used[node] > GPU_PAGES_PER_NODE:
            old = gpu_chains[node].popleft()
            gpu_used[node] -= len(old)
            events.append(KvRemoved(node, Tier.GPU, old, clock))

    roots = [fresh(rng.randint(20, 200)) for _ in range(SYSTEM_PROMPTS)]
    used_roots: set[int] = set()
    paths: list[list[PageHash]] = []
    while distinct < pages:
        if paths and rng.random() < 0.3:
            parent_path = rng.choice(paths)
            path = parent_path[: rng.randint(1, len(parent_path))]  # fork
        else:
            r = rng.randrange(len(roots))  # new root branch or sub-agent
            path = list(roots[r])
            if r not in used_roots:
                used_roots.add(r)
                distinct += len(path)
        p_node, d_node = rng.choice(prefill), rng.choice(decode)
        for node in (p_node, d_node):
            store(node, None, tuple(path))
        for _ in range(rng.randint(5, 40)):
            clock += 1.0
            if rng.random() < MOVE_PROBABILITY:
                p_node = rng.choice(prefill)
                store(p_node, None, tuple(path))
            new = fresh(min(rng.randint(20, 200), max(1, pages - distinct)))
            distinct += len(new)
            for node in (p_node, d_node):
                store(node, path[-1], tuple(new))
            path.extend(new)
            if distinct >= pages:
                break
        paths.append(path)
    return events, paths


def prompts(paths: list[list[PageHash]], count: int, prompt_pages: int, seed: int) -> list[list[PageHash]]:
    rng = random.Random(seed + 1)
    long = [p for p in paths if len(p) >= prompt_pages] or sorted(paths, key=len)[-1:]
    out = []
    for _ in range(count):
        path = rng.choice(long)
        cut = min(len(path), rng.randint(prompt_pages * 9 // 10, prompt_pages))
        out.append(path[:cut] + [PageHash(rng.getrandbits(64)) for _ in range(prompt_pages - cut)])
    return out


def deep_size(root: object, by_type: Counter[str] | None = None) -> int:
    """Bytes of every object reachable from `root`, each counted once (types and modules excluded); with
    `by_type`, also added up there by the objects' type name."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        size = sys.getsizeof(obj)
        total += size
        if by_type is not None:
            by_type[type(obj).__name__] += size
        stack.extend(gc.get_referents(obj))
    return total


def run_benchmark(
    nodes: int, pages: int, seed: int, lookups: int, prompt_pages: int, page_exact: bool = False
) -> DirectoryBenchResult:
    events, paths = generate_events(nodes, pages, seed)
    event_pages = sum(len(e.pages) for e in events if isinstance(e, (KvStored, KvRemoved)))
    directory: KvDirectory | PageKvDirectory = PageKvDirectory() if page_exact else KvDirectory()
    apply = directory.apply
    start, cpu_start = time.perf_counter(), time.thread_time()
    for event in events:
        apply(event)
    ingest = time.perf_counter() - start
    ingest_cpu = time.thread_time() - cpu_start
    queries = prompts(paths, lookups, prompt_pages, seed)
    del events, paths
    gc.collect()  # the generated events are garbage now; do not time their collection
    latencies, cpu = [], []
    cached = 0
    for prompt in queries:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        match = directory.lookup(prompt)
        cpu.append((time.thread_time_ns() - c0) / 1e6)
        latencies.append((time.perf_counter_ns() - t0) / 1e6)
        cached += max(match.either.values(), default=0)
    by_type: Counter[str] = Counter()
    size = deep_size(directory, by_type)
    per_page = max(1, directory.page_count)
    latencies.sort()
    cpu.sort()
    return DirectoryBenchResult(
        nodes=nodes,
        distinct_pages=directory.page_count,
        events=directory.stats.events,
        event_pages=event_pages,
        ingest_seconds=round(ingest, 3),
        ingest_pages_per_second=round(event_pages / ingest),
        ingest_events_per_second=round(directory.stats.events / ingest),
        lookups=lookups,
        prompt_pages=prompt_pages,
        prompt_tokens=prompt_pages * DEFAULT_PAGE_TOKENS,
        lookup_p50_ms=round(statistics.median(latencies), 3),
        lookup_p99_ms=round(_p99(latencies), 3),
        lookup_mean_ms=round(statistics.fmean(latencies), 3),
        lookup_cpu_p50_ms=round(statistics.median(cpu), 3),
        lookup_cpu_p99_ms=round(_p99(cpu), 3),
        ingest_cpu_pages_per_second=round(event_pages / ingest_cpu),
        mean_cached_pages=round(cached / lookups, 1),
        bytes_per_page=round(size / max(1, directory.page_count), 1),
        bytes_method="sys.getsizeof over gc.get_referents walk from the directory",
        seed=seed,
        python=platform.python_version(),
        implementation="page-exact" if page_exact else "runs",
        runs=directory.page_count if isinstance(directory, PageKvDirectory) else directory.run_count,
        bytes_per_page_by_type={k: round(b / per_page, 1) for k, b in by_type.most_common() if b >= per_page / 10},
    )


Call = tuple[int, str, tuple[Any, ...]]
"""One recorded directory call: (which directory, method name, arguments)."""
_RECORDED = ("store", "remove", "clear", "touch", "lookup", "add_node", "drop_node")
_TIMED = ("store", "remove", "lookup")


@contextmanager
def recording(calls: list[Call]) -> Iterator[None]:
    """Record into `calls` every call of `_RECORDED` made on any `KvDirectory` while inside (the simulator builds
    its own directory). A store's own `add_node` is recorded too; replaying it again is a no-op."""
    originals = {name: getattr(KvDirectory, name) for name in _RECORDED}

    def recorder(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(self: KvDirectory, *args: Any) -> Any:
            if name == "lookup":  # the caller's list may change later
                args = (list(args[0]),)
            calls.append((id(self), name, args))
            return method(self, *args)

        return recorded

    try:
        for name, method in originals.items():
            setattr(KvDirectory, name, recorder(name, method))
        yield
    finally:
        for name, method in originals.items():
            setattr(KvDirectory, name, method)


def record_sim_calls(duration: float, agents: int = 90, nodes: int = 9, seed: int = 0) -> tuple[list[Call], int]:
    """The directory calls of `bench sim --duration DURATION`'s simulation, and the requests it finished."""
    from evolving_infra.cli.bench_sim import bench_config
    from evolving_infra.sim.run import simulate, workload_stream

    args = argparse.Namespace(agents=agents, nodes=nodes, duration=duration, warmup=0.0, split=None, seed=seed,
                              system="evolving")  # fmt: skip
    cfg = bench_config(args)
    calls: list[Call] = []
    trace = workload_stream("cc", 2 * agents, seed)
    with recording(calls):
        result = simulate(cfg, trace)
    return calls, len(result.records)


Factory = Callable[[], KvDirectory | PageKvDirectory]


def replay(calls: list[Call], factory: Factory) -> tuple[dict[str, float], list[Any]]:
    """Apply `calls` to fresh directories from `factory` (one per recorded directory); process CPU seconds of the
    stores, removals and lookups, and the directories at the end."""
    directories: dict[int, Any] = {}
    cpu = dict.fromkeys(_TIMED, 0.0)
    clock = time.process_time
    for key, name, args in calls:
        directory = directories.get(key)
        if directory is None:
            directory = directories[key] = factory()
        method = getattr(directory, name)
        if name in cpu:
            start = clock()
            method(*args)
            cpu[name] += clock() - start
        else:
            method(*args)
    return cpu, list(directories.values())


@dataclass(frozen=True)
class SimReplayResult:
    simulated_s: float
    requests: int
    stores: int
    stored_pages: int
    removals: int
    removed_pages: int
    lookups: int
    looked_up_pages: int
    reps: int
    cpu_s: dict[str, dict[str, float]]  # implementation -> stores / removals / lookups / total (best of reps)
    pages_at_end: int
    runs_at_end: dict[str, int]
    bytes_per_page_at_end: dict[str, float]
    python: str


def run_sim_replay(duration: float, reps: int, agents: int = 90, nodes: int = 9) -> SimReplayResult:
    calls, requests = record_sim_calls(duration, agents, nodes)
    forms: dict[str, Factory] = {"runs": KvDirectory, "page-exact": PageKvDirectory}
    best: dict[str, dict[str, float]] = {}
    ends: dict[str, Any] = {}
    for _ in range(reps):
        for form, factory in forms.items():
            gc.collect()
            cpu, directories = replay(calls, factory)
            cpu["total"] = sum(cpu.values())
            if form not in best or cpu["total"] < best[form]["total"]:
                best[form] = {k: round(v, 3) for k, v in cpu.items()}
            ends[form] = directories[0] if directories else factory()
    pages = {form: max(1, d.page_count) for form, d in ends.items()}

    def count(name: str) -> tuple[int, int]:
        chosen = [args for _, n, args in calls if n == name]
        return len(chosen), sum(len(a[2] if name == "remove" else a[3] if name == "store" else a[0]) for a in chosen)

    (stores, stored), (removals, removed), (lookups, looked) = count("store"), count("remove"), count("lookup")
    return SimReplayResult(
        simulated_s=duration,
        requests=requests,
        stores=stores,
        stored_pages=stored,
        removals=removals,
        removed_pages=removed,
        lookups=lookups,
        looked_up_pages=looked,
        reps=reps,
        cpu_s=best,
        pages_at_end=ends["runs"].page_count,
        runs_at_end={f: (d.page_count if isinstance(d, PageKvDirectory) else d.run_count) for f, d in ends.items()},
        bytes_per_page_at_end={form: round(deep_size(d) / pages[form], 1) for form, d in ends.items()},
        python=platform.python_version(),
    )


def _p99(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(0.99 * len(sorted_values)))]


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise CliError(f"--{name} must be a positive integer, got {value}", USAGE_ERROR)
    return value


def _sim_handler(args: argparse.Namespace) -> int:
    if args.sim <= 0:
        raise CliError(f"--sim must be > 0 simulated seconds, got {args.sim:g}", USAGE_ERROR)
    result = run_sim_replay(args.sim, _positive("sim-reps", args.sim_reps))
    if args.json:
        print(json.dumps(asdict(result), indent=2))
        return 0
    table = Table(title=f"KV directory under bench sim's calls ({result.simulated_s:g} simulated s, "
                        f"{result.requests:,} requests)")  # fmt: skip
    table.add_column("figure")
    for form in result.cpu_s:
        table.add_column(form, justify="right")
    cpu = result.cpu_s
    for part in (*_TIMED, "total"):
        table.add_row(f"{part} (process CPU s, best of {result.reps})", *(f"{cpu[f][part]:.3f}" for f in cpu))
    table.add_row("runs at the end", *(f"{result.runs_at_end[f]:,}" for f in cpu))
    table.add_row("bytes per page at the end", *(f"{result.bytes_per_page_at_end[f]:,.1f}" for f in cpu))
    console = Console()
    console.print(table)
    console.print(f"{result.stores:,} stores ({result.stored_pages:,} pages), {result.removals:,} removals "
                  f"({result.removed_pages:,} pages), {result.lookups:,} lookups ({result.looked_up_pages:,} pages); "
                  f"{result.pages_at_end:,} pages at the end")  # fmt: skip
    return 0


def _handler(args: argparse.Namespace) -> int:
    if args.sim is not None:
        return _sim_handler(args)
    result = run_benchmark(
        nodes=_positive("nodes", args.nodes),
        pages=_positive("pages", args.pages),
        seed=args.seed,
        lookups=_positive("lookups", args.lookups),
        prompt_pages=_positive("prompt-pages", args.prompt_pages),
        page_exact=args.page_exact,
    )
    if args.json:
        print(json.dumps(asdict(result), indent=2))
        return 0
    table = Table(title=f"KV directory: {result.nodes} nodes, {result.distinct_pages:,} distinct pages")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    rows = [
        ("KV events applied", f"{result.events:,} ({result.event_pages:,} pages)", ""),
        ("ingest", f"{result.ingest_pages_per_second:,} pages/s", ">= 1,000,000 pages/s"),
        ("ingest (thread CPU time)", f"{result.ingest_cpu_pages_per_second:,} pages/s", ""),
        ("ingest", f"{result.ingest_events_per_second:,} events/s", ""),
        (f"lookup p50 ({result.prompt_tokens:,}-token prompt)", f"{result.lookup_p50_ms:.3f} ms", ""),
        (f"lookup p99 ({result.prompt_tokens:,}-token prompt)", f"{result.lookup_p99_ms:.3f} ms", "<= 1 ms"),
        ("lookup p50 (thread CPU time)", f"{result.lookup_cpu_p50_ms:.3f} ms", ""),
        ("lookup p99 (thread CPU time)", f"{result.lookup_cpu_p99_ms:.3f} ms", "<= 1 ms"),
        ("mean longest cached prefix", f"{result.mean_cached_pages:,.1f} pages", ""),
        ("memory", f"{result.bytes_per_page:,.1f} bytes/page", ""),
        ("memory by type", ", ".join(f"{k} {v:,.1f}" for k, v in result.bytes_per_page_by_type.items()), ""),
        (f"runs ({result.implementation})", f"{result.runs:,}", ""),
    ]
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(f"bytes/page: {result.bytes_method}; seed {result.seed}; Python {result.python}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("directory", help="KV directory: ingest rate, lookup latency, bytes per page")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--nodes", type=int, default=96, help="nodes (half prefill, half decode; default 96)")
    parser.add_argument("--pages", type=int, default=1_000_000, help="distinct pages to load (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--lookups", type=int, default=1000, help="lookups to time (default 1000)")
    parser.add_argument(
        "--prompt-pages", type=int, default=2000, help="pages per looked-up prompt (default 2000 = 128K tokens)"
    )
    parser.add_argument(
        "--page-exact", action="store_true", help="measure the page-exact directory (the test oracle) instead"
    )
    parser.add_argument(
        "--sim", type=float, metavar="SECONDS",
        help="replay the directory calls of bench sim's simulation of SECONDS simulated seconds instead",
    )  # fmt: skip
    parser.add_argument("--sim-reps", type=int, default=3, help="alternated replays per form with --sim (default 3)")
    parser.set_defaults(handler=_handler)
