"""The fleet simulator: partitions from CR files, users bound by the gateway's binder, identical results everywhere.

A small fleet (three partitions of two nodes; regions `main`, `main`, `east`) runs a short generated fleet
workload. Checked: the fleet equals its partitions simulated one by one with `sim.run.simulate` on the bound
traces; the inline, process (1 and 2 workers) and Ray executors give identical results; bindings respect the
users' region; malformed fleet files are refused naming the file and the field. The Ray test runs Ray in a
private loopback-only network namespace (`unshare -n`), bounded in time, and skips where Ray or namespaces are
missing.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.cli.bench_transfer import netns_unavailable, private_netns_command
from evolving_infra.cli.errors import USAGE_ERROR
from evolving_infra.cli.main import main as cli_main
from evolving_infra.fleet import cache as fleet_cache
from evolving_infra.fleet.executors import ExecutorKind, open_executor, ray_unavailable
from evolving_infra.fleet.partitions import load_partitions
from evolving_infra.fleet.runs import simulate_fleet, simulate_fleets
from evolving_infra.fleet.sim import (
    FleetOptions,
    FleetRunError,
    FleetWorkload,
    bind_tasks,
    partition_concurrency,
    partition_config,
    partition_tasks,
    run_partition,
)
from evolving_infra.fleet.sim_report import mix
from evolving_infra.sim.run import simulate
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.workloads import generate_with, write_trace
from evolving_infra.workloads.dist import LogNormal
from evolving_infra.workloads.fleet import REGION_LABEL, FleetParams, Region, tasks_for

PARTITION = """\
---
apiVersion: serving.evolving-infra.io/v1alpha1
kind: AgentServingCluster
metadata:
  name: tiny-{name}
  labels:
    evolving-infra.io/region: {region}
spec:
  nodeSelector:
    matchLabels:
      evolving-infra.io/partition: {selector}
  nodeCount: 2
  gpusPerNode: 4
  engine:
    backend: emulated
    profile: {profile}
  initialSplit:
    prefill: 1
    decode: 1
  planner:
    mode: adaptive
    windowSeconds: 60
    slices: 6
    cooldownSeconds: 10
"""
PARAMS = FleetParams(
    regions=(Region("main", 2, 0.5, 0.5), Region("east", 1, 0.2, 0.8)), span_s=150.0, slices=3, tail=0.2,
    task_estimate_s={"cc": 400.0, "codex": 400.0},
)
OPTS = FleetOptions(duration_s=120.0, warmup_s=0.0, seed=3, bucket_s=30.0, drain_s=30.0)
AGENTS = 6


def write_fleet(folder: Path, *, profile: str = "glm-5.2-4xgb300-tp4", overlap: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, region in enumerate(("main", "main", "east")):
        selector = "p0" if overlap and i == 1 else f"p{i}"
        (folder / f"p{i}.yaml").write_text(PARTITION.format(name=f"p{i}", region=region, selector=selector,
                                                            profile=profile if i == 2 else "glm-5.2-4xgb300-tp4"))
    return folder


def write_fleet_trace(path: Path) -> Path:
    """The small fleet's workload (seed 3) as a fleet trace file, as `workload generate --kind fleet` writes it."""
    params = dataclasses.replace(PARAMS, concurrency=AGENTS)
    write_trace(generate_with("fleet", tasks_for(params, AGENTS), 3, params), path)
    return path


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fleet(tmp_path_factory.mktemp("fleet") / "tiny")


@pytest.fixture(scope="module")
def inline_result(fleet_dir: Path) -> Any:
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.generated(PARAMS, AGENTS, seed=3)
    with open_executor(ExecutorKind.INLINE) as executor:
        return simulate_fleet(partitions, workload, dataclasses.replace(OPTS, keep_records=True), executor)


def test_fleet_equals_its_partitions_simulated_one_by_one(fleet_dir: Path, inline_result: Any) -> None:
    partitions = load_partitions([fleet_dir])
    # The whole fleet trace as a file would hold it, bound and cut per partition by hand.
    params = dataclasses.replace(PARAMS, concurrency=AGENTS)
    records = generate_with("fleet", tasks_for(params, AGENTS), 3, params)
    workload = FleetWorkload.from_records(records)
    binding = bind_tasks(partitions, workload.tasks)
    concurrency = partition_concurrency(partitions, AGENTS)
    prefixes = [r for r in records if r["kind"] == "prefix"]
    branch_agent = {str(r["branch"]): str(r["agent"]) for r in records if r["kind"] == "request"}

    def agent_of(record: dict[str, Any]) -> str:
        return str(record["agent"]) if "agent" in record else branch_agent[str(record["branch"])]

    assert workload.skip_late_s(OPTS) == PARAMS.span_s / PARAMS.slices  # the header's schedule, one slice
    assert len(inline_result.partitions) == 3
    for p, fleet_part in zip(partitions, inline_result.partitions, strict=True):
        mine = [r for r in records if r["kind"] not in ("header", "prefix") and binding[agent_of(r)] == p.key]
        trace = trace_from_records([{"kind": "header", "version": 1, "name": "alone"}, *prefixes, *mine])
        tasks = [t for t in workload.tasks if binding[t.agent] == p.key]
        mix_of = workload.mix_for(tasks, OPTS)
        assert mix_of is not None and mix_of[1] == PARAMS.span_s / PARAMS.slices
        alone = simulate(partition_config(p, OPTS, concurrency[p.key], workload.skip_late_s(OPTS), mix_of), trace)
        assert fleet_part.key == p.key
        assert fleet_part.requests == len(alone.records) > 0
        assert fleet_part.records == alone.records
        assert fleet_part.metrics == alone.metrics.to_dict()


def test_bindings_respect_regions_and_every_task_is_bound(fleet_dir: Path) -> None:
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.generated(PARAMS, AGENTS, seed=3)
    binding = bind_tasks(partitions, workload.tasks)
    labels = {p.key: p.labels for p in partitions}
    assert set(binding) == {t.agent for t in workload.tasks}
    for task in workload.tasks:
        assert labels[binding[task.agent]][REGION_LABEL] == task.requires[REGION_LABEL]
    users: dict[str, str] = {}
    for task in workload.tasks:  # a user never spans two partitions
        assert users.setdefault(task.user, binding[task.agent]) == binding[task.agent]


@pytest.mark.parametrize("workers", [1, 2])
def test_process_executor_gives_the_inline_result(fleet_dir: Path, inline_result: Any, workers: int) -> None:
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.generated(PARAMS, AGENTS, seed=3)
    with open_executor(ExecutorKind.PROCESSES, workers) as executor:
        result = simulate_fleet(partitions, workload, OPTS, executor)
    assert result.same_outcome() == inline_result.same_outcome()


RAY_SCRIPT = textwrap.dedent("""
    import json, sys
    from evolving_infra.cli.bench_transfer import bring_loopback_up
    bring_loopback_up()  # refuses to run outside a loopback-only namespace
    sys.path.insert(0, {tests!r})
    from test_fleet_sim import AGENTS, OPTS, PARAMS
    from evolving_infra.fleet.executors import open_executor
    from evolving_infra.fleet.partitions import load_partitions
    from evolving_infra.fleet.runs import simulate_fleet
    from evolving_infra.fleet.sim import FleetWorkload
    with open_executor("ray", 2) as executor:
        result = simulate_fleet(load_partitions([{fleet!r}]), FleetWorkload.generated(PARAMS, AGENTS, seed=3),
                                OPTS, executor)
    print(json.dumps(result.same_outcome(), sort_keys=True))
""")


def test_ray_executor_gives_the_process_result(fleet_dir: Path, inline_result: Any) -> None:
    for why in (ray_unavailable(), netns_unavailable()):
        if why is not None:
            pytest.skip(why)
    script = RAY_SCRIPT.format(tests=str(Path(__file__).parent), fleet=str(fleet_dir))
    done = subprocess.run(private_netns_command([sys.executable, "-c", script]), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    expected = json.loads(json.dumps(inline_result.same_outcome(), sort_keys=True))
    assert got == expected


def refused(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code = cli_main(["simulate", "--fleet", str(folder), "--workload", "fleet", "--agents", "6", "--duration", "60"])
    assert code == USAGE_ERROR
    return capsys.readouterr().err


def test_overlapping_selectors_are_refused_naming_file_and_field(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    message = refused(write_fleet(tmp_path / "bad", overlap=True), capsys)
    assert f"{tmp_path}/bad/p1.yaml: tiny-p1: spec.nodeSelector: overlaps" in message


def test_unknown_profiles_are_refused_naming_file_and_field(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    message = refused(write_fleet(tmp_path / "bad", profile="no-such-gpu-profile"), capsys)
    assert f"{tmp_path}/bad/p2.yaml: tiny-p2: spec.engine.profile:" in message and "no-such-gpu-profile" in message


def test_a_task_no_partition_admits_is_refused(fleet_dir: Path) -> None:
    params = dataclasses.replace(PARAMS, regions=(Region("main", 2, 0.5, 0.5), Region("mars", 1, 0.5, 0.5)))
    with pytest.raises(FleetRunError, match="mars"):
        bind_tasks(load_partitions([fleet_dir]), FleetWorkload.generated(params, AGENTS, seed=0).tasks)


@settings(max_examples=40, deadline=None)
@given(total=st.integers(3, 5000), gpus=st.lists(st.integers(1, 64), min_size=1, max_size=3))
def test_partition_concurrency_adds_up(total: int, gpus: list[int], fleet_dir: Path) -> None:
    partitions = load_partitions([fleet_dir])[: len(gpus)]
    partitions = [dataclasses.replace(p, spec=p.spec.model_copy(update={"node_count": g, "gpus_per_node": 1}))
                  for p, g in zip(partitions, gpus, strict=False)]
    split = partition_concurrency(partitions, total)
    assert sum(split.values()) == total and min(split.values()) >= 1


def test_simulate_fleet_command_reads_a_fleet_trace_and_writes_the_report(fleet_dir: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_fleet_trace(tmp_path / "fleet.jsonl")
    out = tmp_path / "out"
    code = cli_main(["simulate", "--fleet", str(fleet_dir), str(trace), "--warmup", "0", "--duration", "60",
                     "--seed", "3", "--bucket", "30", "--executor", "inline", "--compare-static", "--json",
                     "--quiet", "--out", str(out)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["partition"] for r in report["adaptive"]["rows"]] == ["tiny-p0", "tiny-p1", "tiny-p2"]
    for row, part in zip(report["adaptive"]["rows"], report["adaptive"]["partitions"], strict=True):
        assert row["planner_holds"] == len(part["metrics"]["planner_hold_decisions"])
    assert all(r["planner_holds"] == 0 == r["kv_refused_moves"] for r in report["static"]["rows"])
    assert report["static"]["options"]["planner"] == "static"
    assert report["adaptive"]["summary"]["requests"] > 0
    fleet = report["comparison"]["fleet"]
    assert fleet["static_rps"] > 0 and fleet["ratio"] == pytest.approx(fleet["adaptive_rps"] / fleet["static_rps"])
    assert (out / "fleet.png").stat().st_size > 0 and "| **fleet** |" in (out / "fleet.md").read_text()
    table = [line for line in (out / "fleet.md").read_text().splitlines() if line.startswith("| tiny-p0 ")]
    header = [line for line in (out / "fleet.md").read_text().splitlines() if "holds (KV-refused moves)" in line]
    assert len(table) == 1 and len(header) == 1 and table[0].count("|") == header[0].count("|")


def test_a_partition_follows_its_schedule_when_tasks_outlast_the_layout(fleet_dir: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # The east region's CC share moves 0.2 -> 0.8 over 600 s; the trace is laid out for 15-s tasks, which last
    # longer when simulated, so a replay in file order falls behind the schedule and never reaches the shift.
    short = LogNormal(3, 0.3, lo=2, hi=6)
    params = dataclasses.replace(PARAMS, cc=dataclasses.replace(PARAMS.cc, main_steps=short),
                                 codex=dataclasses.replace(PARAMS.codex, main_steps=short), span_s=600.0, slices=6,
                                 task_estimate_s={"cc": 15.0, "codex": 15.0})
    workload = FleetWorkload.generated(params, 12, seed=3)
    assert workload.slice_s == 100.0
    opts = FleetOptions(duration_s=600.0, warmup_s=0.0, seed=3, bucket_s=50.0, drain_s=30.0)
    east = [run_partition(partition_tasks(load_partitions([fleet_dir]), workload, o)[2])
            for o in (opts, dataclasses.replace(opts, follow_schedule=False))]
    following, plain = (mix(r.series[:12]) for r in east)
    assert following is not None and plain is not None and following["workload"] == "cc"
    assert following["first"] <= 0.35 and following["last"] >= 0.55  # the shift happens when the schedule says
    assert plain["last"] < 0.4  # in file order the replay is still near its starting mix
    assert east[0].metrics["simulation"]["skipped_agents"] > 0 and east[0].metrics["config"]["skip_late_s"] == 100.0
    assert "skipped_agents" not in east[1].metrics["simulation"] and east[1].metrics["config"]["skip_late_s"] is None
    # The east region's running mix, from the header's fleet.mix (cc 0.2 -> 0.8 over the shift), held by the replay.
    assert east[0].metrics["config"]["agent_mix"]["cc"][0] == 0.2 and east[0].metrics["config"]["agent_mix_step_s"] == 100
    assert east[1].metrics["config"]["agent_mix"] is None


def test_bad_fleet_settings_are_refused(fleet_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["simulate", "--fleet", str(fleet_dir), "--workload", "fleet", "--agents", "6", "--duration", "60",
                     "--fleet-set", "no_such_parameter=3"])
    assert code == USAGE_ERROR and "--fleet-set" in capsys.readouterr().err
    assert cli_main(["simulate", "--fleet", str(fleet_dir), "--workload", "cc", "--agents", "6"]) == USAGE_ERROR
    capsys.readouterr()
    for bad in ("-5", "soon", "inf"):
        with pytest.raises(SystemExit):
            cli_main(["simulate", "--fleet", str(fleet_dir), "--workload", "fleet", "--agents", "6", "--skip-late", bad])
        assert "--skip-late: expected seconds >= 0 or 'off'" in capsys.readouterr().err


class _Refusing(Executor):
    """An executor that runs nothing (a fully stored fleet must not submit a partition)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a stored partition was simulated again: {args[0].key}")


class _FailingOn(Executor):
    """Runs tasks inline but fails the one of partition `key` (a worker that dies mid-run)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.ran: list[str] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        from concurrent.futures import Future

        future: Future[Any] = Future()
        if args[0].key == self.key:
            future.set_exception(RuntimeError("worker lost"))
        else:
            self.ran.append(args[0].key)
            future.set_result(fn(*args, **kwargs))
        return future


def test_a_partition_cache_keeps_finished_partitions_and_resumes_a_stopped_run(fleet_dir: Path, inline_result: Any,
                                                                              tmp_path: Path) -> None:
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.generated(PARAMS, AGENTS, seed=3)
    cache = tmp_path / "cache"
    failing = _FailingOn(partitions[1].key)
    with pytest.raises(RuntimeError, match="worker lost"):
        simulate_fleet(partitions, workload, OPTS, failing, cache=cache)
    assert failing.ran == [partitions[0].key, partitions[2].key]
    assert len(list(cache.glob("*.json"))) == 2  # the two that finished are kept
    resumed: list[str] = []
    stored: list[str] = []
    with open_executor(ExecutorKind.INLINE) as executor:
        result = simulate_fleet(partitions, workload, OPTS, executor, on_done=lambda r: resumed.append(r.key),
                                cache=cache)
    assert resumed == [partitions[1].key]
    assert result.same_outcome() == inline_result.same_outcome()  # stored results read back exactly
    again = simulate_fleets(partitions, workload, [OPTS], _Refusing(), cache=cache,
                            on_cached=lambda r: stored.append(r.key))[0]
    assert stored == [p.key for p in partitions]
    assert again.same_outcome() == inline_result.same_outcome()
    assert not list(cache.glob("*.tmp"))


def test_a_partition_cache_never_serves_other_inputs_or_code(fleet_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.generated(PARAMS, AGENTS, seed=3)
    tasks = partition_tasks(partitions, workload, OPTS)
    names = {fleet_cache.result_path(tmp_path, t).name for t in tasks}
    assert len(names) == len(tasks)
    for other in (dataclasses.replace(OPTS, duration_s=90.0), dataclasses.replace(OPTS, planner="static"),
                  dataclasses.replace(OPTS, bucket_s=60.0), dataclasses.replace(OPTS, follow_schedule=False),
                  dataclasses.replace(OPTS, skip_late_s=10.0)):
        assert not names & {fleet_cache.result_path(tmp_path, t).name for t in partition_tasks(partitions, workload, other)}
    reseeded = partition_tasks(partitions, FleetWorkload.generated(PARAMS, AGENTS, seed=4), OPTS)
    assert not names & {fleet_cache.result_path(tmp_path, t).name for t in reseeded}
    monkeypatch.setattr(fleet_cache, "code_digest", lambda: "0" * 16)  # the simulator's code changed
    assert not names & {fleet_cache.result_path(tmp_path, t).name for t in tasks}
    # nothing is stored for runs that keep their records (tests): those results are not what the file holds
    kept = partition_tasks(partitions, workload, dataclasses.replace(OPTS, keep_records=True))
    assert fleet_cache.load(tmp_path, kept[0]) is None


def test_an_unreadable_stored_result_is_refused_naming_the_file(fleet_dir: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    partitions = load_partitions([fleet_dir])
    task = partition_tasks(partitions, FleetWorkload.generated(PARAMS, AGENTS, seed=3), OPTS)[0]
    path = fleet_cache.result_path(tmp_path, task)
    path.write_text("{not json")
    with pytest.raises(fleet_cache.CacheError, match=path.name):
        fleet_cache.load(tmp_path, task)
    path.write_text(json.dumps({"format": fleet_cache.FORMAT, "digest": "another", "result": {}}))
    with pytest.raises(fleet_cache.CacheError, match="not a stored partition result"):
        fleet_cache.load(tmp_path, task)


def test_simulate_fleet_command_resumes_from_its_partition_cache(fleet_dir: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_fleet_trace(tmp_path / "fleet.jsonl")
    argv = ["simulate", "--fleet", str(fleet_dir), str(trace), "--warmup", "0", "--duration", "60", "--seed", "3",
            "--bucket", "30", "--executor", "inline", "--json", "--partition-cache", str(tmp_path / "parts")]
    assert cli_main(argv) == 0
    first = capsys.readouterr()
    assert len(list((tmp_path / "parts").glob("*.json"))) == 3 and "stored in" not in first.err
    assert cli_main(argv) == 0
    second = capsys.readouterr()
    assert second.err.count("stored in") == 3

    def outcome(out: str) -> Any:
        run = json.loads(out)["run"]
        return run["rows"], [{k: v for k, v in p.items() if k not in ("wall_s", "peak_rss_mb")} for p in run["partitions"]]

    assert outcome(second.out) == outcome(first.out)
    cost = [json.loads(o)["run"]["summary"]["partition_wall_s_sum"] for o in (first.out, second.out)]
    assert cost[0] > 0 and cost[1] == cost[0]  # what the stored partitions took when they ran, not this reading
    (next((tmp_path / "parts").glob("*.json"))).write_text("[]")
    assert cli_main(argv) == USAGE_ERROR
    assert "not a stored partition result" in capsys.readouterr().err


def test_stored_only_lists_what_a_partly_done_run_has_kept(fleet_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_fleet_trace(tmp_path / "fleet.jsonl")
    cache = tmp_path / "parts"
    argv = ["simulate", "--fleet", str(fleet_dir), str(trace), "--warmup", "0", "--duration", "60", "--seed", "3",
            "--bucket", "30", "--compare-static", "--partition-cache", str(cache)]
    assert cli_main([*argv, "--stored-only"]) == 0
    assert "0 of 6 partition runs stored" in capsys.readouterr().out
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.from_records(json.loads(line) for line in trace.read_text().splitlines())
    opts = FleetOptions(duration_s=60.0, warmup_s=0.0, seed=3, bucket_s=30.0)
    failing = _FailingOn(partitions[1].key)  # p1 fails in both runs: four of six are stored
    with pytest.raises(RuntimeError):
        simulate_fleets(partitions, workload, [opts, dataclasses.replace(opts, planner="static")], failing, cache=cache)
    assert len(list(cache.glob("*.json"))) == 4
    assert cli_main([*argv, "--stored-only"]) == 0
    out = capsys.readouterr().out
    assert "4 of 6 partition runs stored; not yet: tiny-p1 (adaptive), tiny-p1 (static)" in out
    p0 = next(line for line in out.splitlines() if line.startswith("| tiny-p0 |"))
    assert "not stored" not in p0 and p0.rstrip(" |").split("| ")[-1] != "-"  # both runs: a ratio
    assert cli_main([*argv, "--stored-only", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["adaptive"] is None for r in rows] == [False, True, False]
    assert rows[0]["ratio"] == pytest.approx(rows[0]["adaptive"]["throughput_rps"] / rows[0]["static"]["throughput_rps"])
    assert cli_main([*argv[:-2], "--stored-only"]) == USAGE_ERROR  # no cache given
    # a partition still running elsewhere shows how far it is
    from evolving_infra.fleet.runs import progress_file

    task = partition_tasks(partitions, workload, opts)[1]
    progress_file(cache, task).write_text(json.dumps({"sim_s": 30.0, "end_s": 60.0, "events": 1234, "wall_s": 90.0,
                                                      "pid": 7, "host": "h", "written": 0.0}))
    assert cli_main([*argv, "--stored-only"]) == 0
    assert "running: default/tiny-p1 (adaptive): 30 / 60 simulated s, 1,234 events, 1.5 min wall" in capsys.readouterr().out
    # p1's result stored by other code (another digest) is not used, but named
    theirs = fleet_cache.result_path(cache, task)
    theirs = theirs.with_name(theirs.name[: -len(".json") - 24] + "f" * 24 + ".json")
    theirs.write_text(json.dumps({"format": fleet_cache.FORMAT, "digest": "f" * 24, "code": "0123456789abcdef"}))
    assert fleet_cache.others(cache, task) == {theirs: "0123456789abcdef"}
    assert cli_main([*argv, "--stored-only"]) == 0
    out = capsys.readouterr().out
    assert "4 of 6 partition runs stored" in out and "other inputs or code (code 0123456789abcdef;" in out


def test_partitions_flag_runs_only_the_named_partitions_as_the_whole_fleet_would(
        fleet_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_fleet_trace(tmp_path / "fleet.jsonl")
    cache = tmp_path / "parts"
    argv = ["simulate", "--fleet", str(fleet_dir), str(trace), "--warmup", "0", "--duration", "60", "--seed", "3",
            "--bucket", "30", "--compare-static", "--executor", "inline"]
    assert cli_main([*argv, "--partition-cache", str(cache), "--partitions", "tiny-p1"]) == 0
    out = capsys.readouterr().out
    assert ("2 of 6 partition runs stored; not yet: tiny-p0 (adaptive), tiny-p0 (static), tiny-p2 (adaptive), "
            "tiny-p2 (static)") in out
    # p1's two runs, stored under the names the whole fleet's run gives them (users bound over the whole fleet)
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.from_records(json.loads(line) for line in trace.read_text().splitlines())
    opts = FleetOptions(duration_s=60.0, warmup_s=0.0, seed=3, bucket_s=30.0)
    p1 = [partition_tasks(partitions, workload, o)[1] for o in (opts, dataclasses.replace(opts, planner="static"))]
    assert sorted(cache.glob("*.json")) == sorted(fleet_cache.result_path(cache, t) for t in p1)
    # the whole run reads them and runs the rest; its figures equal a run that never stored anything
    assert cli_main([*argv, "--partition-cache", str(cache), "--json"]) == 0
    resumed = capsys.readouterr()
    assert resumed.err.count("stored in") == 2 and len(list(cache.glob("*.json"))) == 6
    assert cli_main([*argv, "--json"]) == 0
    whole = capsys.readouterr()

    def outcome(out: str) -> Any:
        report = json.loads(out)
        return [[{k: v for k, v in p.items() if k not in ("wall_s", "peak_rss_mb")} for p in report[run]["partitions"]]
                for run in ("adaptive", "static")]

    assert outcome(resumed.out) == outcome(whole.out)
    # without a cache the named partitions are simulated and shown, nothing kept; namespace/name works too
    assert cli_main([*argv, "--partitions", "default/tiny-p2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["adaptive"] is None, r["static"] is None) for r in rows] == [(True, True), (True, True), (False, False)]
    assert cli_main([*argv, "--partitions", "tiny-p9"]) == USAGE_ERROR
    assert "no partition 'tiny-p9' in the fleet files (partitions: default/tiny-p0," in capsys.readouterr().err
    assert cli_main([*argv, "--partitions", "tiny-p1", "--out", str(tmp_path / "out")]) == USAGE_ERROR
    assert "--out writes the whole fleet's report" in capsys.readouterr().err


def test_static_split_sets_the_static_runs_split_and_single_cluster_flags_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "three"
    folder.mkdir()
    for i, region in enumerate(("main", "east")):
        text = PARTITION.format(name=f"p{i}", region=region, selector=f"p{i}", profile="glm-5.2-4xgb300-tp4")
        (folder / f"p{i}.yaml").write_text(text.replace("nodeCount: 2", "nodeCount: 3").replace("decode: 1", "decode: 2"))
    trace = write_fleet_trace(tmp_path / "fleet.jsonl")
    argv = ["simulate", "--fleet", str(folder), str(trace), "--warmup", "0", "--duration", "30", "--seed", "3",
            "--bucket", "30", "--executor", "inline", "--quiet"]
    cache = tmp_path / "parts"
    assert cli_main([*argv, "--compare-static", "--static-split", "2P1D", "--partitions", "tiny-p1",
                     "--partition-cache", str(cache), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][1]
    assert row["adaptive"]["splits"][0] == "1P2D" and row["static"]["splits"] == ["2P1D"]
    stored = sorted(json.loads(f.read_text())["result"]["split"] for f in cache.glob("*.json"))
    assert stored == ["1P2D", "2P1D"]  # the static run at 2P1D, the adaptive one from the CR's 1P2D
    for flags, message in ((["--compare-static", "--static-split", "2P2D"], "does not fit default/tiny-p0 (3 nodes)"),
                           (["--compare-static", "--static-split", "two"], "--static-split: split 'two' is not"),
                           (["--static-split", "2P1D"], "add --compare-static (or --planner static)"),
                           (["--split", "2P1D", "--profile", "x"], "--profile, --split: not a fleet setting")):
        assert cli_main([*argv, *flags]) == USAGE_ERROR
        assert message in capsys.readouterr().err


def test_the_code_digest_covers_what_a_partition_run_executes() -> None:
    seen = set()
    for name in fleet_cache.CODE_PACKAGES:  # every excluded module exists (a rename would otherwise go unnoticed)
        root = Path(__import__(f"evolving_infra.{name}", fromlist=["_"]).__file__).parent
        seen |= {f"{name}/{p.relative_to(root).as_posix()}" for p in root.rglob("*.py")}
    assert fleet_cache.NOT_CODE <= seen
    # what builds and runs a partition (its config, binding, trace, simulation) is in the digest
    assert {"fleet/sim.py", "fleet/binding.py", "fleet/partitions.py", "operator/rendered.py", "sim/run.py",
            "node_agent/engine/engine.py", "router/core/core.py", "workloads/fleet.py"} <= seen - fleet_cache.NOT_CODE


def test_partitions_report_progress_without_changing_their_results(fleet_dir: Path, inline_result: Any,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from evolving_infra.fleet import progress as fleet_progress

    monkeypatch.setattr(fleet_progress, "EVERY", 50)  # a look at the clock every 50 events
    monkeypatch.setattr(fleet_progress, "MIN_INTERVAL_S", 0.0)  # and a write at each
    seen: list[dict[str, Any]] = []
    real = fleet_progress.writer

    def watched(path: Path, end_s: float | None) -> Any:
        hook = real(path, end_s)

        def report(p: Any) -> None:
            hook(p)
            state = fleet_progress.read(path)
            assert state is not None
            seen.append(state)

        return report

    monkeypatch.setattr(fleet_progress, "writer", watched)
    partitions = load_partitions([fleet_dir])
    workload = FleetWorkload.generated(PARAMS, AGENTS, seed=3)
    with open_executor(ExecutorKind.INLINE) as executor:
        result = simulate_fleet(partitions, workload, OPTS, executor, cache=tmp_path)
    assert result.same_outcome() == inline_result.same_outcome()  # watched runs give the same results
    assert len(seen) > 10 and all(s["end_s"] == pytest.approx(OPTS.duration_s + OPTS.drain_s) for s in seen)
    times = [s["sim_s"] for s in seen]
    assert max(times) > 0 and all(0 <= t <= OPTS.duration_s + OPTS.drain_s for t in times)
    assert not list(tmp_path.glob("*.progress")) and not list(tmp_path.glob("*.tmp"))  # removed at the end
    line = fleet_progress.describe(seen[-1], now=seen[-1]["written"] + 4)
    assert "simulated s" in line and "written 4 s ago" in line


DIGEST_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_fleet_sim import AGENTS, OPTS, PARAMS
    from evolving_infra.fleet.cache import task_digest
    from evolving_infra.fleet.partitions import load_partitions
    from evolving_infra.fleet.sim import FleetWorkload, partition_tasks
    tasks = partition_tasks(load_partitions([{fleet!r}]), FleetWorkload.generated(PARAMS, AGENTS, seed=3), OPTS)
    print(" ".join(task_digest(t) for t in tasks))
""")


def test_stored_names_do_not_depend_on_the_process(fleet_dir: Path) -> None:
    """A later session (another process, another hash seed) finds what an earlier one stored."""
    import os

    script = DIGEST_SCRIPT.format(tests=str(Path(__file__).parent), fleet=str(fleet_dir))
    names = []
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr[-2000:]
        names.append(done.stdout.split())
    here = [fleet_cache.task_digest(t) for t in partition_tasks(load_partitions([fleet_dir]),
                                                               FleetWorkload.generated(PARAMS, AGENTS, seed=3), OPTS)]
    assert names[0] == names[1] == here and len(set(here)) == 3


def test_a_partition_runs_with_the_settings_its_live_router_gets(tmp_path: Path) -> None:
    """The CR's free-form `planner.settings`, `routing.prefillSettings` and `routing.decodeSettings` reach the
    simulated partition as they reach the live router (`render_router_settings`), over the typed fields' settings."""
    from evolving_infra.operator.meta import ClusterRef
    from evolving_infra.operator.rendered import render_router_settings

    extra = textwrap.indent(textwrap.dedent("""\
        settings:
          active_kv: headroom
          kv_short_utilization: 0.4
        """), "    ")
    text = PARTITION.format(name="p0", region="main", selector="p0", profile="glm-5.2-4xgb300-tp4") + extra
    text += "  routing:\n    prefillSettings:\n      fetch_fixed_s: 0.2\n"
    (tmp_path / "p0.yaml").write_text(text)
    (p,) = load_partitions([tmp_path])
    config = partition_config(p, OPTS, 4)
    live = render_router_settings(ClusterRef(p.name, "agents", "uid-0"), p.spec)
    assert config.planner_settings["active_kv"] == "headroom" and config.planner_settings["kv_short_utilization"] == 0.4
    assert config.planner_settings == live["planner_settings"] and config.planner_settings["window_s"] == 60.0
    assert config.routing_settings == live["routing_settings"] and config.routing_settings["fetch_fixed_s"] == 0.2
    assert config.decode_settings == live["decode_settings"]
