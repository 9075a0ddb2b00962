"""`evolving-infra bench directory` runs end to end on a small load (figures are printed, never asserted)."""

from __future__ import annotations

import json

import pytest

from evolving_infra.cli.bench_directory import deep_size, generate_events, record_sim_calls, run_benchmark
from evolving_infra.cli.main import main
from evolving_infra.core.kv_events import KvStored
from evolving_infra.core.types import Tier
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.directory_pages import PageKvDirectory


def test_generated_load_reaches_the_distinct_page_count_with_shared_prefixes() -> None:
    events, paths = generate_events(nodes=6, pages=3000, seed=3)
    directory = KvDirectory()
    directory.apply_all(events)
    assert directory.page_count == 3000
    assert len(directory.nodes()) <= 6
    assert directory.stats.unknown_parents == 0
    assert any(e.parent is not None for e in events if isinstance(e, KvStored))
    longest = max(paths, key=len)
    assert directory.lookup(longest).anywhere == len(longest)


def test_small_run_reports_consistent_figures() -> None:
    result = run_benchmark(nodes=4, pages=2000, seed=1, lookups=5, prompt_pages=50)
    assert result.distinct_pages == 2000 and result.lookups == 5
    assert result.event_pages >= result.distinct_pages
    assert 0 < result.mean_cached_pages <= 50
    assert result.bytes_per_page > 0
    by_type = result.bytes_per_page_by_type
    assert by_type["dict"] > 0 and by_type["int"] > 0  # the page index and the page hashes
    assert sum(by_type.values()) <= result.bytes_per_page + 0.1 * len(by_type)


def test_runs_and_page_exact_directories_report_the_same_load_and_matches() -> None:
    runs = run_benchmark(nodes=4, pages=2000, seed=2, lookups=5, prompt_pages=50)
    pages = run_benchmark(nodes=4, pages=2000, seed=2, lookups=5, prompt_pages=50, page_exact=True)
    assert (runs.implementation, pages.implementation) == ("runs", "page-exact")
    assert runs.distinct_pages == pages.distinct_pages and runs.events == pages.events
    assert runs.mean_cached_pages == pages.mean_cached_pages
    assert 0 < runs.runs < pages.runs == pages.distinct_pages


def test_deep_size_counts_shared_objects_once() -> None:
    shared = list(range(1000))
    assert deep_size([shared, shared]) < deep_size([shared, list(range(1000))])


def test_cli_json_and_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "directory", "--json", "--nodes", "3", "--pages", "500", "--lookups", "3"]
    assert main([*argv, "--prompt-pages", "20"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["nodes"] == 3 and figures["distinct_pages"] == 500
    assert main(["bench", "directory", "--pages", "0"]) == 2
    assert "--pages must be a positive integer, got 0" in capsys.readouterr().err


def test_simulator_calls_replayed_into_both_forms_answer_alike() -> None:
    """`bench directory --sim`: a short simulation's directory calls, recorded and replayed; every lookup and the
    final state equal in the run-based and the page-exact directory (an oracle check on real simulator events)."""
    calls, requests = record_sim_calls(duration=15.0, agents=6, nodes=3)
    assert requests > 0 and {name for _, name, _ in calls} >= {"store", "lookup", "add_node"}
    assert KvDirectory.store.__name__ == "store"  # the recording hooks are gone
    runs, pages = KvDirectory(), PageKvDirectory()
    for _, name, args in calls:
        got, want = getattr(runs, name)(*args), getattr(pages, name)(*args)
        if name == "lookup":
            assert got == want
    runs.check()
    assert runs.stats == pages.stats and runs.run_count < runs.page_count == pages.page_count
    for node in pages.nodes():
        for tier in Tier:
            assert runs.pages_on(node, tier) == pages.pages_on(node, tier)


def test_cli_sim_replay_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "directory", "--json", "--sim", "5", "--sim-reps", "1"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures["cpu_s"]) == {"runs", "page-exact"} and figures["lookups"] > 0
    assert main(["bench", "directory", "--sim", "0"]) == 2
    assert "--sim must be > 0 simulated seconds, got 0" in capsys.readouterr().err
