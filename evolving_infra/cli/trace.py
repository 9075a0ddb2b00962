"""`evolving-infra trace ...` (validate, stats, import): filled in by the trace capability."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("trace", help="validate, summarize and import agent traces")
    parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
