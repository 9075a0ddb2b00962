"""Entry point of the `evolving-infra` console script.

Each capability registers one subcommand module here (`COMMANDS`: the command's name -> its module); a module
exposes `register(subparsers: argparse._SubParsersAction) -> None`, adds the one command it is listed under and sets
`handler` on its parsers. Handlers return an exit status, or raise `CliError`.

Only the module of the command given is imported (the modules pull in scipy, matplotlib, aiohttp, kopf, ...: all of
them together take seconds to import); without a known command (`--help`, a typo) every module registers, so the
help and the error list them all. `tests/test_cli_lazy.py` holds the table to what the modules register.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

from evolving_infra import __version__
from evolving_infra.cli.errors import CliError

COMMANDS: dict[str, str] = {
    "trace": "evolving_infra.cli.trace",
    "bench": "evolving_infra.cli.bench",
    "workload": "evolving_infra.cli.workload",
    "profile": "evolving_infra.cli.profile",
    "operator": "evolving_infra.cli.operator",
    "simulate": "evolving_infra.cli.simulate",
    "node-agent": "evolving_infra.cli.node_agent",
    "router": "evolving_infra.cli.router",
    "local": "evolving_infra.cli.local",
    "evaluate": "evolving_infra.cli.evaluate",
    "gateway": "evolving_infra.cli.gateway",
    "fleet": "evolving_infra.cli.fleet",
}
"""Top-level commands, in the order of the help, and the module that registers each."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv` (every command's when None, or when `argv` names no known command)."""
    parser = argparse.ArgumentParser(
        prog="evolving-infra",
        description="Agent-adaptive LLM serving: traces, simulation, local cluster, operator.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    command = _named(argv, COMMANDS)
    for name, module_name in COMMANDS.items():
        if command is not None and name != command:
            continue
        module = importlib.import_module(module_name)
        if name == "bench":  # (its benchmarks load the same way)
            module.register(sub, only=_named(argv[1:] if argv else None, module.BENCHMARKS))
        else:
            module.register(sub)
    return parser


def _named(argv: Sequence[str] | None, known: Mapping[str, object]) -> str | None:
    """The command `argv` starts with, if it is one of `known` (None for options such as `--help`, for a name not
    known, or without `argv`)."""
    if not argv or argv[0] not in known:
        return None
    return argv[0]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
