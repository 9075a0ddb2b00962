"""Running a fleet's partition tasks: which tasks run, where, in what order, and what is kept of them.

    with open_executor("processes", workers=8) as executor:
        result = simulate_fleet(partitions, workload, FleetOptions(duration_s=5_400), executor)

`run_tasks` runs any list of `fleet.sim.PartitionTask`s on an executor (`fleet.executors`): with a cache folder
(`fleet.cache`) it reads the stored results and stores each new one as soon as it finishes; with a progress folder
each running task reports how far it is (`fleet.progress`). `simulate_fleets` runs whole fleets (every partition of
every run, e.g. adaptive then static) through it; a caller may also run a chosen subset of a fleet's tasks (the
CLI's `--partitions`), which are the same tasks, bound over the whole fleet, as the whole run would run.

None of this can change a partition's result (a pure function of its task), so this module is outside the code
digest that names stored results (`fleet.cache.NOT_CODE`).

Boundary: orchestration of partition runs; building and simulating one partition is `fleet.sim`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path

from evolving_infra.fleet import cache as fleet_cache
from evolving_infra.fleet import progress as fleet_progress
from evolving_infra.fleet.executors import map_ordered
from evolving_infra.fleet.partitions import FleetPartition
from evolving_infra.fleet.sim import (
    FleetOptions,
    FleetResult,
    FleetRunError,
    FleetWorkload,
    PartitionResult,
    PartitionTask,
    partition_tasks,
    run_partition,
)

__all__ = ["WAIT_S", "progress_file", "run_tasks", "simulate_fleet", "simulate_fleets"]

WAIT_S = 60.0
"""Seconds between two calls of `run_tasks`'s `on_wait` (progress while partitions run)."""


def progress_file(folder: Path, task: PartitionTask) -> Path:
    """The progress file of `task` in `folder`: its stored result's name with `fleet.progress.SUFFIX`."""
    return fleet_cache.result_path(folder, task).with_suffix(fleet_progress.SUFFIX)


def run_tasks(tasks: Sequence[PartitionTask], executor: Executor,
              on_done: Callable[[PartitionResult], None] | None = None, cache: Path | None = None,
              on_cached: Callable[[PartitionResult], None] | None = None, progress_dir: Path | None = None,
              on_wait: Callable[[list[PartitionTask]], None] | None = None) -> list[PartitionResult]:
    """The result of every task, in the order of `tasks`; all submitted at once (a cluster runs them side by
    side). With `cache` (a folder, `fleet.cache`), tasks whose result is stored there are read (`on_cached` called
    for each) and every task run here is stored as soon as it finishes, before `on_done` is called. With
    `progress_dir`, each task run here reports how far it is in a file there (`fleet.progress`; the cache's folder
    when None); `on_wait(tasks not yet finished)` is called every `WAIT_S` seconds while the runs go on."""
    where = progress_dir if progress_dir is not None else cache
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
        tasks = [replace(t, progress_path=str(progress_file(where, t))) for t in tasks]
    flat: list[PartitionResult | None] = [None] * len(tasks)
    if cache is not None:
        for i, task in enumerate(tasks):
            stored = flat[i] = fleet_cache.load(cache, task)
            if stored is not None and on_cached is not None:
                on_cached(stored)
    todo = [i for i, r in enumerate(flat) if r is None]
    unfinished = set(todo)

    def finished(j: int, result: PartitionResult) -> None:
        unfinished.discard(todo[j])
        if cache is not None:
            fleet_cache.store(cache, tasks[todo[j]], result)
        if on_done is not None:
            on_done(result)

    def waiting() -> None:
        if on_wait is not None:
            on_wait([tasks[i] for i in sorted(unfinished)])

    ran = map_ordered(executor, run_partition, [tasks[i] for i in todo], on_done=finished,
                      on_wait=waiting if on_wait is not None else None, wait_s=WAIT_S)
    for i, result in zip(todo, ran, strict=True):
        flat[i] = result
    done = [r for r in flat if r is not None]
    assert len(done) == len(tasks)
    return done


def simulate_fleet(partitions: Sequence[FleetPartition], workload: FleetWorkload, opts: FleetOptions,
                   executor: Executor, on_done: Callable[[PartitionResult], None] | None = None,
                   cache: Path | None = None) -> FleetResult:
    """Run every partition on `executor`; results in the order of `partitions`."""
    return simulate_fleets(partitions, workload, [opts], executor, on_done, cache)[0]


def simulate_fleets(partitions: Sequence[FleetPartition], workload: FleetWorkload, runs: Sequence[FleetOptions],
                    executor: Executor, on_done: Callable[[PartitionResult], None] | None = None,
                    cache: Path | None = None, on_cached: Callable[[PartitionResult], None] | None = None,
                    progress_dir: Path | None = None,
                    on_wait: Callable[[list[PartitionTask]], None] | None = None,
                    per_run: Sequence[Sequence[FleetPartition]] | None = None) -> list[FleetResult]:
    """Several runs of the same fleet and workload (e.g. adaptive and static), every partition of every run
    submitted at once through `run_tasks` (its arguments have the same meaning); one `FleetResult` per run, in
    order. `per_run`: each run's own copy of `partitions` (the same partitions, e.g. another static split)."""
    parts = per_run if per_run is not None else [partitions] * len(runs)
    if len(parts) != len(runs) or any([p.key for p in ps] != [p.key for p in partitions] for ps in parts):
        raise FleetRunError("per_run gives each run the fleet's partitions, in order")
    tasks = [t for opts, ps in zip(runs, parts, strict=True) for t in partition_tasks(ps, workload, opts)]
    start = time.perf_counter()
    done = run_tasks(tasks, executor, on_done, cache, on_cached, progress_dir, on_wait)
    wall = time.perf_counter() - start
    n = len(partitions)
    return [FleetResult(opts, done[k * n:(k + 1) * n], wall) for k, opts in enumerate(runs)]
