"""Entry point of the `evolving-infra` console script.

Each capability registers one subcommand module here; a module exposes
`register(subparsers: argparse._SubParsersAction) -> None` and sets `handler` on its parsers.
Handlers return an exit status, or raise `CliError`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from evolving_infra import __version__
from evolving_infra.cli.errors import CliError

COMMAND_MODULES: tuple[str, ...] = (
    "evolving_infra.cli.trace",
    "evolving_infra.cli.bench",
    "evolving_infra.cli.workload",
    "evolving_infra.cli.profile",
    "evolving_infra.cli.operator",
    "evolving_infra.cli.simulate",
    "evolving_infra.cli.node_agent",
    "evolving_infra.cli.router",
    "evolving_infra.cli.local",
    "evolving_infra.cli.evaluate",
    "evolving_infra.cli.gateway",
    "evolving_infra.cli.fleet",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evolving-infra",
        description="Agent-adaptive LLM serving: traces, simulation, local cluster, operator.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except CliError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
