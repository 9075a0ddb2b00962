"""`evolving-infra bench ...`: benchmark scripts that print figures (never asserted in tests).

Each benchmark module exposes `register(subparsers)`, which adds the benchmarks it is listed under in `BENCHMARKS`.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, str] = {
    "directory": "evolving_infra.cli.bench_directory",
    "transfer": "evolving_infra.cli.bench_transfer",
    "engine": "evolving_infra.cli.bench_engine",
    "sim": "evolving_infra.cli.bench_sim",
    "router": "evolving_infra.cli.bench_router",
    "switch": "evolving_infra.cli.bench_router",
    "fleet": "evolving_infra.cli.bench_fleet",
    "machine": "evolving_infra.cli.bench_machine",
}
"""Benchmarks and the module that registers each (in the order of the help; a module may register several)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], only: str | None = None) -> None:
    """Add `bench` with every benchmark, or with `only` that one's module (the others are not imported)."""
    parser = sub.add_parser("bench", help="run a benchmark and print its figures")
    bench_sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    wanted = BENCHMARKS.values() if only is None else [BENCHMARKS[only]]
    for name in dict.fromkeys(wanted):
        importlib.import_module(name).register(bench_sub)
