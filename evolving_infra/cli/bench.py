"""`evolving-infra bench ...`: benchmark scripts that print figures (never asserted in tests).

Each benchmark module exposes `register(subparsers)`; add it to `BENCH_MODULES`.
"""

from __future__ import annotations

import argparse
import importlib

BENCH_MODULES: tuple[str, ...] = (
    "evolving_infra.cli.bench_directory",
    "evolving_infra.cli.bench_transfer",
    "evolving_infra.cli.bench_engine",
    "evolving_infra.cli.bench_sim",
    "evolving_infra.cli.bench_router",
    "evolving_infra.cli.bench_fleet",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print its figures")
    bench_sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bench_sub)
